"""What a checkpoint must share with the run that continues it, checked before the model loads
(trainer/run/train.py ``_resume_point``): the world size and sequence length (the data position counts
sequences), the tokenizer and the build, the LoRA settings, the optimizer settings and seed, and the base model.
Each refusal is one :class:`CheckpointError` line saying what differs and the ``--set`` to resume with.
"""

from __future__ import annotations

import json
from pathlib import Path

from packtrain.core.contract import CONFIG_SNAPSHOT
from packtrain.core.rundir import ADAPTER_DIR
from packtrain.trainer.model.adapters import ADAPTER_CONFIG, base_reference
from packtrain.trainer.run.checkpoint import CheckpointError, TrainState


def check_resume(state: TrainState, path: Path, build_id: str, tokenizer_hash: str, allow_build_change: bool,
                 world_size: int = 1, seq_length: int = 0, block_size: int = 0) -> None:
    if state.world_size != world_size:
        raise CheckpointError(
            f"checkpoint {path} was taken with world size {state.world_size}, this run has world size {world_size}: "
            "the global batch (per_device_train_batch_size x world size x gradient_accumulation_steps), the "
            "schedule and each rank's slice of the data would change mid-run. Resume with "
            f"{state.world_size} process(es) (torchrun --nnodes ... --nproc-per-node ... with WORLD_SIZE "
            f"{state.world_size}{', or without torchrun' if state.world_size == 1 else ''}), or start a new run")
    if (state.seq_length or block_size) != (seq_length or block_size):
        raise CheckpointError(
            f"checkpoint {path} was taken on sequences of {state.seq_length or block_size} tokens, this run has "
            f"{seq_length or block_size} (train.max_seq_length; the cpu profile sets it on a machine without a CUDA "
            "GPU): the data position counts sequences, so it would point elsewhere. Resume with --set "
            f"train.max_seq_length={state.seq_length or block_size} (on the machine kind it was taken on), or start "
            "a new run")
    if state.tokenizer_hash != tokenizer_hash:
        raise CheckpointError(
            f"checkpoint {path} was trained with tokenizer {state.tokenizer_hash[:12]}, the build and model use "
            f"{tokenizer_hash[:12]}: an adapter cannot continue on another tokenizer; start a new run")
    if state.build_id != build_id and not allow_build_change:
        raise CheckpointError(
            f"checkpoint {path} was taken on build {state.build_id}, this run would train on build {build_id}: "
            "resuming would mix two datasets. Train on the old build with --build-id "
            f"{state.build_id}, or pass --allow-build-change to continue on the new one "
            "(the data position then restarts at the beginning of an epoch)")


def check_same_adapter(path: Path, lora: dict) -> None:
    """Refuse to continue a checkpoint with other ``lora`` settings (method, r, alpha, dropout,
    target_modules): the adapter would train on with another scale or another base (QLoRA's 4-bit vs
    LoRA's full weights) without a word; its config.json says what it was trained with."""
    _check_same(path, "lora", lora, sorted(lora), "LoRA settings")


OPTIMIZER_FIELDS = ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon")
"""What the optimizer's and the schedule's saved state carry (their ``param_groups`` and ``base_lrs``): a
resume restores the checkpoint's, whatever the config says."""


def check_same_training(path: Path, train: dict) -> None:
    """Refuse to continue a checkpoint with other :data:`OPTIMIZER_FIELDS` (the restored optimizer state would
    keep the checkpoint's values while the run's config.json recorded the new ones), or another ``seed``."""
    _check_same(path, "train", train, OPTIMIZER_FIELDS, "optimizer settings (the restored optimizer keeps them)")
    _check_same(path, "train", train, ("seed",), "seed (it orders every epoch's blocks, so the saved data position "
                "would point into another order; and it draws a random-init base's weights)")


def check_same_base(path: Path, config: dict) -> None:
    """Refuse to continue a checkpoint on another base model than it was trained on (``config`` the resolved
    packtrain config as a dict): the adapter's weights are deltas to that base's, and another base with the
    same tokenizer and shapes (another local directory, another revision, the embedded model's GGUF after an
    upgrade) took them without a word. The base is compared by the name that means it on any machine
    (packtrain.core.resolve.portable_reference; what the checkpoint's adapter_config.json records), so the same
    base at another path or spelling resumes."""
    file = path / ADAPTER_DIR / ADAPTER_CONFIG
    try:
        recorded = json.loads(file.read_text(encoding="utf-8"))
        theirs = (recorded["base_model_name_or_path"], recorded.get("revision"))
        saved = json.loads((path / CONFIG_SNAPSHOT).read_text(encoding="utf-8"))["model"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint file {file} is corrupt ({type(e).__name__}: {e}); resume from another "
                              "checkpoint with --resume PATH or start a new run") from None
    ours = base_reference(config)
    if theirs == ours:
        return
    fix = " ".join(f"--set model.{key}={json.dumps(saved.get(key))}" for key in ("name", "revision")
                   if saved.get(key) != config["model"].get(key))
    raise CheckpointError(
        f"checkpoint {path} was trained on base model {_named(theirs)}, this run's is {_named(ours)} (model.name "
        f"{config['model']['name']}): its adapter continues only on the base it was trained on; resume with the "
        f"checkpoint's ({fix or '--set model.name=' + json.dumps(saved.get('name'))}), or start a new run, from its "
        "adapter with train.init_adapter")


def _named(reference: tuple[str, str | None]) -> str:
    name, revision = reference
    return name + (f" (revision {revision})" if revision else "")


def _check_same(path: Path, section: str, ours: dict, keys, what: str) -> None:
    file = path / CONFIG_SNAPSHOT
    try:
        saved = json.loads(file.read_text())[section]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint file {file} is corrupt ({type(e).__name__}: {e}); resume from another "
                              "checkpoint with --resume PATH or start a new run") from None
    differ = [key for key in keys if key in saved and saved[key] != ours[key]]
    if differ:
        raise CheckpointError(
            f"checkpoint {path} was trained with other {what}: "
            + ", ".join(f"{section}.{key} {saved[key]!r} (this run: {ours[key]!r})" for key in differ)
            + "; resume with the checkpoint's (" + " ".join(f"--set {section}.{key}={json.dumps(saved[key])}"
                                                           for key in differ)
            + "), or start a new run, from its adapter with train.init_adapter")
