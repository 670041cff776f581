"""Entry point: ``run(config, cache_dir)`` trains one expert's adapter on its CURRENT build.

Order of business (every check before anything expensive):

1. the build: CURRENT (or ``build_id``), its manifest, every shard's sha256 against it;
2. the model's tokenizer fingerprint against the build's (refused when they differ) (:func:`_check_inputs`);
3. the checkpoint to resume, if any, its run locked (another process training it is refused:
   packtrain/core/run_lock.py) (refused when taken on another build or tokenizer, or corrupt)
   (:func:`_resume_point`);
4. the run's :class:`packtrain.trainer.run.context.TrainContext`, set up by its named phases: model + adapters,
   micro-batch, data, optimizer, schedule; the checkpoint restored (trainer/run/context.py);
5. :func:`packtrain.trainer.loop.train_loop`; then the final adapter, optional merged model, summary
   (trainer/run/run_end.py).

Under ``torchrun`` (WORLD_SIZE > 1) every rank runs all of this with its own device and slice of
the data (trainer/run/distributed.py); rank 0 picks the checkpoint and the run directory, holds the run's
lock and is the only one writing files. With ``train.fsdp`` the adapted model is sharded (FSDP2) instead of wrapped
in DDP; its adapter and optimizer state are gathered by every rank and written by rank 0.

The run directory ``<output_dir>/<expert>/<run>/`` ends up with ``config.json`` (the resolved
config), ``run.json`` (build, model, device, precision), ``metrics.jsonl``, ``train.log``,
``checkpoint-<step>/``, ``adapter/`` and ``summary.json``; then the end of the run logs base-model vs
adapter answers to a few validation prompts, runs the task eval (``eval.json``, ``eval.jsonl``; by
default on CUDA: trainer/eval/task_eval.py) and draws ``plots/*.png`` (trainer/report/plots.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

import torch

from packtrain.core import hints
from packtrain.core.config import ConfigError, ExpertConfig
from packtrain.core.contract import CONFIG_SNAPSHOT, Manifest, check_build_expert
from packtrain.core.expert_names import former_stage_name
from packtrain.core.diskfull import DiskFullError
from packtrain.core.errors import ContractError, Interrupted
from packtrain.core.preflight import check_report_to
from packtrain.core.build_lease import BuildLeases
from packtrain.core.run_lock import RunLocked, RunLocks
from packtrain.core.rundir import RUN_JSON, complete_checkpoints, finished_artifacts, record_runs_dir, run_dirs
from packtrain.trainer.model.activations import CheckpointingError, from_config
from packtrain.trainer.model.adapters import NonFiniteWeightsError
from packtrain.trainer.run.checkpoint import (CheckpointError, RunInfo, TrainState, check_not_finished,
                                          discard_later_checkpoints, find_checkpoint, newest_resumable, read_state,
                                          verify_checkpoint)
from packtrain.trainer.run.resume_checks import (check_resume, check_same_adapter, check_same_base,
                                             check_same_training)
from packtrain.trainer.run.context import TrainContext, prepare
from packtrain.trainer.data.data import BlockDataset, stop_workers
from packtrain.trainer.run.distributed import DistributedError, World, close_world, decide_on_rank0, init_world, wrap
from packtrain.trainer.data.epochs import epoch_shape
from packtrain.trainer.loop import NonFiniteLossError, train_loop
from packtrain.trainer.model.memory import MemoryBudgetError, out_of_memory_message
from packtrain.trainer.report.metrics import Meter, MetricsFile, NoMetricsFile, oom_advice, peak_flops
from packtrain.trainer.model.microbatch import MicroBatchError
from packtrain.trainer.model.model import ModelError, ModelSource, model_source, tokenizer_dir
from packtrain.trainer.run.run_checks import (TrainError, check_batch_shape, check_tokenizer, choose_run_dir, leased_build,
                                             verify_shards)
from packtrain.trainer.run.run_end import finish_run, write_json
from packtrain.trainer.run.runlog import FILE_ONLY, HeldLog, RankFilter, add_file_log, ensure_log_handler
from packtrain.trainer.schedule import warmup_steps
from packtrain.trainer.report.sinks import Reporting
from packtrain.trainer.threads import threads_restored

log = logging.getLogger("packtrain.train")


# Errors whose message is the whole story (the CLI prints it without a traceback and exits 2).
EXPECTED_ERRORS = (TrainError, ModelError, CheckpointError, NonFiniteLossError, NonFiniteWeightsError, ContractError,
                   ConfigError, DistributedError, MicroBatchError, DiskFullError, RunLocked, CheckpointingError,
                   MemoryBudgetError)


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
    locks = RunLocks(on_stale=log.warning)  # the run directory's lock, held by rank 0 (core/run_lock.py)
    leases = BuildLeases()  # the build's lease, held by every rank: no prune removes it (core/build_lease.py)
    try:
        with threads_restored():  # set for the run in setup_runtime (trainer/run/context.py, trainer/threads.py)
            return _run(config, cache_dir, (build_id, leases), resume, allow_build_change, world, locks)
    finally:
        locks.release()
        leases.release()
        log.removeFilter(quiet)
        close_world(world)


def _run(config: ExpertConfig, cache_dir: str | Path, build: tuple[str | None, BuildLeases], resume: str | None,
         allow_build_change: bool, world: World, locks: RunLocks) -> Path:
    """``build``: the build id asked for (None: CURRENT's) and the leases that hold it while the run lasts."""
    build_dir, manifest, source, tok_dir, seq_length = _check_inputs(config, cache_dir, build, world)
    expert_runs = Path(config.train.output_dir) / config.expert
    if world.is_main:
        remember_runs_dir(cache_dir, config.expert, expert_runs)
    state, checkpoint = _resume_point(config, resume, expert_runs, manifest, seq_length, allow_build_change, world,
                                      locks)
    ctx = TrainContext(config, world, build_dir, manifest, source, tok_dir, state, checkpoint)

    # everything else that can refuse (the model, its adapters, train.init_adapter, the checkpoint's
    # weights and optimizer state) before the run directory exists: a refusal creates nothing, forks
    # nothing and discards no checkpoint; the log lines meanwhile are held for the run's train.log
    held = HeldLog() if world.is_main else None
    try:
        with out_of_memory_is_one_line(ctx):
            prepare(ctx)
        # the run directory (a resumed run continues in its own, unless that run is finished: a finished
        # run is never written to, so it continues in a new one); from here on the log goes there too
        # locked by rank 0 before anything is written into it: one process per run directory
        run_dir = decide_on_rank0(lambda: locks.hold(choose_run_dir(checkpoint, state.step, expert_runs,
                                                                    config.train.run_name, manifest.build_id)), world)
    except Exception as e:
        log_failure(e, world)
        raise
    finally:
        if held is not None:
            held.close()
    ctx.run = RunInfo(run_dir, config.to_dict(), tok_dir)
    file_log = add_file_log(run_dir / "train.log", held) if world.is_main else None
    if checkpoint is not None and world.is_main:
        if run_dir != checkpoint.parent:
            log.warning("run %s is finished (%s): it stays as it is; continuing from its %s in the new run %s",
                        checkpoint.parent, ", ".join(finished_artifacts(checkpoint.parent)), checkpoint.name,
                        run_dir)
        for dropped in discard_later_checkpoints(run_dir, state.step):
            log.warning("resuming from step %d abandons %s: removed", state.step, dropped.name)
    try:
        with out_of_memory_is_one_line(ctx):
            return _train(ctx)
    except Exception as e:
        log_failure(e, world)
        raise
    finally:
        stop_workers([getattr(ctx, "train_loader", None), *(loader for _, loader in getattr(ctx, "val_loaders", []))])
        if file_log is not None:
            log.removeHandler(file_log)
            file_log.close()


def _check_inputs(config: ExpertConfig, cache_dir: str | Path, build: tuple[str | None, BuildLeases],
                  world: World) -> tuple[Path, Manifest, ModelSource, Path, int]:
    """The config, the build (its shards against the manifest), the model's tokenizer against the build's,
    the batch shape and a train sequence at least (fewer than a global micro-batch train as HF trains them,
    padded: trainer/data/epochs.py): (build_dir, manifest, model source, tokenizer
    directory, sequence length)."""
    errors: list[str] = []
    config.validate(errors)  # a config made in code, not loaded from a file, is checked too
    if errors:  # one problem, one line (as a config file's: core/configfile.py)
        raise ConfigError(f"invalid config: {errors[0]}" if len(errors) == 1 else
                          "invalid config:\n  - " + "\n  - ".join(errors))
    train = config.train
    build_dir = leased_build(cache_dir, config.expert, *build)  # no prune removes it from here on
    manifest = Manifest.load(build_dir)
    verify_shards(build_dir, manifest)
    check_build_expert(build_dir, manifest, config.expert)
    check_report_to(train)  # every dashboard's library installed, or a ConfigError before anything is written
    source = model_source(config.model)
    tok_dir = tokenizer_dir(config.model, source)
    check_tokenizer(manifest, tok_dir, config.model.name)

    check_batch_shape(train, world)
    seq_length = sequence_length(train, manifest)
    if len(BlockDataset(build_dir, manifest, "train", seq_length)) == 0:  # any N >= 1 trains (trainer/data/epochs.py)
        fraction = f" ({manifest.val_fraction})" if manifest.val_fraction is not None else ""
        raise TrainError(f"build {manifest.build_id} ({build_dir}) has no train blocks: nothing to train; add rows to "
                         f"sources: or lower pack.val_fraction{fraction}, and rebuild with "
                         f"{hints.command('pretokenize', config.expert)}")
    return build_dir, manifest, source, tok_dir, seq_length


def _resume_point(config: ExpertConfig, resume: str | None, expert_runs: Path, manifest: Manifest, seq_length: int,
                  allow_build_change: bool, world: World, locks: RunLocks) -> tuple[TrainState, Path | None]:
    """Where training starts: a new state, or the checkpoint to resume (``resume``: rank 0 finds it, and
    locks its run: :func:`locked_checkpoint`) and its state, checked against this build, tokenizer, adapter,
    world size and sequence length."""
    state = TrainState(build_id=manifest.build_id, tokenizer_hash=manifest.tokenizer_hash,
                       world_size=world.world_size, seq_length=seq_length)
    checkpoint = decide_on_rank0(lambda: locked_checkpoint(resume, expert_runs, locks) if resume else None, world)
    if resume is None and world.is_main and (left := newest_resumable(expert_runs)) is not None:
        log.info("a new run: %s is an unfinished run with %s (stopped or killed), kept as it is; %s continues it "
                 "instead", left.parent, left.name, hints.command("train", config.expert, resume="auto"))
    if resume == "auto" and checkpoint is None:
        log.info("resume auto: no complete checkpoint under %s; starting a new run", expert_runs)
        for unfinished in unfinished_without_checkpoint(expert_runs):
            log.warning("resume auto: %s is an unfinished run with no checkpoint (stopped or killed before its "
                        "first save, or still running elsewhere): nothing of it can be resumed; kept as it is "
                        "beside the new run (delete it when its train.log is of no use)", unfinished)
        former = former_stage_name(config.expert)
        output_dir = Path(config.train.output_dir)
        if former and any((output_dir / former).glob("*/checkpoint-*")):
            log.warning("resume auto: %s has checkpoints made before curriculum stages were named <expert>.<stage>; "
                        "if they are this stage's, stop and move that directory to %s to resume them",
                        output_dir / former, expert_runs)
    if checkpoint is None:
        return state, None
    verify_checkpoint(checkpoint)  # checksums.json covers state.json: its data position is checked too
    saved = read_state(checkpoint)
    check_resume(saved, checkpoint, manifest.build_id, manifest.tokenizer_hash, allow_build_change,
                 world.world_size, seq_length, manifest.block_size)
    check_same_adapter(checkpoint, config.to_dict()["lora"])
    check_same_training(checkpoint, config.to_dict()["train"])
    check_same_base(checkpoint, config.to_dict())  # the adapter's deltas are to that base's weights
    state = saved
    state.seq_length = seq_length  # the same (check_resume), recorded from now on in older checkpoints too
    if saved.build_id != manifest.build_id:
        log.warning("resuming on build %s (checkpoint taken on %s): data restarts at the start of epoch %d",
                    manifest.build_id, saved.build_id, saved.epoch)
        state.build_id, state.position = manifest.build_id, 0
    return state, checkpoint


def unfinished_without_checkpoint(expert_runs: Path) -> list[Path]:
    """The run directories under ``expert_runs`` that are neither finished nor hold a complete checkpoint,
    oldest first: what ``--resume auto`` found and cannot resume, said rather than left silently."""
    runs = [p for p in run_dirs(expert_runs) if not finished_artifacts(p) and not complete_checkpoints(p)]
    return sorted(runs, key=lambda p: (p.stat().st_mtime_ns, p.name))


def locked_checkpoint(resume: str, expert_runs: Path, locks: RunLocks) -> Path | None:
    """The checkpoint ``resume`` names (:func:`find_checkpoint`), its run locked when the run continues in
    its own directory (an unfinished run; a finished one is never written to, it continues in a new one).
    Another process that trains that run refuses this one (:class:`RunLocked`); with ``auto``, a run that
    moved on between the look and the lock (a newer checkpoint, or finished) refuses it too: what it
    would resume is no longer the newest."""
    checkpoint = find_checkpoint(resume, expert_runs)
    if checkpoint is None or finished_artifacts(checkpoint.parent):
        return checkpoint
    locks.hold(checkpoint.parent)
    if resume == "auto" and (finished_artifacts(checkpoint.parent)
                             or complete_checkpoints(checkpoint.parent)[-1:] != [checkpoint]):
        raise RunLocked(f"run directory {checkpoint.parent} moved on while this process chose its {checkpoint.name} "
                        "to resume (another process trained it meanwhile): start again with --resume auto")
    return checkpoint


def log_failure(e: Exception, world: World) -> None:
    """The failure that ends a run, for its train.log (the console's is the CLI's one ``error:`` line); a stop
    by a signal is no failure: its line (the checkpoint, how to resume) goes there as it is."""
    if isinstance(e, Interrupted):
        log.info("%s", e, extra=FILE_ONLY)
        return
    log.error("run failed%s: %s: %s", f" on rank {world.rank}" if world.enabled else "", type(e).__name__, e,
              extra=FILE_ONLY)


def sequence_length(train, manifest: Manifest) -> int:
    """Tokens per training sequence: ``train.max_seq_length`` when shorter than the build's blocks (the
    blocks are then cut into windows: trainer/data/data.py), else the block size."""
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


def _train(ctx: TrainContext) -> Path:
    """Write the run's config and run.json, train, export (logging into the run's train.log)."""
    state, world, train, run_dir = ctx.state, ctx.world, ctx.train, ctx.run.run_dir
    if world.is_main:
        check_not_finished(run_dir, "write its config.json and run.json")
        write_json(run_dir / CONFIG_SNAPSHOT, ctx.run.config)
        write_json(run_dir / RUN_JSON, run_record(ctx))
    if ctx.checkpoint is not None:
        log.info("resumed from %s: step %d, epoch %d, block %d of the epoch", ctx.checkpoint, state.step,
                 state.epoch, state.position)
    log_run_shape(ctx)

    metrics = (MetricsFile(run_dir / "metrics.jsonl", truncate_after_step=state.step if ctx.checkpoint else None)
               if world.is_main else NoMetricsFile())
    # metrics.jsonl and the train.report_to dashboards (trainer/report/sinks.py), told at the end how the run ended
    reporting = Reporting(metrics, train.reporters() if world.is_main else [], run_dir,
                          state.step if ctx.checkpoint else None)
    status = "failed"
    try:
        run_dir = _train_and_finish(ctx, reporting)
        status = "finished"
        return run_dir
    except (KeyboardInterrupt, Interrupted):  # Interrupted: a signal, the checkpoint of its step saved
        status = "killed"
        raise
    finally:
        reporting.finish(status)


def _train_and_finish(ctx: TrainContext, metrics: Reporting) -> Path:
    """The dashboards started, the loop, then the run's final artifacts (trainer/run/run_end.py)."""
    state, world, train = ctx.state, ctx.world, ctx.train
    try:
        metrics.start(ctx.run.config)  # before the clocks: a dashboard's start-up is not training time
        peak = peak_flops(ctx.device, train.peak_tflops)
        meter = Meter(ctx.device, ctx.flops, peak * world.world_size if peak else None)  # the counts are global
        start, start_tokens = time.perf_counter(), state.tokens
        model = ctx.model if ctx.fsdp else wrap(ctx.model, world, ctx.device)
        records, evals = train_loop(ctx, model, meter, metrics)
    finally:
        metrics.close()
    wall = time.perf_counter() - start
    return finish_run(ctx, records, evals, wall, start_tokens)


@contextlib.contextmanager
def out_of_memory_is_one_line(ctx: TrainContext):
    """``torch.OutOfMemoryError`` (loading the model, measuring, training, the end of the run) becomes a
    :class:`TrainError` of one line: the budget, the micro-batch, the checkpointing and what to lower. What
    was saved before stays (checkpoints, the run's files): nothing is removed on the way out."""
    try:
        yield
    except torch.OutOfMemoryError as e:
        train = getattr(ctx, "train", ctx.config.train)
        plan = from_config(train.gradient_checkpointing)
        label = "auto (not yet chosen)" if plan is None else plan.label
        message = out_of_memory_message(getattr(ctx, "budget", None), train.per_device_train_batch_size,
                                        ctx.state.seq_length, label, oom_advice(train, ctx.config.lora,
                                                                                ctx.config.expert))
        raise TrainError(message) from e


def run_record(ctx: TrainContext) -> dict:
    """``run.json``: the build, model, device, precision and batch shape the run trains with."""
    train, world, manifest, batch_size = ctx.train, ctx.world, ctx.manifest, ctx.train.per_device_train_batch_size
    return {
        "build_id": manifest.build_id, "build_dir": str(ctx.build_dir), "tokenizer_hash": manifest.tokenizer_hash,
        "model": ctx.config.model.name, "model_dir": str(ctx.source.directory),
        "random_init": not ctx.source.has_weights, "device": str(ctx.device), "precision": ctx.precision.note,
        "dtype": {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(ctx.precision.param_dtype, "fp32"),
        "total_steps": ctx.total_steps, "warmup_steps": warmup_steps(train, ctx.total_steps),
        "resumed_from": str(ctx.checkpoint) if ctx.checkpoint else None,
        "world_size": world.world_size, "block_size": manifest.block_size, "seq_length": ctx.train_set.seq_length,
        "global_batch_blocks": batch_size * world.world_size * train.gradient_accumulation_steps,
        "per_device_train_batch_size": batch_size, "gradient_accumulation_steps": train.gradient_accumulation_steps,
        "gradient_checkpointing": train.gradient_checkpointing, "attention": ctx.attention.name,
        "torch_compile": train.torch_compile, "fused_loss": ctx.fused is not None,
        "base_precision": ctx.base_precision.name,
    }


def log_run_shape(ctx: TrainContext) -> None:
    """The run's one line: directory, build, sequences, steps and batch shape."""
    train_set, block_size, train = ctx.train_set, ctx.manifest.block_size, ctx.train
    n, plural = len(train_set), "s" if len(train_set) != 1 else ""
    sequences = (f"{n} train block{plural} of {block_size} tokens" if train_set.windows == 1 else
                 f"{n} train sequence{plural} of {train_set.seq_length} tokens (train.max_seq_length: the "
                 f"{train_set.blocks} block{'s' * (train_set.blocks != 1)} of {block_size} tokens cut into windows, up to "
                 f"{train_set.windows} each; windows of padding only left out)")
    log.info("run %s: build %s, %s, %d steps of %d x %d x %d sequences (per device x world size x gradient "
             "accumulation); an epoch: %s", ctx.run.run_dir, ctx.manifest.build_id, sequences, ctx.total_steps,
             train.per_device_train_batch_size, ctx.world.world_size, train.gradient_accumulation_steps,
             epoch_shape(ctx.sampler.micro_batches, train.gradient_accumulation_steps))
