"""A full disk, in every form the libraries report it, as one line; and nothing half-written left.

Every writer of packtrain (build spills, shards, manifest and report; CURRENT; checkpoints, adapters,
merged models, summary, metrics, eval files, plots) writes inside ``with written(target, what, fix,
partial=...)``. When the block fails, the ``partial`` paths (temporary files or directories, never
anything complete) are removed, whatever the failure; when the failure is a full disk, it becomes
one :class:`DiskFullError` line naming ``target``, the free space of its device and the fix::

    no space left on the device of runs/sql/r/checkpoint-2 (1.4 MiB free) while writing checkpoint-2
    of run runs/sql/r: the partial files were removed; free space (or set train.output_dir elsewhere)
    and continue with --resume auto

A full disk (or quota) reaches Python in these forms, all recognised by :func:`is_disk_full` (the
whole ``__cause__``/``__context__`` chain is looked at):

- ``OSError`` with errno ENOSPC or EDQUOT: plain writes, ``json.dump``, pyarrow (``ArrowIOError`` is
  ``OSError``), matplotlib's ``savefig``, ``np.save`` of a small array;
- ``OSError("1000000 requested and 43504 written")``, no errno: numpy's ``tofile`` (and ``np.save``
  of a large array, which uses it) when the disk fills part way;
- ``RuntimeError`` from torch's zip writer (``torch.save``): ``[enforce fail at
  inline_container.cc:672] . unexpected pos 576 vs 534``, ``PytorchStreamWriter failed writing
  file data/0: file write failed``, ``basic_ios::clear: iostream error``;
- ``SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")``.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path
from typing import Iterable

from packtrain.core.errors import PacktrainError

NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# the messages of the libraries that lose the errno on the way (see the module docstring)
NO_SPACE_MESSAGES = re.compile(
    "|".join([
        r"No space left on device", r"Disk quota exceeded",
        rf"os error (?:{errno.ENOSPC}|{errno.EDQUOT})\b",  # Rust's io::Error (safetensors)
        r"^\d+ requested and \d+ written$",  # numpy's tofile
        r"inline_container\.cc.*unexpected pos", r"PytorchStreamWriter failed writing", r"file write failed",
        r"basic_ios::clear: iostream error",  # torch's zip writer
    ]))


class DiskFullError(PacktrainError):
    """A write failed for want of space; the message names the path, the free space and the fix."""


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is a full disk or quota, in any of the
    library forms listed in the module docstring."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, DiskFullError):
            return True
        if isinstance(error, OSError) and error.errno in NO_SPACE_ERRNOS:
            return True
        if isinstance(error, (OSError, RuntimeError)) or type(error).__name__ == "SafetensorError":
            if NO_SPACE_MESSAGES.search(str(error)):
                return True
        error = error.__cause__ or error.__context__
    return False


def free_space(path: str | os.PathLike) -> str:
    """The free space of the device holding ``path`` (or its nearest existing parent), e.g. ``1.4 MiB``."""
    where = Path(os.path.abspath(path))
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        free = shutil.disk_usage(where).free
    except OSError as e:
        return f"free space unknown: {e.strerror}"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if free < 1024 or unit == "TiB":
            return f"{free} B" if unit == "B" else f"{free:.1f} {unit}"
        free /= 1024


def remove_partial(paths: Iterable[str | os.PathLike]) -> None:
    """Remove what a failed write left (temporary files or directories); a path that is not there is fine."""
    for path in map(Path, paths):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                path.unlink()
            except FileNotFoundError:
                pass


class written:
    """``with written(target, what, fix, partial=[tmp]):`` the block writes ``target`` (through the
    temporary ``partial`` paths). When it fails, the partial paths are removed, whatever the failure;
    a full disk becomes one :class:`DiskFullError` (raised from the library's error), any other
    failure goes on as it was. ``fix`` says what to do once space is freed."""

    def __init__(self, target: str | os.PathLike, what: str, fix: str, partial: Iterable[str | os.PathLike] = ()):
        self.target, self.what, self.fix, self.partial = Path(target), what, fix, list(partial)

    def __enter__(self) -> "written":
        return self

    def __exit__(self, kind, error, tb) -> bool:
        if error is None:
            return False
        remove_partial(self.partial)
        if isinstance(error, DiskFullError) or not is_disk_full(error):
            return False
        removed = "the partial files were removed; " if self.partial else ""
        raise DiskFullError(f"no space left on the device of {self.target} ({free_space(self.target)} free) while "
                            f"writing {self.what}: {removed}{self.fix}") from error
