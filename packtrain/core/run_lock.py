"""One process per run directory: the run lock (``<run>/.lock``), held while a run trains or resumes.

Two ``train --resume auto`` started together on one run both resumed it (the loser died on the other's
temporary checkpoint, metrics.jsonl recorded its steps twice). The trainer's main rank now holds the
run's lock from the moment it picks the run (a checkpoint to resume, or a new run directory) to the
run's end (trainer/run/train.py); a second process is refused in one line naming the holder (pid, host)
and the run directory (:class:`RunLocked`). It refuses rather than waits: what it would resume is what
the first one is changing.

The lock is an OS file lock (``flock``), as the build's (pipeline/orchestrate/build_lock.py): the kernel releases it
when its holder dies, however it dies. The file holds its holder's pid, host and start time, as a name
for the refused; it is removed at release, so a run directory holds no lock file once its process ended,
and a file left behind by a killed holder is taken over with one line saying so (``on_stale``). A
process that opened the file just before its holder removed it finds, once locked, that the path is
no longer its file, and tries again on the new one.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Callable

from packtrain.core.errors import PacktrainError
from packtrain.core.files import process_alive

try:
    import fcntl
except ImportError:  # not POSIX: no run lock (packtrain runs on Linux and macOS)
    fcntl = None

RUN_LOCK = ".lock"

_HELD_FDS: set[int] = set()  # the lock files this process holds open


def _close_in_child() -> None:
    """A forked child (a DataLoader worker) does not keep its parent's run locks: its copy of the file
    descriptor would hold the lock after the parent died, until the child noticed."""
    for fd in _HELD_FDS:
        with contextlib.suppress(OSError):
            os.close(fd)  # the parent's lock stays: closing one copy of an flock'd file does not release it
    _HELD_FDS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


class RunLocked(PacktrainError):
    """Another process trains (or resumes) the run directory; the message names it and the directory."""


class RunLock:
    """The lock of one run directory, held by this process (:meth:`acquire`, :meth:`release`)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / RUN_LOCK
        self.fd: int | None = None

    def acquire(self, on_stale: Callable[[str], None] | None = None) -> "RunLock":
        """Hold the lock, or raise :class:`RunLocked` naming its holder. ``on_stale(line)``: called when the
        file names a holder that no longer holds it (killed before it could remove the file)."""
        if fcntl is None or self.fd is not None:
            return self
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = read_holder(fd)
                os.close(fd)
                raise RunLocked(held_line(self.run_dir, holder)) from None
            except BaseException:
                os.close(fd)
                raise
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:  # its holder removed it as it released it: lock the new one
                same = False
            if same:
                break
            os.close(fd)
        left = read_holder(fd)
        if left and on_stale is not None:
            on_stale(stale_line(self.run_dir, left))
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder_record()) + "\n").encode(), 0)
        self.fd = fd
        _HELD_FDS.add(fd)
        return self

    def release(self) -> None:
        """Remove the file and let go (in that order: no process locks a file nobody will remove)."""
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        _HELD_FDS.discard(self.fd)
        os.close(self.fd)  # releases the flock
        self.fd = None


def holder_record() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def read_holder(fd: int) -> dict:
    """What the lock file says of its holder ({} where it says nothing readable)."""
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe(holder: dict) -> str:
    pid, host = holder.get("pid"), holder.get("host")
    if not isinstance(pid, int):
        return "another process (its pid is not known)"
    return f"process {pid} on {host}" + (f" (since {holder['since']})" if holder.get("since") else "")


def held_line(run_dir: Path, holder: dict) -> str:
    """``run directory X is in use: process 123 on host (since ...) trains it (lock X/.lock); ...``"""
    return (f"run directory {run_dir} is in use: {describe(holder)} trains it (lock {run_dir / RUN_LOCK}); one "
            f"process per run: wait for that one to end (or stop it), then continue with --resume auto")


def stale_line(run_dir: Path, holder: dict) -> str:
    here = holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int)
    gone = "which is gone" if here and not process_alive(holder["pid"]) else "which no longer holds it"
    return f"run directory {run_dir}: taking over the lock {run_dir / RUN_LOCK} of {describe(holder)}, {gone}"


class RunLocks:
    """The run directories one training process holds (its main rank: trainer/run/train.py), each locked once
    (:meth:`hold`), all released at the run's end (:meth:`release`)."""

    def __init__(self, on_stale: Callable[[str], None] | None = None):
        self.on_stale = on_stale
        self.held: dict[Path, RunLock] = {}

    def hold(self, run_dir: Path) -> Path:
        """Lock ``run_dir`` (raises :class:`RunLocked` when another process holds it); returns it."""
        key = Path(os.path.abspath(run_dir))
        if key not in self.held:
            self.held[key] = RunLock(run_dir).acquire(self.on_stale)
        return run_dir

    def release(self) -> None:
        while self.held:
            self.held.popitem()[1].release()
