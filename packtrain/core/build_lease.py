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
protects nothing for ever. Its file is ``cache/<expert>/.in-use/<build id>``. The trainer locks it, then
looks again whether the build is still there: a prune that held it first has removed the build and its
lease file by then, and the trainer says so (or, on CURRENT, takes the build CURRENT names now).
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
        longer there once leased (a prune removed it first): nothing is then held."""
        key = Path(os.path.abspath(build_dir))
        if key in self.held:
            return True
        if fcntl is None:
            return True
        path = lease_path(key)
        path.parent.mkdir(exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except BaseException:
            os.close(fd)
            raise
        if not (key / MANIFEST).is_file():
            os.close(fd)
            return False
        self.held[key] = fd
        return True

    def release(self) -> None:
        while self.held:
            os.close(self.held.popitem()[1])  # releases the flock; the file stays for the next holder


@contextlib.contextmanager
def unleased(build_dir: Path) -> Iterator[bool]:
    """For a prune: True (and the build's lease held exclusively for the ``with`` body, so no trainer takes
    it meanwhile) when no process holds a lease on ``build_dir``; False when one does (the build is in use).
    The lease file is removed with the build by the body: a trainer that opened it meanwhile finds the
    build gone once it locks it."""
    if fcntl is None:
        yield True
        return
    path = lease_path(build_dir)
    path.parent.mkdir(exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)  # created when never leased: a trainer leasing now waits
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def remove_lease(build_dir: Path) -> None:
    """The lease file of a removed build (inside :func:`unleased`'s body, after the build)."""
    with contextlib.suppress(FileNotFoundError):
        lease_path(build_dir).unlink()
