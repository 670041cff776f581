"""What the test processes of one ``pytest`` run make once and share: the real tokenizers
(tests/real_tokenizers.py: converting Qwen2's ranks or SmolLM2's GGUF takes 5-8 s of CPU) and the
fast-encoder decision for each tokenizer content (tests/build_fixtures.py: a proof of 1-7 s).

Under pytest-xdist each worker is a process of its own; without this each one made them again. The
run's shared directory is the parent of the workers' temporary directories (pytest-xdist's recipe,
https://pytest-xdist.readthedocs.io/en/stable/how-to.html#making-session-scoped-fixtures-execute-only-once);
in a run without workers it is the run's own temporary directory, so nothing outlives a run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

from filelock import FileLock

_ROOT: list[Path] = []  # set once per test process by tests/conftest.py


def set_root(base_temp: Path) -> None:
    """Called with the process's pytest base temporary directory (``tmp_path_factory.getbasetemp()``)."""
    root = base_temp.parent if os.environ.get("PYTEST_XDIST_WORKER") else base_temp
    _ROOT[:] = [root / "run-shared"]


def made_once(name: str, make: Callable[[Path], object]) -> Path:
    """The directory ``name`` of this run's shared directory, filled by ``make(directory)`` in the
    first test process that asks; the others wait for it under a file lock, then read it. ``make``
    writes into a temporary directory that is renamed when it is done: a process killed mid-way
    leaves no half-made directory to the next."""
    if not _ROOT:
        raise RuntimeError("tests/run_shared.set_root was not called (tests/conftest.py calls it)")
    root = _ROOT[0]
    root.mkdir(parents=True, exist_ok=True)
    done = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not done.is_dir():
            making = root / f"{name}.making-{os.getpid()}"
            shutil.rmtree(making, ignore_errors=True)
            making.mkdir()
            make(making)
            making.rename(done)
    return done
