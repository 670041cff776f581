"""The one way packtrain replaces a file: never half written, whatever happens.

:func:`write_atomic` writes a temporary file in the same directory (``.tmp-<name>-<pid>-<random>``: the
build's leftover cleaning removes the ones a killed process left in the cache), fsyncs it, renames
it over the target and fsyncs the directory, so that a crash leaves the old file or the new one,
never part of either (the name also carries a random part: two threads of one process writing the
same file each write their own). A failure removes the temporary file; a full disk becomes one
:class:`~packtrain.core.diskfull.DiskFullError` line naming the file and the fix (core/diskfull.py).

Directories (a build, a checkpoint, a source's tokens, a run's final adapter, a converted model) are
published the same way by their writers: built under a temporary name, then :func:`publish_dir`
fsyncs every file and directory in it (so no writer, nor a library writing for it, has to), renames
it onto the final one and fsyncs the parent; a rename that fails removes the temporary directory and
is one line naming the cause and the fix. :func:`publishing` does it all for a directory that must
not replace anything (``packtrain export --out``). A file that must
not replace anything (``eval.json``: an evaluation is never overwritten) is written by :func:`write_new`.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from packtrain.core.diskfull import remove_partial, written

TMP_PREFIX = ".tmp-"


def write_atomic(path: str | os.PathLike, data: str | bytes, what: str | None = None, fix: str = "") -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8) atomically. ``what``/``fix``: the file
    and the remedy a full disk's one-line error names; ``what`` None: the error goes on as it was (for a
    writer inside a caller's ``written`` block, whose message names the larger thing being written)."""
    with replacing(path, what, fix) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)


@contextmanager
def replacing(path: str | os.PathLike, what: str | None = None, fix: str = "") -> Iterator[Path]:
    """``with replacing(path, what, fix) as tmp:`` the block writes the temporary file ``tmp`` (a library
    that wants a path: ``fig.savefig(tmp)``); then it is fsynced and renamed over ``path``, and the
    directory fsynced. A failure removes ``tmp``; ``what``/``fix``: as for :func:`write_atomic`."""
    path = Path(path)
    tmp = temporary_path(path)  # unique per write: two threads of one process may replace one file
    _WRITING.add(os.path.realpath(tmp))
    try:
        with written(path, what, fix, partial=[tmp]) if what is not None else _removed_on_failure(tmp):
            yield tmp
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
    finally:
        _WRITING.discard(os.path.realpath(tmp))
    fsync_dir(path.parent)


def write_new(path: str | os.PathLike, data: str | bytes, what: str | None = None, fix: str = "") -> None:
    """Create ``path``, which must not exist yet, with ``data`` (text is written as UTF-8): the temporary
    file is written, fsynced and hard-linked to ``path``, which refuses an existing name, so of two
    writers at once the second gets ``FileExistsError`` and the first one's file stays whole. The
    temporary file (a new name, :func:`temporary_path`, created here: never a killed writer's, which
    may still be a second name of its published file) is removed either way; ``what``/``fix``: as for
    :func:`write_atomic`."""
    path = Path(path)
    tmp = temporary_path(path)
    try:
        with written(path, what, fix, partial=[tmp]) if what is not None else _removed_on_failure(tmp):
            with open(tmp, "xb") as f:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
                f.flush()
                os.fsync(f.fileno())
        os.link(tmp, path)
    finally:
        remove_partial([tmp])
    fsync_dir(path.parent)


@contextmanager
def publishing(path: str | os.PathLike, what: str, fix: str) -> Iterator[Path]:
    """``with publishing(directory, what, fix) as tmp:`` the block fills the new directory ``tmp``
    (``.tmp-<name>-<pid>`` beside ``directory``); then its files are fsynced and it is renamed onto
    ``directory``, which may be an empty directory but nothing more (the rename refuses a non-empty
    one), and the parent fsynced. A failure removes ``tmp``, so a writer that fails, or is killed, leaves
    nothing under the final name; ``what``/``fix``: as for :func:`write_atomic`."""
    path = Path(path)
    tmp = path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}")
    with written(path, what, fix, partial=[tmp]):
        shutil.rmtree(tmp, ignore_errors=True)  # left by a killed writer of this very pid
        tmp.mkdir(parents=True)
        yield tmp
        publish_dir(tmp, path)


def temporary_path(path: str | os.PathLike) -> Path:
    """A new name beside ``path`` to build it under: ``.tmp-<name>-<pid>-<random>``, unique even where
    pids repeat (a pod restarted after its part was killed is pid 1 again; two nodes on shared storage)."""
    path = Path(path)
    return path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}-{secrets.token_hex(4)}")


def writer_pid(tmp: str | os.PathLike) -> int | None:
    """The pid in a temporary name (:func:`temporary_path`'s ``.tmp-<name>-<pid>-<8 hex>``, or
    ``.tmp-<name>-<pid>``), None where there is none. The random part is read first: it may be all
    digits (2.3% of them are), and a pid never has 8 (Linux's pid_max is at most 4,194,304).

    >>> writer_pid(".tmp-facts.json-4242-0a1b2c3d"), writer_pid(".tmp-facts.json-4242-20251127")
    (4242, 4242)
    >>> writer_pid(".tmp-build-17"), writer_pid(".tmp-x-y"), writer_pid(".tmp-x-12-0a1b2c3g")
    (17, None, None)
    """
    parts = Path(tmp).name.split("-")
    if len(parts) >= 4 and parts[-2].isdigit() and len(parts[-1]) == 8 and all(c in HEX for c in parts[-1]):
        return int(parts[-2])
    if len(parts) >= 3 and parts[-1].isdigit() and len(parts[-1]) < 8:
        return int(parts[-1])
    return None


HEX = frozenset("0123456789abcdef")

_WRITING: set[str] = set()
"""The temporary files this process is writing now (:func:`replacing`), whichever thread writes them."""


def being_written(tmp: str | os.PathLike) -> bool:
    """Whether this process is writing the temporary file ``tmp`` now: a name with this process's pid
    is another thread's write in progress, or a leftover (a write killed with the process whose pid
    this one has again: a container's command is pid 1 each time)."""
    return os.path.realpath(tmp) in _WRITING


def publish_dir(tmp: str | os.PathLike, path: str | os.PathLike, replace: bool = False) -> None:
    """The last step of every directory publish: make the complete temporary directory ``tmp`` durable
    (every file, then every directory, deepest first: what a library wrote into it may be in no
    disk's hands yet), rename it onto ``path`` and fsync the parent. ``replace``: whatever is at
    ``path`` (a damaged source cache, an earlier attempt of the same checkpoint) is removed first;
    otherwise the rename refuses anything there but an empty directory. A rename that fails removes
    ``tmp`` and raises :class:`PublishError`, one line naming ``path``, the cause and the fix."""
    path = Path(path)
    fsync_tree(tmp)
    if replace and os.path.lexists(path):
        remove_path(path)
    try:
        os.rename(tmp, path)
    except OSError as e:
        remove_partial([tmp])
        raise PublishError(e.errno, f"cannot publish {path}: {rename_problem(e, path)} (the new copy was removed)"
                           ) from e
    fsync_dir(path.parent)


class PublishError(OSError):
    """A directory that could not be renamed into place (its ``errno`` kept); ``str()``: the one line."""

    def __str__(self) -> str:
        return self.strerror


def rename_problem(error: OSError, path: Path) -> str:
    """Why renaming a temporary directory onto ``path`` failed, and what to do."""
    if error.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
        return "it exists and is not empty, and is not replaced: remove it or choose another name"
    if error.errno in (errno.EXDEV, errno.EBUSY):
        return ("the new copy is on another file system than it (a mount point at the destination?): a directory "
                "is published by a rename, which needs one file system")
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{error.strerror.lower()}: make {path.parent} writable by this user"
    return error.strerror or type(error).__name__


def fsync_tree(directory: str | os.PathLike) -> None:
    """fsync every file and directory under ``directory`` and ``directory`` itself, deepest first (a
    directory after its entries), files in name order."""
    for parent, _, files in os.walk(directory, topdown=False):
        for name in sorted(files):
            if os.path.islink(os.path.join(parent, name)):  # its target is not part of the publish
                continue
            with open(os.path.join(parent, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(parent)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (the writer a temporary name or a holder file names)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive: another user's
        pass
    return True


def writer_alive(tmp: str | os.PathLike) -> bool:
    """Whether the process named in a temporary file's name (:func:`writer_pid`) still writes it:
    another process that runs on this machine, or this one where one of its threads is writing that
    file now (two builds of one expert in one process); a file with this pid that nobody here writes
    is a leftover of a killed process whose pid this one has again (a container's pid 1)."""
    pid = writer_pid(tmp)
    if pid is None:
        return False
    return being_written(tmp) if pid == os.getpid() else process_alive(pid)


def remove_path(path: str | os.PathLike) -> None:
    """Remove a directory tree, a file or a link (a damaged cache may be any of them; a link is removed
    itself, never followed)."""
    path = Path(path)
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


@contextmanager
def _removed_on_failure(tmp: Path) -> Iterator[None]:
    try:
        yield
    except BaseException:
        remove_partial([tmp])
        raise


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename (or a new file) in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
