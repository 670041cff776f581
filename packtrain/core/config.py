"""Typed configuration: one default for every field, here, and nowhere else.

An expert's resolved config is ``configs/defaults.yaml`` (shared choices) under
``configs/<expert>.yaml`` (the expert's delta) under command-line overrides (``DATASET=``,
``MODEL=``, ...), loaded by packtrain/core/configfile.py. Unknown keys are errors, and every problem is
reported at once.

The trainer reads the same file for its own sections (``model``, ``lora``, ``train``); it never
reads the build sections' data, only the shards the build wrote.

The sections live by concern: config_sources.py (sources), config_build.py (format, pack, build), config_train.py
(model, lora, train, cpu), config_fields.py (``num()`` ranges, ``check_numbers``); this module holds
the whole (:class:`ExpertConfig`, with curriculum :class:`StageConfig`) and its cross-field checks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from packtrain.core.config_build import BuildConfig, FormatConfig, PackConfig
from packtrain.core.config_sources import SourceConfig
from packtrain.core.config_fields import BUNDLED, check_numbers, num
from packtrain.core.config_train import CpuConfig, LoraConfig, ModelConfig, TrainConfig
from packtrain.core.expert_names import STAGE_NAME, check_build_name, stage_expert
from packtrain.core.errors import ContractError, PacktrainError


class ConfigError(PacktrainError):
    """The configuration is invalid; the message lists every problem found."""


@dataclass
class StageConfig:
    """One stage of a curriculum: its own sources and length; it starts from the previous stage's
    adapter. Built and trained as the expert ``<expert>.<name>`` (a '.' is in no expert's name, so no
    expert shares a stage's builds or runs)."""

    name: str
    """The stage's name: lowercase letters, digits and '_'; the stage is built and trained as the
    expert ``<expert>.<name>``."""
    sources: list[SourceConfig]
    """The datasets of this stage (as the top-level ``sources``); ``bundled`` means the expert's sample."""
    num_train_epochs: int | None = num(None, "[1, 1000000]", "or unset: train.num_train_epochs")
    """Epochs of this stage; unset: ``train.num_train_epochs``."""
    max_steps: int | None = num(None, "[1, 1000000000000]", "or unset: train.max_steps")
    """Optimizer steps of this stage; unset: ``train.max_steps``."""

    def validate(self, errors: list[str], where: str) -> None:
        if not STAGE_NAME.fullmatch(self.name or ""):
            errors.append(f"{where}.name: {self.name!r}: use lowercase letters, digits and '_' (it becomes "
                          "part of the directory names <expert>.<stage>)")
        if not self.sources:
            errors.append(f"{where}.sources: a stage needs at least one source")
        for i, source in enumerate(self.sources):
            source.validate(errors, f"{where}.sources[{i}]")
        check_eval_sources(self.sources, f"{where}.sources", errors)


@dataclass
class ExpertConfig:
    expert: str
    """The expert's name (``sql``): the name of its ``configs/<expert>.yaml`` and of its directories
    under the cache and the runs; lowercase letters, digits, '-' and '_'."""
    sources: list[SourceConfig]
    """The datasets the expert is built from (see :class:`SourceConfig`), mixed by their ``weight``."""
    format: FormatConfig = field(default_factory=FormatConfig)
    """How a row becomes prompt and answer text (see :class:`FormatConfig`)."""
    pack: PackConfig = field(default_factory=PackConfig)
    """How documents are packed into blocks and shards (see :class:`PackConfig`)."""
    build: BuildConfig = field(default_factory=BuildConfig)
    """How the build runs: processes, batches, bad rows, dedup (see :class:`BuildConfig`)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The base model and its tokenizer (see :class:`ModelConfig`)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """The adapters trained on the base (see :class:`LoraConfig`)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The training run (see :class:`TrainConfig`)."""
    stages: list[StageConfig] = field(default_factory=list)
    """A curriculum: when set, ``sources`` is not used; each stage is built and trained in order."""
    cpu: CpuConfig = field(default_factory=CpuConfig)
    """What a machine without a CUDA GPU trains instead (see :class:`CpuConfig`)."""

    def validate(self, errors: list[str], where: str = "") -> None:
        check_numbers(self, errors)
        try:
            check_build_name(self.expert)  # a curriculum stage is <expert>.<stage>
        except ContractError as e:
            errors.append(f"expert: {e}")
        if not self.sources and not self.stages:
            errors.append("sources: at least one source is needed (or set DATASET=..., or stages:)")
        names = [stage.name for stage in self.stages]
        for i, stage in enumerate(self.stages):
            stage.validate(errors, f"stages[{i}]")
            if names.count(stage.name) > 1 and names.index(stage.name) == i:
                errors.append(f"stages[{i}].name: {stage.name!r} is used twice")
        for i, source in enumerate(self.sources):
            source.validate(errors, f"sources[{i}]")
        check_eval_sources(self.sources, "sources", errors)
        for name in ("format", "pack", "build", "model", "lora", "train", "cpu"):
            getattr(self, name).validate(errors, name)
        if self.pack.strategy == "wrap" and self.pack.overlong != "split":
            errors.append("pack.overlong: wrap splits every document at block boundaries; leave overlong: split")
        if self.train.max_seq_length is not None and self.train.max_seq_length > self.pack.block_size:
            errors.append(f"train.max_seq_length: {self.train.max_seq_length} is longer than pack.block_size "
                          f"{self.pack.block_size}: the trainer cuts blocks into shorter sequences, it never joins "
                          "them; raise pack.block_size (a new build), or lower or unset train.max_seq_length")
        if self.train.fsdp and self.lora.method == "qlora":
            errors.append("train.fsdp cannot shard a QLoRA base: bitsandbytes' NF4 weights (Params4bit) are not "
                          "shardable by fully_shard as they are. Use lora.method: lora with train.fsdp (the bf16 base "
                          "is split over the ranks), or qlora without train.fsdp (the NF4 base on each device)")
        if self.model.base_precision == "fp8" and self.lora.method == "qlora":
            errors.append("model.base_precision: fp8 with lora.method: qlora: the QLoRA base is NF4 already, there is no "
                          "bf16 base to compute in fp8; use lora.method: lora with fp8, or base_precision: auto with qlora")
        if self.train.fsdp and self.train.merge_adapter:
            errors.append("train.fsdp with train.merge_adapter: merging needs the whole base on one device. Train "
                          "with merge_adapter false, then merge the finished run's adapter with `packtrain export "
                          "EXPERT --run DIR --out DIR --merged`")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def eval_sources(self) -> list[tuple[int, SourceConfig]]:
        """(index, source) of each source with ``role: eval``, in order."""
        return [(i, s) for i, s in enumerate(self.sources) if s.role == "eval"]

    def held_out_fraction(self) -> float:
        """The share of the training sources' documents held out for validation: ``pack.val_fraction``,
        or 0 where eval sources are the validation split (docs/DATASETS.md, "Eval sources")."""
        return 0.0 if self.eval_sources() else self.pack.val_fraction

    def for_device(self, cuda: bool, explicit: frozenset[str] = frozenset()) -> "ExpertConfig":
        """This config as the machine trains it: unchanged on a CUDA GPU or with ``cpu.enabled: false``,
        else with the ``cpu`` section's sequence length, steps, batch, evaluation cap and batch, and save cadence,
        each only where ``explicit`` (the dotted keys the user set, configfile.explicit_keys) does not name the field.
        Only ``train`` changes: the build (sources, format, pack, build, model) is the same on every
        machine, so a CPU host builds, judges and rebuilds the very build a GPU trainer uses."""
        if cuda or not self.cpu.enabled:
            return self
        cpu, train = self.cpu, self.train
        batch_set = explicit & {"train.per_device_train_batch_size", "train.gradient_accumulation_steps",
                                "train.global_batch_size"}
        cut = ("train.max_seq_length" not in explicit and train.max_seq_length is None
               and cpu.max_seq_length < self.pack.block_size)  # blocks this short or shorter are trained whole
        return dataclasses.replace(self, train=dataclasses.replace(
            train, max_seq_length=cpu.max_seq_length if cut else train.max_seq_length,
            max_steps=train.max_steps if train.max_steps is not None else cpu.max_steps,
            max_eval_batches=train.max_eval_batches if train.max_eval_batches is not None else cpu.max_eval_batches,
            per_device_eval_batch_size=train.per_device_eval_batch_size
            if "train.per_device_eval_batch_size" in explicit else cpu.per_device_eval_batch_size,
            save_minutes=train.save_minutes if "train.save_minutes" in explicit else cpu.save_minutes,
            **({} if batch_set else {"per_device_train_batch_size": cpu.per_device_train_batch_size,
                                     "gradient_accumulation_steps": 1, "global_batch_size": None})))

    def cpu_note(self, max_steps: int | None = None) -> str:
        """One short line saying what the cpu section changes (said once, when training begins);
        ``max_steps``: ``--max-steps``, the steps that will run instead of the profile's."""
        train, block = self.train, self.pack.block_size
        length = train.max_seq_length or block
        sequences = (f"{length}-token windows of the {block}-token blocks" if length < block
                     else f"whole {block}-token blocks")
        steps = (f"{max_steps} step{'s' * (max_steps != 1)} (--max-steps)" if max_steps is not None
                 else f"{train.max_steps} steps")
        return (f"no CUDA GPU: the cpu profile (configs/defaults.yaml cpu:) trains {sequences}, {steps} "
                f"of {train.per_device_train_batch_size} sequence(s), evaluation on {train.max_eval_batches} "
                f"batch(es) of {train.per_device_eval_batch_size}, end-of-run answers within "
                f"{self.cpu.generate_tokens} tokens a model; cpu.enabled: false trains the full config")

    def stage_configs(self) -> list["ExpertConfig"]:
        """One config per stage, expert ``<expert>.<stage>``, in order; [self] without stages. A
        stage's ``bundled`` source means this expert's sample (``bundled:<expert>``). The trainer trains
        them in order, each from the previous stage's adapter (trainer/run/curriculum.py)."""
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
            out.append(dataclasses.replace(self, expert=stage_expert(self.expert, stage.name), sources=sources,
                                           stages=[], train=train))
        return out


def check_eval_sources(sources: list[SourceConfig], where: str, errors: list[str]) -> None:
    """At least one source trains; each eval source has a name of its own (the metrics are keyed by it)."""
    if sources and all(s.role == "eval" for s in sources):
        errors.append(f"{where}: every source has role: eval, so nothing would be trained; give the training data "
                      "role: train (the default) and keep role: eval for the held-out sets")
    named: dict[str, int] = {}
    for i, source in enumerate(sources):
        if source.role == "eval" and named.setdefault(source.eval_name(), i) != i:
            errors.append(f"{where}[{i}]: an eval source named {source.eval_name()!r} like {where}[{named[source.eval_name()]}] "
                          "(eval sources are reported by file name or dataset id and split); give each its own file "
                          "name or split, or list the set once")


def resolve_val_fraction(config: "ExpertConfig", data: dict, errors: list[str]) -> None:
    """With an eval source (a stage's too) the eval sources are the validation split: ``pack.val_fraction``
    not set in ``data`` becomes 0 (so the config written beside a build or a run says so, and reads back
    the same), and set above 0 it is refused, as axolotl refuses val_set_size with test_datasets."""
    pack = data.get("pack") if isinstance(data.get("pack"), dict) else {}
    evals = [f"sources[{i}]" for i, _ in config.eval_sources()] + [
        f"stages[{k}].sources[{i}]" for k, stage in enumerate(config.stages)
        for i, s in enumerate(stage.sources) if s.role == "eval"]
    if not evals:
        return
    if "val_fraction" not in pack:
        config.pack.val_fraction = 0.0
    elif config.pack.val_fraction > 0:
        errors.append(f"pack.val_fraction: {config.pack.val_fraction} with an eval source ({evals[0]}.role: eval): the "
                      "eval sources are the validation split and the training sources hold nothing out; remove "
                      "pack.val_fraction, or remove role: eval to hold out a share of every source instead")


def profile_changes(written: "ExpertConfig", trained: "ExpertConfig") -> str:
    """What the cpu profile changes in ``written`` (``trained``: :meth:`ExpertConfig.for_device`'s),
    field by field; empty where it changes nothing::

        train.max_steps: 30 (null in the config), train.max_seq_length: 512 (null in the config)
    """
    before, after = written.to_dict()["train"], trained.to_dict()["train"]
    def shown(value) -> str:
        return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return ", ".join(f"train.{key}: {shown(after[key])} ({shown(before[key])} in the config)"
                     for key in after if after[key] != before.get(key))

