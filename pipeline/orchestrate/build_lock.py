"""The expert's build lock (``cache/<expert>/.lock``): one builder, merger or pruner at a time.

A process that has to wait says so, once, before it waits: the lock's path and the pid of the
process that holds it (written beside the lock, in ``.lock.holder``, by whoever holds it), then it
waits as long as that one takes. The lock itself is an OS file lock (released when its holder dies);
the holder file is only a name for it, trusted only while that pid is alive.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from filelock import FileLock, Timeout

from packtrain.core.contract import LOCK
from packtrain.core.files import process_alive

HOLDER = LOCK + ".holder"


@contextlib.contextmanager
def expert_lock(root: Path, log):
    """Hold ``root/.lock`` for the ``with`` body; ``log`` gets one line if another process holds it."""
    path = Path(root) / LOCK
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log(waiting_line(path))
        lock.acquire()
    holder = Path(root) / HOLDER
    try:
        with contextlib.suppress(OSError):  # a name for waiters only: the lock holds without it
            holder.write_text(f"{os.getpid()}\n")
        yield
    finally:
        with contextlib.suppress(OSError):
            holder.unlink()
        lock.release()


def waiting_line(path: Path) -> str:
    pid = holder_pid(path.parent / HOLDER)
    who = f"process {pid}" if pid is not None else "another process (its pid is not known)"
    return f"waiting for the build lock {path}, held by {who}: another build of this expert is running"


def holder_pid(path: Path) -> int | None:
    """The pid written in the holder file, where that process is alive; else None."""
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):  # no file, or a torn one
        return None
    return pid if pid > 0 and process_alive(pid) else None  # else its writer is gone
