"""A build in use: the lease a training process holds on the build it trains on, so no prune removes it.

``rebuild --keep`` protected a running run's build only through the run's ``run.json``, which the trainer
writes once the model is loaded (tens of seconds, minutes for a large base, after it chose the build): a
rebuild that published a newer build meanwhile pruned the one the run was about to read (attack 53). The
trainer now holds a lease on its build from the moment it resolves it to the run's end
(trainer/run/train.py); ``rebuild``'s prune removes no build whose lease is held
(pipeline/orchestrate/rebuild.py).

The lease is an OS file lock (``flock``), as the run and build locks are (core/run_lock.py): shared by
every process that trains on the build (each rank of a torchrun), taken exclusively, without waiting, by
the prune of that build; the kernel releases it when its holder dies, however it dies, so a killed run
protects nothing for ever. Its file is ``cache/<expert>/.in-use/<build id>``. The trainer locks it, keeps
the lock only where the path still names the file it locked (a prune that held it first has removed that
file: the one there now is locked instead), then looks again whether the build is still there: a prune that
held it first has removed the build by then, and the trainer says so (or, on CURRENT, takes the build
CURRENT names now), leaving no lease file for a build that is gone.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from packtrain.core.contract import MANIFEST

try:
    import fcntl
except ImportError:  # not POSIX: no leases (packtrain runs on Linux and macOS)
    fcntl = None

LEASES = ".in-use"  # cache/<expert>/.in-use/<build id>: the lease files


def lease_path(build_dir: Path) -> Path:
    return Path(build_dir).parent / LEASES / Path(build_dir).name


class BuildLeases:
    """The builds one process trains on, each leased once (:meth:`hold`), all let go at the end (:meth:`release`)."""

    def __init__(self):
        self.held: dict[Path, int] = {}

    def hold(self, build_dir: Path) -> bool:
        """Hold a shared lease on ``build_dir`` (waits while a prune of it runs); False when the build is no
        longer there once leased (a prune removed it first): nothing is then held, and no lease file is left
        for it."""
        key = Path(os.path.abspath(build_dir))
        if key in self.held:
            return True
        if fcntl is None:
            return True
        if not (key / MANIFEST).is_file():  # gone already: no lease file made for it
            return False
        path = lease_path(key)
        path.parent.mkdir(exist_ok=True)
        fd = _locked(path, fcntl.LOCK_SH)
        if not (key / MANIFEST).is_file():
            _drop(fd, path)
            return False
        self.held[key] = fd
        return True

    def release(self) -> None:
        while self.held:
            os.close(self.held.popitem()[1])  # releases the flock; the file stays for the next holder


def _locked(path: Path, operation: int) -> int:
    """A descriptor of ``path`` (created where missing) locked with ``operation``, on the file the path names
    once the lock is granted: a prune removes a build's lease file while it holds it, so a lock granted on the
    file it removed protects nothing (the next prune makes a new one); that file is let go, and the one there
    now locked (filelock's check). ``BlockingIOError`` from a non-blocking ``operation`` refused."""
    while True:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, operation)
            if _names(path, fd):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` names the file open as ``fd``."""
    try:
        there = os.stat(path)
    except FileNotFoundError:
        return False
    here = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino)


def _drop(fd: int, path: Path) -> None:
    """Close ``fd``, a shared lease on a build that is gone, removing its lease file where no other process
    holds it (taken exclusively first: nobody waits on a file removed under them unseen, see :func:`_locked`)."""
    try:
        with contextlib.suppress(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _names(path, fd):
                path.unlink()
    finally:
        os.close(fd)


@contextlib.contextmanager
def unleased(build_dir: Path) -> Iterator[bool]:
    """For a prune: True (and the build's lease held exclusively for the ``with`` body, so no trainer takes
    it meanwhile) when no process holds a lease on ``build_dir``; False when one does (the build is in use).
    The lease file is removed with the build by the body: a trainer that opened it meanwhile finds it removed
    once it locks it, and the build gone."""
    if fcntl is None:
        yield True
        return
    path = lease_path(build_dir)
    path.parent.mkdir(exist_ok=True)
    try:  # created when never leased: a trainer leasing now waits
        fd = _locked(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        yield False
        return
    try:
        yield True
    finally:
        os.close(fd)


def remove_lease(build_dir: Path) -> None:
    """The lease file of a removed build (inside :func:`unleased`'s body, after the build)."""
    with contextlib.suppress(FileNotFoundError):
        lease_path(build_dir).unlink()
