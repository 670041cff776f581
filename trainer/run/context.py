"""One run, set up: the :class:`TrainContext` that the loop, the evaluation and the end of the run take
instead of a dozen arguments each.

train.py checks the build, the tokenizer and the checkpoint to resume, and makes the context from what
they settled (its first fields); :func:`prepare` then runs the named setup phases, in this order, each
filling the fields it names (nothing is written to the run directory yet):

1. :func:`setup_runtime`: device, its memory budget (``train.max_memory_gib``), torch threads, seed, precision;
2. :func:`setup_model`: the base model, its linear layers' precision (fp8: trainer/model/fp8.py), its attention
   path and adapters (``train.init_adapter``);
3. :func:`setup_micro_batch`: the fused loss kernel, torch.compile (regional, whole or off:
   trainer/model/compilation.py), the train set, the micro-batch and the activation checkpointing (``auto``
   decided here, once): resolved into ``ctx.train``;
4. :func:`setup_data`: the sampler and loaders, the number of steps (epochs cut into steps as HF's Trainer
   cuts them: trainer/data/epochs.py);
5. :func:`setup_optimizer`: FSDP sharding (before the optimizer: it must hold the sharded parameters),
   optimizer, schedule, GradScaler;
6. :func:`restore`: the data stream at the state's position, and the checkpoint's weights, optimizer and
   RNG states (last of all).
"""

from __future__ import annotations

import dataclasses
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Subset

from packtrain.core.config import ExpertConfig
from packtrain.core.config_train import TrainConfig
from packtrain.core.contract import Manifest
from packtrain.trainer.model.adapters import attach_adapters, load_adapter_weights, trainable_parameters
from packtrain.trainer.model.attention import AttentionChoice, choose_attention
from packtrain.trainer.run.checkpoint import RunInfo, TrainState, load_checkpoint
from packtrain.trainer.model.compilation import choose_compile
from packtrain.trainer.data.data import BlockDataset, PaddedBlocks, eval_slice, make_loader
from packtrain.trainer.run.distributed import World, device_for, shard
from packtrain.trainer.data.epochs import BatchStream, BlockSampler
from packtrain.trainer.model.fp8 import BasePrecision, choose_base_precision, convert_base_to_fp8
from packtrain.trainer.loss import fused_kernel
from packtrain.trainer.report.metrics import FlopCounter
from packtrain.trainer.model.memory import Budget, apply_budget
from packtrain.trainer.model.microbatch import resolve
from packtrain.trainer.model.model import ModelSource, Precision, choose_precision, load_base_model
from packtrain.trainer.optim import build_optimizer
from packtrain.trainer.run.isolation import check_document_isolation
from packtrain.trainer.run.run_checks import TrainError, check_build_fits_model
from packtrain.trainer.schedule import build_scheduler, total_training_steps
from packtrain.trainer.step import LossPath
from packtrain.trainer.threads import set_torch_threads

log = logging.getLogger("packtrain.train")

INIT_ADAPTER_FIX = ("set train.init_adapter to a directory holding adapter_model.safetensors (a finished run's "
                    "adapter/, or a checkpoint's), or leave it out to start from a new adapter")


@dataclass
class TrainContext:
    """Everything one run trains with. The first fields are what train.py's checks settled; the others
    are set by the setup phases of :func:`prepare` (``ctx.run`` when the run directory is chosen)."""

    config: ExpertConfig
    world: World
    build_dir: Path
    manifest: Manifest
    source: ModelSource
    tok_dir: Path          # whose tokenizer files match the build's
    state: TrainState      # where training starts (a new run's, or the checkpoint's)
    checkpoint: Path | None  # the checkpoint to resume, or None

    # setup_runtime
    train: TrainConfig = field(init=False)  # as resolved: torch_compile "regional" or a bool, the micro-batch a number
    device: torch.device = field(init=False)
    precision: Precision = field(init=False)
    budget: Budget | None = field(init=False)  # the device memory the run may use (None: a CPU)
    # setup_model
    model: torch.nn.Module = field(init=False)  # the PeftModel (sharded under FSDP, never DDP-wrapped)
    attention: AttentionChoice = field(init=False)
    base_precision: BasePrecision = field(init=False)
    flops: FlopCounter = field(init=False)
    # setup_micro_batch
    fused: object = field(init=False)  # the fused loss kernel or None
    train_set: BlockDataset = field(init=False)
    # setup_data
    sampler: BlockSampler = field(init=False)
    train_loader: object = field(init=False)
    val_loaders: list = field(init=False)  # (eval set name or None: the val split, loader); []: no evaluation
    total_steps: int = field(init=False)
    # setup_optimizer
    fsdp: bool = field(init=False)
    optimizer: torch.optim.Optimizer = field(init=False)
    scheduler: object = field(init=False)
    scaler: torch.amp.GradScaler | None = field(init=False)
    # restore
    batches: BatchStream = field(init=False)
    # the run directory (train.py, once everything that can refuse has)
    run: RunInfo = field(init=False)

    @property
    def loss_path(self) -> LossPath:
        """How a micro-batch reaches its loss (trainer/step.py), in training and evaluation alike."""
        return LossPath(self.device, self.precision, self.attention, self.fused, self.train.chunked_loss)


def prepare(ctx: TrainContext) -> TrainContext:
    """Run the setup phases in order (the module docstring); returns ``ctx``, set up and restored."""
    setup_runtime(ctx)
    setup_model(ctx)
    setup_micro_batch(ctx)
    setup_data(ctx)
    setup_optimizer(ctx)
    restore(ctx)
    return ctx


def setup_runtime(ctx: TrainContext) -> None:
    """``train``, ``device``, ``budget``, ``precision``; torch's CPU threads (a resume trains with the checkpoint's),
    recorded in the state; the seed, the same on every rank."""
    train, state, world = ctx.config.train, ctx.state, ctx.world
    ctx.train = train
    ctx.device = device = device_for(world)
    ctx.budget = apply_budget(train.max_memory_gib, device)  # before anything is allocated on the device
    log.info("%s", set_torch_threads(train.cpu_threads, resumed=state.cpu_threads if ctx.checkpoint else 0))
    state.cpu_threads = torch.get_num_threads()  # recorded in every checkpoint: a resume trains with them too
    seed_everything(train.seed)  # the same on every rank: identical LoRA init and dropout RNG streams
    if world.enabled:
        log.info("data parallel: %d processes (this is rank %d, local rank %d, %s), backend %s", world.world_size,
                 world.rank, world.local_rank, device, torch.distributed.get_backend())
    ctx.precision = choose_precision(train, device)
    log.info("precision: %s", ctx.precision.note)


def setup_model(ctx: TrainContext) -> None:
    """``model`` (the base model, its linear layers in fp8 where ``model.base_precision`` says so, with its
    adapters, ``train.init_adapter``'s weights for a new run), ``base_precision``, ``attention``, ``flops``."""
    config, train, device = ctx.config, ctx.train, ctx.device
    model = load_base_model(config.model, ctx.source, ctx.precision, train.seed, config.lora.method == "qlora",
                            device)
    check_build_fits_model(ctx.build_dir, ctx.manifest, model, config.model.name, ctx.state.seq_length)
    ctx.attention = attention = choose_attention(device, config.model.use_sdpa, ctx.state.seq_length, model,
                                                 varlen=config.model.varlen_attention,
                                                 dtype=ctx.precision.autocast_dtype)
    log.info("attention: %s", attention.note)
    if attention.varlen:
        model.set_attn_implementation(attention.implementation)
    isolation = check_document_isolation(model, config.model.name, device, attention, ctx.precision)
    log.info("packed documents isolated: a probe's documents moved by at most %.1g of the largest logit (tolerance "
             "%g)", max(isolation.leak, isolation.mismatch), isolation.tolerance)
    ctx.base_precision = base_precision(ctx, model)
    model = attach_adapters(model, config.lora, train.gradient_checkpointing)
    if train.init_adapter and ctx.checkpoint is None:  # a resumed run's checkpoint already holds the weights
        try:
            load_adapter_weights(model, Path(train.init_adapter), INIT_ADAPTER_FIX)
        except RuntimeError as e:
            raise TrainError(f"train.init_adapter: {e}") from None
        log.info("adapter weights initialised from %s", train.init_adapter)
    ctx.model = model
    ctx.flops = flops = FlopCounter.for_model(model)  # counted on the full model, before any sharding
    log.info("model %s (%s): %.1fM matmul params, %.2fM trainable (%s r=%d)", config.model.name,
             ctx.source.directory, flops.matmul_params / 1e6, flops.trainable_params / 1e6, config.lora.method,
             config.lora.r)


def base_precision(ctx: TrainContext, model: torch.nn.Module) -> BasePrecision:
    """``model.base_precision`` decided and applied: the base's linear layers swapped for fp8 ones
    (trainer/model/fp8.py) before the adapters wrap them; said in the log."""
    if ctx.config.lora.method == "qlora":  # fp8 with qlora is refused by the config
        choice = BasePrecision("nf4", "NF4 (lora.method: qlora)")
    else:
        hidden = getattr(model.config.get_text_config(), "hidden_size", None)
        compiled = choose_compile(ctx.train.torch_compile, ctx.device)[0] is not False
        choice = choose_base_precision(ctx.config.model.base_precision, ctx.device, hidden,
                                       ctx.precision.autocast_dtype, compiled)
    if choice.name == "fp8":
        # torchao's CPU emulation where no GPU runs it: only reached where a test stands in for the GPU check
        names = convert_base_to_fp8(model, emulate=ctx.device.type != "cuda")
        choice = BasePrecision("fp8", f"{choice.note}: {len(names)} linear layers")
    log.info("base linear layers: %s", choice.note)
    return choice


def setup_micro_batch(ctx: TrainContext) -> None:
    """``fused``, ``train_set``; the loss kernel, compile, micro-batch and activation checkpointing resolved
    into ``train`` (``auto`` decided here, once: trainer/model/microbatch.py ``resolve``)."""
    train, device = ctx.train, ctx.device
    ctx.fused = fused_kernel(train.fused_loss, device)
    compile_mode, words = choose_compile(train.torch_compile, device)
    log.info("torch.compile: %s", words)
    train = dataclasses.replace(train, torch_compile=compile_mode)
    ctx.train_set = BlockDataset(ctx.build_dir, ctx.manifest, "train", ctx.state.seq_length)
    ctx.train = resolve(train, ctx.model, ctx.train_set, ctx.loss_path, ctx.world, ctx.budget)


def setup_data(ctx: TrainContext) -> None:
    """``sampler``, ``train_loader``, ``total_steps``, ``val_loaders`` (none without val blocks)."""
    train, world, manifest, train_set = ctx.train, ctx.world, ctx.manifest, ctx.train_set
    batch_size = train.per_device_train_batch_size
    ctx.sampler = BlockSampler(len(train_set), train.seed, manifest.build_id, rank=world.rank,
                               world_size=world.world_size, batch_size=batch_size)
    # every micro-batch full: the sampler fills an epoch's last one with padding (trainer/data/epochs.py)
    ctx.train_loader = make_loader(PaddedBlocks(train_set), ctx.sampler, batch_size, train, ctx.device,
                                   drop_last=True, seed=train.seed)
    # HF Trainer's steps: ceil(micro-batches / accumulation) an epoch, which is ceil(sequences / global
    # batch): the same whatever micro-batch auto measured
    ctx.total_steps = total_training_steps(train, ctx.sampler.micro_batches)
    val_set = BlockDataset(ctx.build_dir, manifest, "val", ctx.state.seq_length)
    if len(val_set) == 0:
        log.warning("build %s has no val blocks (pack.val_fraction: %s): evaluation is skipped",
                    manifest.build_id, manifest.val_fraction)
    # each eval source on its own (its blocks hold no other source's documents), else the whole val split
    parts = [(e.name, Subset(val_set, val_set.items_of_blocks(e.first_block, e.stop))) for e in manifest.eval_sets]
    ctx.val_loaders = [(name, make_loader(eval_slice(part, train, world, pad=train.fsdp), None,
                                          train.per_device_eval_batch_size, train, ctx.device, drop_last=False,
                                          seed=train.seed, num_workers=min(train.dataloader_num_workers, 2)))
                       for name, part in (parts or [(None, val_set)]) if len(part)]


def setup_optimizer(ctx: TrainContext) -> None:
    """``fsdp`` (the model sharded: before the optimizer, which must hold the sharded parameters),
    ``optimizer``, ``scheduler``, ``scaler`` (fp16 only)."""
    train, world = ctx.train, ctx.world
    ctx.fsdp = train.fsdp and world.enabled
    if train.fsdp and not world.enabled:
        log.info("train.fsdp: a single process, nothing to shard")
    if ctx.fsdp:
        ctx.model = shard(ctx.model, world, ctx.device)
    ctx.optimizer = build_optimizer(trainable_parameters(ctx.model), train, ctx.device)
    ctx.scheduler = build_scheduler(ctx.optimizer, train, ctx.total_steps)
    ctx.scaler = torch.amp.GradScaler(ctx.device.type) if ctx.precision.use_scaler else None


def restore(ctx: TrainContext) -> None:
    """``batches`` (the train stream at the state's epoch and position); a resumed run's weights, optimizer,
    schedule, scaler and RNG states (RNG last of all)."""
    ctx.batches = BatchStream(ctx.train_loader, ctx.sampler, ctx.state.epoch, ctx.state.position)
    train, state = ctx.train, ctx.state
    global_batch = train.per_device_train_batch_size * train.gradient_accumulation_steps * ctx.world.world_size
    if ctx.checkpoint is not None and state.global_batch not in (0, global_batch):  # allowed, and said
        log.warning("resuming %s, trained with %d sequences an optimizer step, with %d (per_device_train_batch_size %d "
                    "x gradient_accumulation_steps %d x world size %d): the steps from %d on take the new batch, so the "
                    "run's losses are no longer those of an uninterrupted run", ctx.checkpoint.name, state.global_batch,
                    global_batch, train.per_device_train_batch_size, train.gradient_accumulation_steps,
                    ctx.world.world_size, state.step + 1)
    state.global_batch = global_batch  # recorded in every checkpoint
    if ctx.checkpoint is not None:
        load_checkpoint(ctx.checkpoint, ctx.model, ctx.optimizer, ctx.scheduler, ctx.scaler)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
