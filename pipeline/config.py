"""Typed configuration: one default for every field, here, and nowhere else.

An expert's resolved config is ``configs/defaults.yaml`` (shared choices) under
``configs/<expert>.yaml`` (the expert's delta) under command-line overrides (``DATASET=``,
``MODEL=``, ...), loaded by pipeline/configfile.py. Unknown keys are errors, and every problem is
reported at once.

The trainer reads the same file for its own sections (``model``, ``lora``, ``train``); it never
reads the build sections' data, only the shards the build wrote.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Literal

from pipeline.contract import ContractError, check_expert_name

BUNDLED = "bundled"


class ConfigError(Exception):
    """The configuration is invalid; the message lists every problem found."""


@dataclass
class SourceConfig:
    """One dataset feeding the expert."""

    name: str
    """``bundled`` (the sample shipped with packtrain), an HF dataset id (``b-mc2/sql-create-context``)
    found in the local HF caches, or a local path (jsonl/json/csv/parquet file or directory, or a
    ``save_to_disk`` directory)."""
    split: str = "train"
    revision: str | None = None
    """Hub cache only: a branch/tag name or a commit hash; default: the ``main`` ref, or the only snapshot."""
    columns: dict[str, str] = field(default_factory=dict)
    """Template field -> dataset column, for datasets whose column names differ from the template's."""
    max_rows: int | None = None

    def validate(self, errors: list[str], where: str) -> None:
        if not self.name:
            errors.append(f"{where}.name: must not be empty")
        if self.max_rows is not None and self.max_rows <= 0:
            errors.append(f"{where}.max_rows: must be positive, got {self.max_rows}")


@dataclass
class FormatConfig:
    """How a row becomes (prompt, answer) text. The answer is supervised, the prompt is not."""

    style: Literal["template", "chat"] = "template"
    """``template``: ``prompt`` + ``answer`` + eos. ``chat``: the tokenizer's chat template, with
    ``system`` (optional), the user turn rendered from ``prompt`` and the assistant turn from ``answer``."""
    prompt: str = "{prompt}"
    """Python format string over the row's fields, e.g. ``"### Question\\n{question}\\n### SQL\\n"``."""
    answer: str = "{answer}"
    system: str | None = None

    def validate(self, errors: list[str], where: str) -> None:
        for name in ("prompt", "answer"):
            try:
                template_fields(getattr(self, name))
            except ValueError as e:
                errors.append(f"{where}.{name}: not a valid format string ({e})")
        if self.system is not None and self.style != "chat":
            errors.append(f"{where}.system: only used with style: chat")
        try:
            names = template_fields(self.prompt, positional=True) + template_fields(self.answer, positional=True)
        except ValueError:
            return  # reported above
        odd = [n for n in names if n == "" or n.isdigit() or "." in n or "[" in n]
        if odd:
            errors.append(f"{where}: field {{{odd[0]}}} is not a column name; name the dataset column in the braces, "
                          "e.g. {question}")
        elif not names:
            errors.append(f"{where}.prompt/answer: no field at all, so every example would be the same text; name the "
                          "dataset's columns in braces, e.g. prompt: \"{question}\" and answer: \"{answer}\"")

    def fields(self) -> list[str]:
        return sorted(set(template_fields(self.prompt)) | set(template_fields(self.answer)))


def template_fields(template: str, positional: bool = False) -> list[str]:
    """The field names of a format string; ``positional``: also the empty names of ``{}``."""
    import string

    return [name for _, name, _, _ in string.Formatter().parse(template) if name or (positional and name == "")]


@dataclass
class PackConfig:
    block_size: int = 2048
    strategy: Literal["bfd", "wrap"] = "bfd"
    """``bfd``: best-fit decreasing over the whole dataset, documents never split across blocks.
    ``wrap``: concatenate every document and cut into blocks (documents may span two blocks)."""
    overlong: Literal["split", "truncate", "drop"] = "split"
    """Documents longer than block_size (bfd only): split into block-size pieces, truncate to one
    block, or drop. Always counted in the report."""
    val_fraction: float = 0.02
    """Share of documents held out for validation, chosen by a hash of each document's content."""
    shard_size_mb: int = 128

    def validate(self, errors: list[str], where: str) -> None:
        if not 16 <= self.block_size <= 1 << 20:
            errors.append(f"{where}.block_size: must be in [16, 1048576], got {self.block_size}")
        if not 0.0 <= self.val_fraction < 1.0:
            errors.append(f"{where}.val_fraction: must be in [0, 1), got {self.val_fraction}")
        if self.shard_size_mb <= 0:
            errors.append(f"{where}.shard_size_mb: must be positive, got {self.shard_size_mb}")


@dataclass
class BuildConfig:
    num_proc: int = 8
    batch_rows: int = 1000
    """Rows per tokenization task; fixed, so the output does not depend on num_proc."""
    on_bad_rows: Literal["skip", "error"] = "skip"
    line_cache: bool = True
    """Tokenize each distinct line once (schemas repeat across rows). Used only with tokenizers for
    which it provably gives the same tokens (pipeline/segments.py), so it is not part of the build id."""

    def validate(self, errors: list[str], where: str) -> None:
        if self.num_proc < 1:
            errors.append(f"{where}.num_proc: must be >= 1, got {self.num_proc}")
        if self.batch_rows < 1:
            errors.append(f"{where}.batch_rows: must be >= 1, got {self.batch_rows}")


@dataclass
class ModelConfig:
    name: str = BUNDLED
    """``bundled`` (a small random-init demo model with the bundled tokenizer), an HF model id found
    in the local hub cache, or a local directory. Its tokenizer is the one the build uses."""
    tokenizer: str | None = None
    """Tokenizer source when it differs from the model's (HF id or local directory)."""
    revision: str | None = None
    trust_remote_code: bool = False
    use_sdpa: bool = True
    varlen_attention: bool = True
    """Per-document flash attention (``torch.nn.attention.varlen``, no mask) where it can run: CUDA,
    sm80+, a model that takes custom attention functions (trainer/attention.py). False, or where it
    cannot run: SDPA with a block-diagonal mask (exact, slower). The choice is logged."""

    def validate(self, errors: list[str], where: str) -> None:
        if not self.name:
            errors.append(f"{where}.name: must not be empty")


@dataclass
class LoraConfig:
    method: Literal["lora", "qlora"] = "lora"
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    """LoRA dropout. 0 by default: dropout > 0 keeps one more activation per adapted layer (docs/TRAINING.md)."""
    target_modules: str | list[str] = "all-linear"

    def validate(self, errors: list[str], where: str) -> None:
        if self.r < 1:
            errors.append(f"{where}.r: must be >= 1, got {self.r}")
        if not 0.0 <= self.dropout < 1.0:
            errors.append(f"{where}.dropout: must be in [0, 1), got {self.dropout}")
        if self.alpha <= 0:
            errors.append(f"{where}.alpha: must be positive, got {self.alpha}")
        if isinstance(self.target_modules, list) and not self.target_modules:
            errors.append(f"{where}.target_modules: must not be empty (use \"all-linear\" for every linear layer)")


@dataclass
class TrainConfig:
    """Training knobs, named as in Hugging Face ``TrainingArguments``."""

    seed: int = 42
    num_train_epochs: int = 1
    max_steps: int | None = None
    """When set, train exactly this many optimizer steps (cycling over epochs as needed), whatever
    num_train_epochs says: the semantics of HF ``TrainingArguments.max_steps``."""
    per_device_train_batch_size: int | Literal["auto"] = 8
    """Blocks per forward on each device, or ``auto`` (CUDA): measured in the first steps, the
    fastest micro-batch that fits the GPU with headroom (trainer/microbatch.py), with
    gradient_accumulation_steps set so that every step still trains ``global_batch_size`` blocks."""
    global_batch_size: int | None = None
    """Blocks per optimizer step over all devices (micro-batch x accumulation x world size). Needed
    with ``per_device_train_batch_size: auto`` (it is what auto keeps); when set with a number for
    the micro-batch it must agree with it."""
    per_device_eval_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    learning_rate: float = 2e-4
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    lr_scheduler_type: Literal["cosine", "linear", "constant"] = "cosine"
    warmup_ratio: float = 0.03
    warmup_steps: int = 0
    optim: Literal["adamw_torch_fused", "adamw_torch", "adamw_bnb_8bit"] = "adamw_torch_fused"
    bf16: bool = True
    fp16: bool = False
    tf32: bool = True
    gradient_checkpointing: bool = False
    torch_compile: bool | Literal["auto"] = "auto"
    """``torch.compile`` the model (default dynamic shapes: one recompile, then none); ``auto``: on
    CUDA, off on CPU (where compiling costs more than it saves on short runs)."""
    fused_loss: bool | Literal["auto"] = "auto"
    """The fused linear cross-entropy of cut-cross-entropy for the loss head on CUDA (trainer/loss.py);
    ``auto``: used on CUDA when installed (``pip install 'packtrain[cuda]'``), else the chunked loss."""
    dataloader_num_workers: int = 8
    dataloader_prefetch_factor: int = 8
    dataloader_pin_memory: bool = True
    dataloader_persistent_workers: bool = True
    eval_steps: int = 200
    max_eval_batches: int | None = None
    save_steps: int = 200
    save_total_limit: int = 3
    logging_steps: int = 1
    output_dir: str = "runs"
    max_bad_steps: int = 3
    """Consecutive non-finite losses tolerated (each skips its optimizer step) before the run stops."""
    init_adapter: str | None = None
    """Start the LoRA weights from this PEFT adapter directory instead of zeros (each curriculum
    stage starts from the previous stage's adapter). Ignored when resuming a checkpoint."""
    merge_adapter: bool = False
    """Also export the base model with the adapter merged in (``merged/``) at the end."""
    run_name: str | None = None
    """Name of the run directory ``<output_dir>/<expert>/<run_name>/``; default: the start time
    and the build id (``20250131-142501-0123abcd``), so names sort by age."""
    peak_tflops: float | None = None
    """Peak dense TFLOP/s of the accelerator, for MFU; default: looked up by GPU name (H100, H200,
    A100, L4, L40S, RTX 4090), none on CPU (then mfu is null)."""
    chunked_loss: bool = True
    """Compute the loss from the final hidden states of the supervised positions, in chunks of
    4096 through the output head under activation checkpointing, so the [batch, block, vocab]
    logits never exist (trainer/loss.py); false: the full-logits loss. Same loss and gradients."""
    fsdp: bool = False
    """Under torchrun, shard the model over the ranks with FSDP2 (``fully_shard`` on every decoder
    layer and on the root), for a base too large for one device; without torchrun nothing is
    sharded. The type is checked like every field's; ``lora.method: qlora`` and ``merge_adapter``
    with it are refused when training starts (trainer/train.py); docs/DISTRIBUTED.md."""

    def validate(self, errors: list[str], where: str) -> None:
        if self.max_steps is not None and self.max_steps < 1:
            errors.append(f"{where}.max_steps: must be >= 1 (or unset: num_train_epochs decides), got {self.max_steps}")
        for name in ("num_train_epochs", "per_device_train_batch_size", "per_device_eval_batch_size",
                     "gradient_accumulation_steps", "eval_steps", "save_steps", "logging_steps", "global_batch_size"):
            value = getattr(self, name)
            if isinstance(value, int) and not isinstance(value, bool) and value < 1:
                errors.append(f"{where}.{name}: must be >= 1, got {getattr(self, name)}")
        micro = self.per_device_train_batch_size
        if micro == "auto" and self.global_batch_size is None:
            errors.append(f"{where}.per_device_train_batch_size: auto needs {where}.global_batch_size (blocks per "
                          "optimizer step over all devices, e.g. 32): auto keeps it while choosing the micro-batch")
        if (isinstance(micro, int) and self.global_batch_size is not None
                and self.global_batch_size % (micro * self.gradient_accumulation_steps)):
            errors.append(f"{where}.global_batch_size: {self.global_batch_size} is not per_device_train_batch_size "
                          f"({micro}) x gradient_accumulation_steps ({self.gradient_accumulation_steps}) x world size; "
                          "unset it, or set per_device_train_batch_size: auto")
        if self.learning_rate <= 0:
            errors.append(f"{where}.learning_rate: must be positive, got {self.learning_rate}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            errors.append(f"{where}.warmup_ratio: must be in [0, 1), got {self.warmup_ratio}")
        if self.bf16 and self.fp16:
            errors.append(f"{where}: bf16 and fp16 are both true; choose one")
        if self.dataloader_num_workers < 0:
            errors.append(f"{where}.dataloader_num_workers: must be >= 0")
        if self.save_total_limit < 1:
            errors.append(f"{where}.save_total_limit: must be >= 1 (checkpoints are needed to resume)")
        if self.warmup_steps < 0:
            errors.append(f"{where}.warmup_steps: must be >= 0, got {self.warmup_steps}")
        if self.max_grad_norm <= 0:
            errors.append(f"{where}.max_grad_norm: must be positive, got {self.max_grad_norm}")
        if self.max_bad_steps < 1:
            errors.append(f"{where}.max_bad_steps: must be >= 1, got {self.max_bad_steps}")
        if self.dataloader_prefetch_factor < 1:
            errors.append(f"{where}.dataloader_prefetch_factor: must be >= 1, got {self.dataloader_prefetch_factor}")
        if self.max_eval_batches is not None and self.max_eval_batches < 1:
            errors.append(f"{where}.max_eval_batches: must be >= 1 (or unset for all), got {self.max_eval_batches}")
        if self.run_name is not None and not (self.run_name[:1].isalnum() and len(self.run_name) <= 128
                                              and all(c.isalnum() or c in "._-" for c in self.run_name)):
            errors.append(f"{where}.run_name: use letters, digits, '.', '_' and '-' (a directory name), got {self.run_name!r}")
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            errors.append(f"{where}.peak_tflops: must be positive, got {self.peak_tflops}")


@dataclass
class StageConfig:
    """One stage of a curriculum: its own sources and length; it starts from the previous stage's
    adapter. Built and trained as the expert ``<expert>-<name>``."""

    name: str
    sources: list[SourceConfig]
    num_train_epochs: int | None = None
    max_steps: int | None = None

    def validate(self, errors: list[str], where: str) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9_]{0,31}", self.name or ""):
            errors.append(f"{where}.name: {self.name!r}: use lowercase letters, digits and '_' (it becomes "
                          "part of the directory names <expert>-<stage>)")
        if not self.sources:
            errors.append(f"{where}.sources: a stage needs at least one source")
        for i, source in enumerate(self.sources):
            source.validate(errors, f"{where}.sources[{i}]")
        for name in ("num_train_epochs", "max_steps"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                errors.append(f"{where}.{name}: must be >= 1, got {getattr(self, name)}")


@dataclass
class ExpertConfig:
    expert: str
    sources: list[SourceConfig]
    format: FormatConfig = field(default_factory=FormatConfig)
    pack: PackConfig = field(default_factory=PackConfig)
    build: BuildConfig = field(default_factory=BuildConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    stages: list[StageConfig] = field(default_factory=list)
    """A curriculum: when set, ``sources`` is not used; each stage is built and trained in order."""

    def validate(self, errors: list[str], where: str = "") -> None:
        try:
            check_expert_name(self.expert)
        except ContractError as e:
            errors.append(f"expert: {e}")
        if not self.sources and not self.stages:
            errors.append("sources: at least one source is needed (or set DATASET=..., or stages:)")
        names = [stage.name for stage in self.stages]
        for i, stage in enumerate(self.stages):
            stage.validate(errors, f"stages[{i}]")
            try:
                check_expert_name(f"{self.expert}-{stage.name}")
            except ContractError as e:
                errors.append(f"stages[{i}].name: {e}")
            if names.count(stage.name) > 1 and names.index(stage.name) == i:
                errors.append(f"stages[{i}].name: {stage.name!r} is used twice")
        for i, source in enumerate(self.sources):
            source.validate(errors, f"sources[{i}]")
        for name in ("format", "pack", "build", "model", "lora", "train"):
            getattr(self, name).validate(errors, name)
        if self.pack.strategy == "wrap" and self.pack.overlong != "split":
            errors.append("pack.overlong: wrap splits every document at block boundaries; leave overlong: split")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def stage_configs(self) -> list["ExpertConfig"]:
        """One config per stage, expert ``<expert>-<stage>``, in order; [self] without stages. A
        stage's ``bundled`` source means this expert's sample (``bundled:<expert>``). The trainer
        chains the adapters (train.init_adapter)."""
        if not self.stages:
            return [self]
        out = []
        for stage in self.stages:
            sources = [dataclasses.replace(s, name=f"{BUNDLED}:{self.expert}") if s.name == BUNDLED else s
                       for s in stage.sources]
            train = dataclasses.replace(
                self.train,
                num_train_epochs=stage.num_train_epochs or self.train.num_train_epochs,
                max_steps=stage.max_steps if stage.max_steps is not None else self.train.max_steps)
            out.append(dataclasses.replace(self, expert=f"{self.expert}-{stage.name}", sources=sources, stages=[],
                                           train=train))
        return out
