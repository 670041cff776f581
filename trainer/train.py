"""Entry point: ``run(config, cache_dir)`` trains one expert's adapter on its CURRENT build.

Order of business (every check before anything expensive):

1. the build: CURRENT (or ``build_id``), its manifest, every shard's sha256 against it;
2. the model's tokenizer fingerprint against the build's (refused when they differ);
3. the checkpoint to resume, if any (refused when taken on another build or tokenizer, or corrupt);
4. model + adapters, data, optimizer, schedule; restore the checkpoint;
5. :func:`packtrain.trainer.loop.train_loop`; then the final adapter, optional merged model, summary.

Under ``torchrun`` (WORLD_SIZE > 1) every rank runs all of this with its own device and slice of
the data (trainer/distributed.py); rank 0 picks the checkpoint and the run directory and is the
only one writing files. With ``train.fsdp`` the adapted model is sharded (FSDP2) instead of wrapped
in DDP; its adapter and optimizer state are gathered by every rank and written by rank 0.

The run directory ``<output_dir>/<expert>/<run>/`` ends up with ``config.json`` (the resolved
config), ``run.json`` (build, model, device, precision), ``metrics.jsonl``, ``train.log``,
``checkpoint-<step>/``, ``adapter/`` and ``summary.json``; then the end of the run logs base-model vs
adapter answers to a few validation prompts, runs the task eval (``eval.json``, ``eval.jsonl``; by
default on CUDA: trainer/task_eval.py) and draws ``plots/*.png`` (trainer/plots.py).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from pathlib import Path

import numpy as np
import torch

from packtrain.core.config import ConfigError, ExpertConfig
from packtrain.core.config_train import TrainConfig
from packtrain.core.contract import CONFIG_SNAPSHOT, Manifest, former_stage_name, resolve_build
from packtrain.core.diskfull import DiskFullError
from packtrain.core.errors import ContractError
from packtrain.core.rundir import RUN_JSON, finished_artifacts, record_runs_dir
from packtrain.trainer.attention import AttentionChoice, choose_attention
from packtrain.trainer.adapters import (NonFiniteWeightsError, attach_adapters, load_adapter_weights,
                                        trainable_parameters)
from packtrain.trainer.checkpoint import (CheckpointError, RunInfo, TrainState, check_not_finished, check_resume,
                                          check_same_adapter,
                                          discard_later_checkpoints, find_checkpoint, load_checkpoint, read_state,
                                          verify_checkpoint)
from packtrain.trainer.data import BatchStream, BlockDataset, BlockSampler, eval_slice, make_loader
from packtrain.trainer.distributed import (DistributedError, World, close_world, decide_on_rank0, device_for,
                                           init_world, shard, wrap)
from packtrain.trainer.loop import NonFiniteLossError, train_loop
from packtrain.trainer.metrics import FlopCounter, Meter, MetricsFile, NoMetricsFile, oom_advice, peak_flops
from packtrain.trainer.loss import fused_kernel
from packtrain.trainer.microbatch import MicroBatchError, resolve_auto_micro_batch
from packtrain.trainer.model import ModelError, Precision, choose_precision, load_base_model, model_source, tokenizer_dir
from packtrain.trainer.optim import build_optimizer
from packtrain.trainer.run_checks import TrainError, check_batch_shape, check_tokenizer, choose_run_dir, verify_shards
from packtrain.trainer.run_end import finish_run, write_json
from packtrain.trainer.runlog import FILE_ONLY, HeldLog, RankFilter, add_file_log, ensure_log_handler
from packtrain.trainer.schedule import build_scheduler, total_training_steps, warmup_steps
from packtrain.trainer.threads import set_torch_threads, threads_restored
from packtrain.trainer.tensorboard import TensorBoardMirror, summary_writer

log = logging.getLogger("packtrain.train")


# Errors whose message is the whole story (the CLI prints it without a traceback and exits 2).
EXPECTED_ERRORS = (TrainError, ModelError, CheckpointError, NonFiniteLossError, NonFiniteWeightsError, ContractError,
                   ConfigError, DistributedError, MicroBatchError, DiskFullError)


def run(config: ExpertConfig, cache_dir: str | Path, build_id: str | None = None, resume: str | None = None,
        allow_build_change: bool = False) -> Path:
    """Train ``config.expert``'s adapter on its CURRENT build (or ``build_id``); returns the run directory.

    ``resume``: ``"auto"`` continues from the newest complete checkpoint of the expert's runs (a new
    run when there is none), a path continues from that checkpoint (or run directory).

    Under ``torchrun`` every rank calls this; all of them return the run directory.
    """
    ensure_log_handler()
    world = init_world()
    quiet = RankFilter(world)
    if not world.is_main:
        log.addFilter(quiet)  # rank 0 tells the story; the others only warn
    try:
        with threads_restored():  # set for the run in _prepare (trainer/threads.py)
            return _run(config, cache_dir, build_id, resume, allow_build_change, world)
    finally:
        log.removeFilter(quiet)
        close_world(world)


def _run(config: ExpertConfig, cache_dir: str | Path, build_id: str | None, resume: str | None,
         allow_build_change: bool, world: World) -> Path:
    errors: list[str] = []
    config.validate(errors)  # a config made in code, not loaded from a file, is checked too
    if errors:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))
    train = config.train
    build_dir = resolve_build(cache_dir, config.expert, build_id)
    manifest = Manifest.load(build_dir)
    verify_shards(build_dir, manifest)
    if manifest.expert != config.expert:
        raise TrainError(f"build {build_dir} is a build of expert {manifest.expert!r}, not {config.expert!r}")
    if train.report_to == "tensorboard":
        summary_writer()  # installed, or a ConfigError before anything is written
    source = model_source(config.model)
    tok_dir = tokenizer_dir(config.model, source)
    check_tokenizer(manifest, tok_dir, config.model.name)

    check_batch_shape(train, world)
    seq_length = sequence_length(train, manifest)
    train_sequences = len(BlockDataset(build_dir, manifest, "train", seq_length))
    what = ("train blocks" if seq_length == manifest.block_size
            else f"train sequences (windows of {seq_length} tokens of its blocks)")
    if train.per_device_train_batch_size == "auto":
        if train_sequences < train.global_batch_size:
            raise TrainError(f"build {manifest.build_id} has {train_sequences} {what}, fewer than "
                             f"train.global_batch_size {train.global_batch_size}: lower it, or add data and rebuild")
    elif train_sequences < train.per_device_train_batch_size * world.world_size:
        ranks = f" x world size {world.world_size}" if world.enabled else ""
        raise TrainError(f"build {manifest.build_id} has {train_sequences} {what}, fewer than "
                         f"per_device_train_batch_size {train.per_device_train_batch_size}{ranks}: lower it, "
                         "or add data and rebuild")

    state = TrainState(build_id=manifest.build_id, tokenizer_hash=manifest.tokenizer_hash,
                       world_size=world.world_size, seq_length=seq_length)
    expert_runs = Path(train.output_dir) / config.expert
    if world.is_main:
        remember_runs_dir(cache_dir, config.expert, expert_runs)
    checkpoint = decide_on_rank0(lambda: find_checkpoint(resume, expert_runs) if resume else None, world)
    if resume == "auto" and checkpoint is None:
        log.info("resume auto: no complete checkpoint under %s; starting a new run", expert_runs)
        former = former_stage_name(config.expert)
        if former and any((Path(train.output_dir) / former).glob("*/checkpoint-*")):
            log.warning("resume auto: %s has checkpoints made before curriculum stages were named <expert>.<stage>; "
                        "if they are this stage's, stop and move that directory to %s to resume them",
                        Path(train.output_dir) / former, expert_runs)
    if checkpoint is not None:
        verify_checkpoint(checkpoint)  # checksums.json covers state.json: its data position is checked too
        saved = read_state(checkpoint)
        check_resume(saved, checkpoint, manifest.build_id, manifest.tokenizer_hash, allow_build_change,
                     world.world_size, seq_length, manifest.block_size)
        check_same_adapter(checkpoint, config.to_dict()["lora"])
        state = saved
        state.seq_length = seq_length  # the same (check_resume), recorded from now on in older checkpoints too
        if saved.build_id != manifest.build_id:
            log.warning("resuming on build %s (checkpoint taken on %s): data restarts at the start of epoch %d",
                        manifest.build_id, saved.build_id, saved.epoch)
            state.build_id, state.position = manifest.build_id, 0

    # everything else that can refuse (the model, its adapters, train.init_adapter, the checkpoint's
    # weights and optimizer state) before the run directory exists: a refusal creates nothing, forks
    # nothing and discards no checkpoint; the log lines meanwhile are held for the run's train.log
    held = HeldLog() if world.is_main else None
    try:
        setup = _prepare(config, build_dir, manifest, source, state, checkpoint, world)
        # the run directory (a resumed run continues in its own, unless that run is finished: a finished
        # run is never written to, so it continues in a new one); from here on the log goes there too
        run_dir = decide_on_rank0(lambda: choose_run_dir(checkpoint, state.step, expert_runs, train.run_name,
                                                         manifest.build_id), world)
    except Exception as e:
        log_failure(e, world)
        raise
    finally:
        if held is not None:
            held.close()
    file_log = add_file_log(run_dir / "train.log", held) if world.is_main else None
    if checkpoint is not None and world.is_main:
        if run_dir != checkpoint.parent:
            log.warning("run %s is finished (%s): it stays as it is; continuing from its %s in the new run %s",
                        checkpoint.parent, ", ".join(finished_artifacts(checkpoint.parent)), checkpoint.name,
                        run_dir)
        for dropped in discard_later_checkpoints(run_dir, state.step):
            log.warning("resuming from step %d abandons %s: removed", state.step, dropped.name)
    try:
        return _train(config, build_dir, manifest, source, tok_dir, state, checkpoint, run_dir, world, setup)
    except Exception as e:
        log_failure(e, world)
        raise
    finally:
        if file_log is not None:
            log.removeHandler(file_log)
            file_log.close()


INIT_ADAPTER_FIX = ("set train.init_adapter to a directory holding adapter_model.safetensors (a finished run's "
                    "adapter/, or a checkpoint's), or leave it out to start from a new adapter")


def log_failure(e: Exception, world: World) -> None:
    """The failure that ends a run, for its train.log (the console's is the CLI's one ``error:`` line)."""
    log.error("run failed%s: %s: %s", f" on rank {world.rank}" if world.enabled else "", type(e).__name__, e,
              extra=FILE_ONLY)


def sequence_length(train, manifest: Manifest) -> int:
    """Tokens per training sequence: ``train.max_seq_length`` when shorter than the build's blocks (the
    blocks are then cut into windows: trainer/data.py), else the block size."""
    if train.max_seq_length is not None and train.max_seq_length > manifest.block_size:
        log.warning("train.max_seq_length %d is longer than build %s's blocks of %d tokens: training on whole "
                    "blocks (raise pack.block_size and rebuild for longer sequences)", train.max_seq_length,
                    manifest.build_id, manifest.block_size)
    return min(train.max_seq_length or manifest.block_size, manifest.block_size)


def remember_runs_dir(cache_dir, expert: str, expert_runs: Path) -> None:
    """Record where this expert's runs live in its cache, so `rebuild --keep` never prunes a build
    their checkpoints need, whatever directory it runs from."""
    try:
        record_runs_dir(cache_dir, expert, expert_runs)
    except (OSError, DiskFullError) as e:
        log.warning("cannot record %s in %s (%s): a `rebuild --keep` started from another directory will not "
                    "see this run's checkpoints; make the cache writable", expert_runs.absolute(), cache_dir, e)


@dataclasses.dataclass
class Setup:
    """The run, set up and restored, with nothing written yet (:func:`_prepare`)."""

    train: TrainConfig  # as resolved: torch_compile a bool, the micro-batch a number
    device: torch.device
    precision: Precision
    model: torch.nn.Module
    attention: AttentionChoice
    fused: object  # the fused loss kernel or None
    fsdp: bool
    train_set: BlockDataset
    batches: BatchStream
    val_loader: object
    optimizer: torch.optim.Optimizer
    scheduler: object
    scaler: torch.amp.GradScaler | None
    total_steps: int
    flops: FlopCounter


def _prepare(config: ExpertConfig, build_dir: Path, manifest: Manifest, source, state: TrainState,
             checkpoint: Path | None, world: World) -> Setup:
    """Everything after the checks that can still refuse, before anything is written: the model and its
    adapters (``train.init_adapter``), data, optimizer, schedule, and the checkpoint restored."""
    train = config.train
    device = device_for(world)
    log.info("%s", set_torch_threads(train.cpu_threads, resumed=state.cpu_threads if checkpoint else 0))
    state.cpu_threads = torch.get_num_threads()  # recorded in every checkpoint: a resume trains with them too
    seed_everything(train.seed)  # the same on every rank: identical LoRA init and dropout RNG streams
    if world.enabled:
        log.info("data parallel: %d processes (this is rank %d, local rank %d, %s), backend %s", world.world_size,
                 world.rank, world.local_rank, device, torch.distributed.get_backend())
    precision = choose_precision(train, device)
    log.info("precision: %s", precision.note)

    # model + adapters
    model = load_base_model(config.model, source, precision, train.seed, config.lora.method == "qlora", device)
    vocab = model.get_input_embeddings().num_embeddings
    if vocab < manifest.vocab_size:
        raise TrainError(f"model {config.model.name} has {vocab} token embeddings, the build's tokenizer "
                         f"{manifest.vocab_size} tokens: this model cannot read these shards")
    attention = choose_attention(device, config.model.use_sdpa, state.seq_length, model,
                                 varlen=config.model.varlen_attention, dtype=precision.autocast_dtype)
    log.info("attention: %s", attention.note)
    if attention.varlen:
        model.set_attn_implementation(attention.implementation)
    model = attach_adapters(model, config.lora, train.gradient_checkpointing)
    if train.init_adapter and checkpoint is None:  # a resumed run's checkpoint already holds the weights
        try:
            load_adapter_weights(model, Path(train.init_adapter), INIT_ADAPTER_FIX)
        except RuntimeError as e:
            raise TrainError(f"train.init_adapter: {e}") from None
        log.info("adapter weights initialised from %s", train.init_adapter)
    flops = FlopCounter.for_model(model)  # counted on the full model, before any sharding
    log.info("model %s (%s): %.1fM matmul params, %.2fM trainable (%s r=%d)", config.model.name, source.directory,
             flops.matmul_params / 1e6, flops.trainable_params / 1e6, config.lora.method, config.lora.r)

    # loss, compile, micro-batch: resolved into the config the loop gets (``auto`` decided here, once)
    fused = fused_kernel(train.fused_loss, device)
    compile_on = train.torch_compile if isinstance(train.torch_compile, bool) else device.type == "cuda"
    log.info("torch.compile: %s", ("on" if compile_on else "off") + (f" (auto on {device.type})"
                                                                     if train.torch_compile == "auto" else ""))
    train = dataclasses.replace(train, torch_compile=compile_on)
    train_set = BlockDataset(build_dir, manifest, "train", state.seq_length)
    if train.per_device_train_batch_size == "auto":
        train = resolve_auto_micro_batch(train, model, train_set, precision, device, attention, fused, world)

    # data
    batch_size = train.per_device_train_batch_size
    sampler = BlockSampler(len(train_set), train.seed, manifest.build_id, rank=world.rank,
                           world_size=world.world_size)
    train_loader = make_loader(train_set, sampler, batch_size, train, device, drop_last=True, seed=train.seed)
    if train.global_batch_size is not None:  # counted in whole global batches: the same whatever auto measured
        total_steps = total_training_steps(train, len(train_set) // train.global_batch_size * train.gradient_accumulation_steps)
    else:
        total_steps = total_training_steps(train, len(train_set) // (batch_size * world.world_size))
    val_loader = None
    val_set = BlockDataset(build_dir, manifest, "val", state.seq_length)
    if len(val_set) == 0:
        log.warning("build %s has no val blocks (pack.val_fraction: %s): evaluation is skipped",
                    manifest.build_id, manifest.val_fraction)
    else:
        val_loader = make_loader(eval_slice(val_set, train, world, pad=train.fsdp), None,
                                 train.per_device_eval_batch_size, train, device, drop_last=False, seed=train.seed,
                                 num_workers=min(train.dataloader_num_workers, 2))

    fsdp = train.fsdp and world.enabled
    if train.fsdp and not world.enabled:
        log.info("train.fsdp: a single process, nothing to shard")
    if fsdp:  # before the optimizer: it must hold the sharded parameters
        model = shard(model, world, device)

    # optimizer, schedule, scaler
    optimizer = build_optimizer(trainable_parameters(model), train, device)
    scheduler = build_scheduler(optimizer, train, total_steps)
    scaler = torch.amp.GradScaler(device.type) if precision.use_scaler else None
    batches = BatchStream(train_loader, sampler, state.epoch, state.position)
    if checkpoint is not None:
        load_checkpoint(checkpoint, model, optimizer, scheduler, scaler)  # RNG states last of all
    return Setup(train=train, device=device, precision=precision, model=model, attention=attention, fused=fused,
                 fsdp=fsdp, train_set=train_set, batches=batches, val_loader=val_loader, optimizer=optimizer,
                 scheduler=scheduler, scaler=scaler, total_steps=total_steps, flops=flops)


def _train(config: ExpertConfig, build_dir: Path, manifest: Manifest, source, tok_dir: Path, state: TrainState,
           checkpoint: Path | None, run_dir: Path, world: World, setup: Setup) -> Path:
    """Write the run's config, train, export (logging into run_dir/train.log)."""
    train, device, precision, model, fsdp = setup.train, setup.device, setup.precision, setup.model, setup.fsdp
    train_set, total_steps, batch_size = setup.train_set, setup.total_steps, train.per_device_train_batch_size

    info = RunInfo(run_dir, config.to_dict(), tok_dir)
    if world.is_main:
        check_not_finished(run_dir, "write its config.json and run.json")
        write_json(run_dir / CONFIG_SNAPSHOT, info.config)
        write_json(run_dir / RUN_JSON, {
            "build_id": manifest.build_id, "build_dir": str(build_dir), "tokenizer_hash": manifest.tokenizer_hash,
            "model": config.model.name, "model_dir": str(source.directory), "random_init": not source.has_weights,
            "device": str(device), "precision": precision.note, "total_steps": total_steps,
            "warmup_steps": warmup_steps(train, total_steps), "resumed_from": str(checkpoint) if checkpoint else None,
            "world_size": world.world_size, "block_size": manifest.block_size, "seq_length": train_set.seq_length,
            "global_batch_blocks": batch_size * world.world_size * train.gradient_accumulation_steps,
            "per_device_train_batch_size": batch_size, "gradient_accumulation_steps": train.gradient_accumulation_steps,
            "gradient_checkpointing": train.gradient_checkpointing, "attention": setup.attention.name,
            "torch_compile": train.torch_compile, "fused_loss": setup.fused is not None,
        })
    if checkpoint is not None:
        log.info("resumed from %s: step %d, epoch %d, block %d of the epoch", checkpoint, state.step,
                 state.epoch, state.position)
    sequences = (f"{len(train_set)} train blocks of {manifest.block_size} tokens" if train_set.windows == 1 else
                 f"{len(train_set)} train sequences of {train_set.seq_length} tokens (train.max_seq_length: the "
                 f"{train_set.blocks} blocks of {manifest.block_size} tokens cut into windows, up to "
                 f"{train_set.windows} each; windows of padding only left out)")
    log.info("run %s: build %s, %s, %d steps of %d x %d x %d sequences (per device x world size x gradient "
             "accumulation)", run_dir, manifest.build_id, sequences, total_steps, batch_size, world.world_size,
             train.gradient_accumulation_steps)

    metrics = (MetricsFile(run_dir / "metrics.jsonl", truncate_after_step=state.step if checkpoint else None)
               if world.is_main else NoMetricsFile())
    if world.is_main and train.report_to == "tensorboard":
        metrics = TensorBoardMirror(metrics, run_dir)
    peak = peak_flops(device, train.peak_tflops)
    meter = Meter(device, setup.flops, peak * world.world_size if peak else None)  # the counts are global
    start, start_tokens = time.perf_counter(), state.tokens
    try:
        records, evals = train_loop(
            model=model if fsdp else wrap(model, world, device), optimizer=setup.optimizer,
            scheduler=setup.scheduler, scaler=setup.scaler, precision=precision, device=device, batches=setup.batches,
            val_loader=setup.val_loader, train=train, total_steps=total_steps, state=state, run=info, meter=meter,
            metrics=metrics, world=world, attention=setup.attention, fused=setup.fused)
    except torch.OutOfMemoryError as e:
        raise TrainError(oom_advice(train, config.lora)) from e
    finally:
        metrics.close()
    wall = time.perf_counter() - start

    return finish_run(config, train, model, fsdp=fsdp, world=world, run_dir=run_dir, build_dir=build_dir,
                      manifest=manifest, state=state, info=info, tok_dir=tok_dir, device=device, precision=precision,
                      records=records, evals=evals, wall=wall, start_tokens=start_tokens)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
