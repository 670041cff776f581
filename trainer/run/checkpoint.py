"""Checkpoints: everything needed to continue a run exactly where it stopped.

``runs/<expert>/<run>/checkpoint-<step>/``::

    adapter/               the LoRA weights in PEFT format (PeftModel.from_pretrained loads it)
    trainer_state.pt       optimizer, scheduler, grad scaler, RNG states (python, numpy, torch, cuda);
                           with train.fsdp the optimizer state is gathered, full and keyed by
                           parameter name (``optimizer_layout: fsdp-full``)
    state.json             step, data position (epoch, index in the permutation over all ranks),
                           build id, tokenizer hash, token counters, world size
    config.json            the resolved packtrain config
    checksums.json         the sha256 of every other file, state.json included, checked before a
                           resume (a flipped byte in a weight or in the data position would otherwise
                           load silently)

A checkpoint is written into ``.tmp-checkpoint-<step>-<pid>/`` and renamed into place when
complete, so a crash never leaves a directory named ``checkpoint-*`` that is half written; a full
disk (in any form a library reports it: packtrain/core/diskfull.py) removes the temporary directory
and stops the run with one line naming the checkpoint, the free space and the fix.

A run is *finished* once it wrote any of its final artifacts (``summary.json``, ``adapter/``,
``merged/``). A finished run is never resumed into nor written to: ``--resume auto`` takes only
unfinished runs' checkpoints, and ``--resume PATH`` into a finished run continues in a new run
directory (:func:`fork_dir`), so what a run finished with stays as it was.
``trainer_state.pt`` holds only tensors, numbers, strings, lists and dicts, so it loads with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from packtrain.core.errors import PacktrainError
from packtrain.core.contract import CONFIG_SNAPSHOT
from packtrain.core.files import TMP_PREFIX, fsync_dir, publish_dir
from packtrain.core.hashing import sha256_file
from packtrain.core.diskfull import written
from packtrain.core.rundir import (ADAPTER_DIR, CHECKPOINT_NAME, CHECKPOINT_PREFIX, RUN_DISK_FULL_FIX, STATE_JSON,
                                   TRAINER_STATE, RunError, complete_checkpoints, finished_artifacts, is_complete,
                                   resume_checkpoint, run_dirs)
from packtrain.core.rundir import SUMMARY as _SUMMARY
from packtrain.core.faults import crash_point
from packtrain.trainer.model.adapters import check_finite_weights, load_adapter_weights, save_adapter
from packtrain.trainer.run.distributed import (full_optimizer_state, full_trainable_state, load_full_optimizer_state,
                                 sharded)
from packtrain.trainer.schedule import rates_at_restored_step

log = logging.getLogger("packtrain.train")

CHECKSUMS = "checksums.json"
# how trainer_state.pt holds the optimizer: optimizer.state_dict() of one process (parameters
# numbered), or, with train.fsdp, the full unsharded state keyed by parameter name (get_optimizer_state_dict)
LOCAL_LAYOUT, FSDP_LAYOUT = "local", "fsdp-full"
SUMMARY = _SUMMARY  # run_end.py imports it from here


class CheckpointError(PacktrainError):
    """A checkpoint is missing, corrupt or does not fit this run; the message says what to do."""


@dataclass
class TrainState:
    """The run's position: saved in state.json, restored on resume."""

    step: int = 0
    epoch: int = 0
    position: int = 0          # index of the next block in this epoch's permutation, over all ranks
    tokens: int = 0            # non-padding tokens trained on so far (all ranks)
    sup_tokens: int = 0        # supervised targets trained on so far (all ranks)
    build_id: str = ""
    tokenizer_hash: str = ""
    world_size: int = 1        # training processes (checkpoints from before it was recorded: 1)
    seq_length: int = 0        # tokens per training sequence (train.max_seq_length; 0 in checkpoints from
                               # before it was recorded: the build's block size)
    cpu_threads: int = 0       # torch's CPU threads the run trained with (0: not recorded); a resumed run
                               # with train.cpu_threads auto keeps them (trainer/threads.py)
    global_batch: int = 0      # sequences an optimizer step takes, over all ranks (0: not recorded); a resume
                               # with another one says so (trainer/run/context.py restore)


@dataclass(frozen=True)
class RunInfo:
    """What every artifact of a run is saved with."""

    run_dir: Path
    config: dict               # resolved ExpertConfig as a dict
    tokenizer_dir: Path


# ----------------------------------------------------------------------------------------------
# RNG states as plain lists/tensors (weights_only-loadable)


def rng_state() -> dict:
    version, keys, gauss = random.getstate()
    name, np_keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, list(keys), gauss],
        "numpy": [name, torch.from_numpy(np_keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys), gauss))
    name, np_keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np_keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------------------------
# Save


def save_checkpoint(run: RunInfo, state: TrainState, model, optimizer, scheduler, scaler) -> Path | None:
    """Rank 0 (or the only process) writes the checkpoint. A model sharded with FSDP is first gathered:
    then EVERY rank calls this (the gathers are collectives) and the others return None."""
    check_not_finished(run.run_dir, f"save {CHECKPOINT_PREFIX}{state.step}")
    if sharded(model):
        adapter_state = full_trainable_state(model)
        optimizer_state = full_optimizer_state(model, optimizer)
        if torch.distributed.get_rank() != 0:
            return None
    else:
        adapter_state, optimizer_state = None, optimizer.state_dict()
    final = run.run_dir / f"{CHECKPOINT_PREFIX}{state.step}"
    check_finite_weights(model, final, adapter_state)  # before anything is written
    tmp = run.run_dir / f"{TMP_PREFIX}{CHECKPOINT_PREFIX}{state.step}-{os.getpid()}"
    with written_or_removed(tmp, final, f"{CHECKPOINT_PREFIX}{state.step} of run {run.run_dir}"):
        save_adapter(model, tmp / ADAPTER_DIR, run.config, state_dict=adapter_state)
        torch.save({
            "optimizer": optimizer_state,
            "optimizer_layout": FSDP_LAYOUT if adapter_state is not None else LOCAL_LAYOUT,
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": rng_state(),
        }, tmp / TRAINER_STATE)
        (tmp / CONFIG_SNAPSHOT).write_text(json.dumps(run.config, indent=2, sort_keys=True) + "\n")
        (tmp / STATE_JSON).write_text(json.dumps(asdict(state), indent=2) + "\n")
        sums = {p.relative_to(tmp).as_posix(): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / CHECKSUMS).write_text(json.dumps(sums, indent=2, sort_keys=True) + "\n")  # covers state.json
        for path in tmp.rglob("*"):  # on disk before the rename makes the checkpoint visible
            if path.is_file():
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
        fsync_dir(tmp)
    crash_point("checkpoint_save")
    publish_dir(tmp, final, replace=True)  # a previous attempt of this very step (resumed run): replaced
    return final


class written_or_removed:
    """``with written_or_removed(tmp, final, what):`` writes into the temporary directory ``tmp``
    (created empty), which becomes ``final``; when writing fails, ``tmp`` is removed, so a full disk
    stays no fuller than before. A full disk, in any form the libraries report it (torch's zip writer,
    safetensors, OSError ENOSPC/EDQUOT: core/diskfull.py), becomes one DiskFullError naming ``final``,
    the free space and the fix; another OSError one CheckpointError."""

    def __init__(self, tmp: Path, final: Path, what: str):
        self.tmp, self.what = tmp, what
        self.guard = written(final, what, RUN_DISK_FULL_FIX, partial=[tmp])

    def __enter__(self) -> Path:
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        return self.tmp

    def __exit__(self, kind, error, tb) -> bool:
        if error is None:
            return False
        self.guard.__exit__(kind, error, tb)  # removes tmp; a full disk is raised as DiskFullError
        if isinstance(error, OSError):
            raise CheckpointError(f"cannot write {self.what} in {self.tmp.parent} ({type(error).__name__}: {error}): "
                                  "the partial files were removed; fix the directory and continue with --resume "
                                  "auto") from error
        return False  # not a disk problem: the original error goes on


def check_not_finished(run_dir: Path, action: str) -> None:
    """The one guard before anything is written into a run directory: a finished run is never touched."""
    done = finished_artifacts(run_dir)
    if done:
        raise CheckpointError(f"run {run_dir} is finished ({', '.join(done)} written): refusing to {action} there; "
                              f"continue it into a new run with --resume {run_dir}, or start a new run")


def fork_dir(finished: Path, step: int) -> Path:
    """A new run directory beside a finished run, for continuing it from its checkpoint at ``step``."""
    base = finished.with_name(f"{finished.name}-from-{step}")
    path, n = base, 1
    while True:
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            n += 1
            path = base.with_name(f"{base.name}-{n}")


def discard_later_checkpoints(run_dir: Path, step: int) -> list[Path]:
    """Resuming an older checkpoint of a run abandons the steps after it: remove the checkpoints of
    that abandoned trajectory, so ``--resume auto`` can never pick one of them later."""
    later = [p for p in complete_checkpoints(run_dir) if int(CHECKPOINT_NAME.match(p.name).group(1)) > step]
    for path in later:
        shutil.rmtree(path)
    return later


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    """Delete the oldest complete checkpoints beyond ``keep``, and stale temporary ones."""
    for stale in run_dir.glob(f"{TMP_PREFIX}{CHECKPOINT_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)
    for old in complete_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old)


# ----------------------------------------------------------------------------------------------
# Find


def find_checkpoint(resume: str, expert_runs: Path) -> Path | None:
    """``auto``: the newest complete checkpoint (highest step) of the unfinished run that most recently
    wrote one; None when no unfinished run has any. A path: that checkpoint, or the newest complete checkpoint of
    that run directory."""
    if resume == "auto":
        runs = run_dirs(expert_runs)
        done = sorted(p.name for p in runs if finished_artifacts(p))
        if done:
            log.info("resume auto: %d finished run(s) of %s are never resumed (%s)", len(done), expert_runs,
                     ", ".join(done))
        chosen = newest_resumable(expert_runs)
        if chosen is None:
            return None
    else:
        try:
            chosen = resume_checkpoint(resume)
        except RunError as e:
            raise CheckpointError(str(e)) from None
    say_incomplete_after(chosen)
    return chosen


def newest_resumable(expert_runs: Path) -> Path | None:
    """The checkpoint ``--resume auto`` takes: the newest complete one of the unfinished run that wrote a
    checkpoint last (run names need not sort by age); None when no unfinished run has one."""
    runs = [p for p in run_dirs(expert_runs) if not finished_artifacts(p)]
    newest = [found[-1] for found in map(complete_checkpoints, runs) if found]
    return max(newest, key=lambda p: ((p / STATE_JSON).stat().st_mtime_ns, p.name)) if newest else None


def say_incomplete_after(chosen: Path) -> None:
    """Warn of every ``checkpoint-<step>`` directory of the chosen checkpoint's run, past its step, that is not a
    whole checkpoint (a file of it removed or lost: a save itself is atomic): it is passed over, and replaced
    when its step is saved again (attack 52: passed over without a word)."""
    step = int(CHECKPOINT_NAME.match(chosen.name).group(1))
    for path in sorted(chosen.parent.glob(f"{CHECKPOINT_PREFIX}*")):
        named = CHECKPOINT_NAME.match(path.name)
        if named and int(named.group(1)) > step and path.is_dir() and not is_complete(path):
            missing = [name for name in (STATE_JSON, TRAINER_STATE, ADAPTER_DIR) if not (path / name).exists()]
            log.warning("resume: %s is incomplete (no %s): resuming from %s before it; it is replaced when step %s "
                        "is saved again", path, ", ".join(missing), chosen.name, named.group(1))


# ----------------------------------------------------------------------------------------------
# Load


def read_state(path: Path) -> TrainState:
    """The state of checkpoint ``path``, which must be the step its name says: ``--resume auto`` picks the
    highest name and a resume removes the checkpoints named after its step, so a checkpoint renamed or copied
    under another step's name (checkpoint-4's files as checkpoint-9) was resumed at step 4 as the newest, and
    the run's real newer checkpoints were removed as "later" ones."""
    file = path / STATE_JSON
    try:
        state = TrainState(**json.loads(file.read_text()))
        for name, value in asdict(state).items():  # each field has its default's type; counts are >= 0
            if type(value) is not type(getattr(TrainState, name)) or (type(value) is int and value < 0):
                raise TypeError(f"field {name} is {value!r}, expected {type(getattr(TrainState, name)).__name__}"
                                + (" >= 0" if type(getattr(TrainState, name)) is int else ""))
    except (OSError, ValueError, TypeError, RecursionError) as e:  # ValueError: not JSON, not UTF-8, or an int past 4,300 digits
        raise CheckpointError(f"checkpoint file {file} is corrupt ({e}); resume from another checkpoint "
                              "with --resume PATH or start a new run") from None
    named = CHECKPOINT_NAME.match(path.name)
    if named is not None and int(named.group(1)) != state.step:
        right = path.with_name(f"{CHECKPOINT_PREFIX}{state.step}")
        raise CheckpointError(f"checkpoint {path} holds step {state.step} (its {STATE_JSON}), not the step its name "
                              f"says: it was renamed or copied under another name; rename it to {right.name}"
                              f"{' (that name is taken: remove one of them)' if right.exists() else ''}, or remove it, "
                              "and resume again")
    return state


def verify_checkpoint(path: Path) -> None:
    """Every file of the checkpoint against its sha256 in checksums.json; the error names each bad file."""
    file = path / CHECKSUMS
    try:
        sums = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        sums = f"{type(e).__name__}: {e}"
    if not isinstance(sums, dict) or not sums:
        raise CheckpointError(f"checkpoint file {file} is missing or corrupt ({sums}); resume from another "
                              "checkpoint with --resume PATH or start a new run")
    outside = [name for name in sorted(sums) if name.startswith("/") or "\\" in name or "\0" in name
               or any(part in ("", ".", "..") for part in name.split("/"))]
    if outside:  # never read a file outside the checkpoint through a name in it
        raise CheckpointError(f"checkpoint file {file} is corrupt (it names {outside[0]!r}, not a file inside the "
                              "checkpoint); resume from another checkpoint with --resume PATH or start a new run")
    if STATE_JSON not in sums:
        raise CheckpointError(f"checkpoint file {file} does not cover {STATE_JSON} (the data position cannot be "
                              "trusted); resume from another checkpoint with --resume PATH or start a new run")
    bad = [f"{path / name} ({'missing' if not (path / name).is_file() else 'sha256 differs'})"
           for name, digest in sorted(sums.items())
           if not (path / name).is_file() or sha256_file(path / name) != digest]
    if bad:
        raise CheckpointError(f"checkpoint {path} is corrupt: {', '.join(bad)} do not match {CHECKSUMS}; resume "
                              "from another checkpoint with --resume PATH or start a new run")


def load_checkpoint(path: Path, model, optimizer, scheduler, scaler) -> None:
    """Restore adapter weights, optimizer, scheduler, scaler and RNG states (RNG last). A model sharded
    with FSDP: every rank calls this and reads the same files (each keeps its shards)."""
    try:
        load_adapter_weights(model, path / ADAPTER_DIR)
    except (RuntimeError, ValueError) as e:
        raise CheckpointError(str(e)) from None
    file = path / TRAINER_STATE
    try:
        blob = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle/zip errors of a truncated or foreign file
        raise CheckpointError(f"checkpoint file {file} cannot be loaded ({type(e).__name__}: {e}); it is corrupt. "
                              "Resume from another checkpoint with --resume PATH or start a new run") from None
    layout = blob.get("optimizer_layout", LOCAL_LAYOUT) if isinstance(blob, dict) else LOCAL_LAYOUT
    ours = FSDP_LAYOUT if sharded(model) else LOCAL_LAYOUT
    if layout != ours:
        raise CheckpointError(f"checkpoint {path} was taken with train.fsdp {str(layout == FSDP_LAYOUT).lower()}, "
                              f"this run has train.fsdp {str(ours == FSDP_LAYOUT).lower()}: the optimizer state is "
                              "stored differently; resume with the setting it was taken with")
    try:
        if ours == FSDP_LAYOUT:
            load_full_optimizer_state(model, optimizer, blob["optimizer"])
        else:
            optimizer.load_state_dict(blob["optimizer"])
        scheduler.load_state_dict(blob["scheduler"])
        rates_at_restored_step(scheduler)  # this run's schedule, which a resume may have changed
        if scaler is not None and blob["scaler"] is not None:
            scaler.load_state_dict(blob["scaler"])
        set_rng_state(blob["rng"])
    except (KeyError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint file {file} does not fit this run ({e}): it was written by another "
                              "optimizer or lora setup; resume with the settings it was taken with") from None
