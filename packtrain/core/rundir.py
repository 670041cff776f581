"""A run directory, ``<output_dir>/<expert>/<run>/``: the names of what the trainer writes there,
and its read side, the one place that finds runs and reads their ``run.json`` (:class:`RunRecord`)
for ``status``, ``rebuild``, ``plot``, ``eval`` and the trainer's ``--resume auto`` (which build a
run trained on, whether it finished, which run is the newest); and the record beside the builds
(``cache/<expert>/.runs/``) of where an expert's runs live.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from packtrain.core.errors import PacktrainError
from packtrain.core.contract import expert_dir
from packtrain.core.files import write_atomic
from packtrain.core.inputs import read_json
from packtrain.core import hints

RUNS_RECORD = ".runs"

RUN_JSON = "run.json"  # written at the start: {"build_id", model, device, precision, ...}: RunRecord
METRICS = "metrics.jsonl"  # one line per step and evaluation
SUMMARY = "summary.json"  # written at the end
ADAPTER_DIR = "adapter"  # the final adapter
MERGED_DIR = "merged"  # the merged model (train.merge_adapter)
FINAL_ARTIFACTS = (SUMMARY, ADAPTER_DIR, MERGED_DIR)  # any of them: the run is finished, never written again
CHECKPOINT_PREFIX = "checkpoint-"  # checkpoint-<step>/
STATE_JSON = "state.json"  # in a checkpoint: step, data position, {"build_id", ...}
TRAINER_STATE = "trainer_state.pt"  # in a checkpoint: optimizer, scheduler, RNG states
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)$")
# what to do when a write into a run directory finds the disk full (core/diskfull.py)
RUN_DISK_FULL_FIX = "free space (or set train.output_dir elsewhere) and continue with --resume auto"


class RunError(PacktrainError):
    """A run directory named on the command line (or the newest one looked for) is not usable; the
    message says which and what to do. Raised before any model is loaded."""


@dataclass(frozen=True)
class RunRecord:
    """What ``run.json`` says about a run that the commands reading it use (the trainer writes it at the
    start of the run: trainer/run/train.py; every field: docs/TRAINING.md)."""

    run_dir: Path
    build_id: str | None
    build_dir: str | None
    device: str | None
    tokenizer_hash: str | None = None  # the build's tokenizer: what the base's must still be to load the adapter

    @classmethod
    def read(cls, run_dir: Path) -> "RunRecord | None":
        """The run's record; None when run.json is missing or damaged (not a JSON object): a damaged
        record names no build and no device. A field of the wrong type reads as None."""
        try:
            return cls.from_dict(run_dir, json_object(run_dir / RUN_JSON))
        except (OSError, ValueError, TypeError, RecursionError):
            return None

    @classmethod
    def load(cls, run_dir: Path, fix: str) -> "RunRecord":
        """The record of a run a command works on (``packtrain eval``): a missing or damaged run.json is an
        InputError, ``<run.json> cannot be read as a run record (<why>): <fix>``."""
        return cls.from_dict(run_dir, read_json(run_dir / RUN_JSON, fix, "a run record"))

    @classmethod
    def from_dict(cls, run_dir: Path, data: dict) -> "RunRecord":
        text = {name: data.get(name) if isinstance(data.get(name), str) else None
                for name in ("build_id", "build_dir", "device", "tokenizer_hash")}
        return cls(run_dir, **text)


def json_object(path: Path) -> dict:
    """``path`` (a run.json, or a checkpoint's state.json) parsed; OSError, ValueError (not UTF-8 or not
    JSON), RecursionError, or TypeError where its top level is not an object."""
    data = json.loads(path.read_bytes().decode("utf-8"))
    if not isinstance(data, dict):
        raise TypeError(f"the top level is {type(data).__name__}, expected an object")
    return data


def recorded_build_id(path: Path) -> object:
    """What the ``build_id`` field of ``path`` (a run's run.json, or a checkpoint's state.json) holds; where
    the file has none (missing, damaged, no such field), the error as ``"<type>: <message>"``. The caller
    checks that it is a build id (pipeline/orchestrate/rebuild.py: retention protects the build a run needs)."""
    try:
        return json_object(path)["build_id"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        return f"{type(e).__name__}: {e}"


def unfinished_run_records(runs_dir: Path) -> list[Path]:
    """The run.json of every run under ``runs_dir`` that has no summary.json (running, stopped or killed)."""
    return [info for info in runs_dir.glob(f"*/{RUN_JSON}") if not (info.parent / SUMMARY).exists()]


def run_dirs(expert_runs: Path) -> list[Path]:
    """Every run directory of an expert (``<output_dir>/<expert>/<run>/``), finished or not."""
    return [p for p in expert_runs.iterdir() if p.is_dir()] if expert_runs.is_dir() else []


def run_records(runs_dirs: list[Path]) -> list[RunRecord]:
    """The readable run.json of every run under any of ``runs_dirs`` (each directory looked at once)."""
    records = (RunRecord.read(info.parent) for runs in dict.fromkeys(runs_dirs) for info in runs.glob(f"*/{RUN_JSON}"))
    return [record for record in records if record is not None]


def last_run(runs_dirs: list[Path], build_id: str) -> Path | None:
    """The run (under any of ``runs_dirs``) whose run.json names ``build_id`` and was written last."""
    runs = [((r.run_dir / RUN_JSON).stat().st_mtime_ns, r.run_dir) for r in run_records(runs_dirs)
            if r.build_id == build_id]
    return max(runs)[1] if runs else None


def newest_logged_run(expert_runs: Path) -> Path | None:
    """The run whose metrics.jsonl was written last, finished or not (``packtrain plot``'s default)."""
    logs = sorted(expert_runs.glob(f"*/{METRICS}"), key=lambda p: p.stat().st_mtime_ns)
    return logs[-1].parent if logs else None


def finished_artifacts(run_dir: Path) -> list[str]:
    """The final artifacts the run has written (empty while it is unfinished: running, stopped or killed)."""
    return [name for name in FINAL_ARTIFACTS if (run_dir / name).exists()]


def is_complete(path: Path) -> bool:
    """``path`` is a whole checkpoint (``checkpoint-<step>/`` with its state, trainer state and adapter)."""
    return (CHECKPOINT_NAME.match(path.name) is not None and (path / STATE_JSON).is_file()
            and (path / TRAINER_STATE).is_file() and (path / ADAPTER_DIR).is_dir())


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The run's complete checkpoints, oldest first (temporary directories are ignored)."""
    found = [p for p in run_dir.glob(f"{CHECKPOINT_PREFIX}*") if p.is_dir() and is_complete(p)]
    return sorted(found, key=lambda p: int(CHECKPOINT_NAME.match(p.name).group(1)))


def resume_checkpoint(resume: str) -> Path:
    """The checkpoint ``--resume PATH`` names: PATH itself when it is a complete checkpoint, else the
    newest complete checkpoint of the run directory PATH (checked before the trainer is imported, and
    by the trainer)."""
    path = Path(resume).expanduser()
    if not path.exists():
        raise RunError(f"--resume {resume}: {path} does not exist; name a checkpoint-<step>/ directory or a run "
                       "directory holding one, or use --resume auto")
    if is_complete(path):
        return path
    found = complete_checkpoints(path) if path.is_dir() else []
    if not found:
        raise RunError(f"--resume {resume}: no complete checkpoint there (a checkpoint-<step>/ directory with "
                       f"{STATE_JSON}, {TRAINER_STATE} and {ADAPTER_DIR}/, or a run directory holding one); "
                       "use --resume auto to take the newest one")
    return found[-1]


def newest_finished_run(expert_runs: Path) -> Path | None:
    """The run that finished last (summary.json and adapter/ written); None when there is none."""
    runs = [p for p in run_dirs(expert_runs) if (p / SUMMARY).is_file() and (p / ADAPTER_DIR).is_dir()]
    return max(runs, key=lambda p: ((p / SUMMARY).stat().st_mtime_ns, p.name), default=None)


def find_run(expert: str, run: str | None, output_dir: str | os.PathLike) -> Path:
    """``run`` when given (a finished run of ``expert``), else the expert's newest finished run under
    ``output_dir`` (``packtrain eval``: checked before the trainer, and torch, is imported)."""
    if run is not None:
        path = Path(run)
        if not path.is_dir():
            problem = "is a file, not a run directory" if path.exists() else "does not exist"
            raise RunError(f"--run {path} {problem}: name a run directory (runs/{expert}/<run>) with --run")
        if not (path / SUMMARY).is_file():
            raise RunError(f"--run {path} is not a finished run (no {SUMMARY}): finish it with "
                           f"{hints.command('train', expert, resume=str(path))}, or name another run with --run")
        if not (path / ADAPTER_DIR).is_dir():
            raise RunError(f"--run {path} has no {ADAPTER_DIR}/ (moved or deleted): put it back, or name another "
                           "run with --run")
        return path
    found = newest_finished_run(Path(output_dir) / expert)
    if found is None:
        raise RunError(f"expert {expert!r} has no finished run under {Path(output_dir) / expert}: train it "
                       f"({hints.command('train', expert)}), or name a run directory with --run")
    return found


def record_runs_dir(cache_dir: str | os.PathLike, expert: str, runs_dir: str | os.PathLike) -> None:
    """Remember, beside the builds, the absolute directory of ``expert``'s runs
    (``cache/<expert>/.runs/<hash>`` holds the path), so that retention protects the builds their
    checkpoints need whatever directory it runs from. One file per runs directory: no read-modify-write."""
    path = str(Path(runs_dir).absolute())
    directory = expert_dir(cache_dir, expert) / RUNS_RECORD
    entry = directory / hashlib.sha256(path.encode()).hexdigest()[:16]
    if entry.is_file():
        return
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(entry, path + "\n", f"the record of where {expert}'s runs live", "free space in the cache")


def recorded_runs_dirs(cache_dir: str | os.PathLike, expert: str) -> list[Path]:
    """Every runs directory :func:`record_runs_dir` recorded for ``expert`` (absolute paths)."""
    dirs = []
    for entry in sorted((expert_dir(cache_dir, expert) / RUNS_RECORD).glob("*")):
        if entry.name.startswith("."):
            continue
        try:
            path = Path(entry.read_text(encoding="utf-8").strip())
        except (OSError, UnicodeDecodeError):
            continue  # unreadable: it names no directory
        if path.is_absolute():
            dirs.append(path)
    return dirs
