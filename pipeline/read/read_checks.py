"""What every reader of a data file checks as it reads it (pipeline/read/sources.py,
pipeline/read/json_files.py): the longest line, CSV row or JSON array file it holds (:class:`ReadBound`,
``build.read_memory_mb``), that the columns it reads are there and named once, and that the text of an
Arrow batch is UTF-8 before a worker makes its values."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pyarrow as pa

from packtrain.pipeline.read.arrow_columns import ArrowColumns
from packtrain.pipeline.read.discover import SourceError
from packtrain.core.config_build import BuildConfig
from packtrain.core.config_names import close_choices

Columns = dict[str, list]

MEMORY_SHARE = 8
"""A line (or a JSON array file) may be at most build.read_memory_mb / MEMORY_SHARE: reading it holds
its bytes, its decoded text and its parsed values at once, up to this many times its size."""


@dataclass(frozen=True)
class ReadBound:
    """The longest line, CSV row or JSON array file read, from ``build.read_memory_mb``: in characters of
    text (a line) or bytes (what pyarrow's CSV reader holds), decompressed."""

    read_memory_mb: int = BuildConfig.read_memory_mb  # the one default: the config's

    @property
    def limit(self) -> int:
        return self.read_memory_mb * (1 << 20) // MEMORY_SHARE

    def refuse(self, where: str, what: str = "a line") -> "SourceError":
        mib = self.limit / (1 << 20)
        return SourceError(f"{where}: {what} longer than {mib:,.{0 if mib.is_integer() else 2}f} MiB (build.read_memory_mb "
                           f"{self.read_memory_mb} / {MEMORY_SHARE}) once decompressed, so it is not read; remove it, or "
                           f"raise build.read_memory_mb if the data really holds such rows")


def bounded_lines(f: IO[str], bound: ReadBound, path: Path) -> Iterator[str]:
    """The lines of the text stream ``f`` (as ``for line in f`` gives them), none held longer than the
    bound: a longer one is refused after reading at most ``bound.limit + 1`` characters of it."""
    lineno = 0
    while line := f.readline(bound.limit + 1):
        lineno += 1
        if len(line) > bound.limit:
            raise bound.refuse(f"{path}, line {lineno}")
        yield line


class MissingColumns(SourceError):
    """A data file lacks columns the format reads; :func:`iter_batches` adds the fix its caller knows."""

    def __init__(self, message: str, missing: list[str], available: list[str]):
        super().__init__(message)
        self.missing, self.available = missing, available


def check_columns(path: Path, columns: list[str], available: list[str]) -> None:
    missing = [c for c in columns if c not in available]
    if missing:
        raise MissingColumns(f"{path}: no column {', '.join(map(repr, missing))}{close_choices(missing, available)} "
                             f"(it has: {', '.join(map(repr, available)) or 'none'})", missing, available)


def check_unique(path: Path, columns: list[str], names: list[str]) -> None:
    """A parquet or Arrow schema may name two columns alike (pyarrow writes what it is given); reading
    one of them by name failed with a KeyError traceback: refused in one line naming it."""
    twice = [c for c in columns if names.count(c) > 1]
    if twice:
        raise SourceError(f"{path}: the column {twice[0]!r} appears {names.count(twice[0])} times in the file, so "
                          f"which one to read is not known; write the file again with one column of each name, or map "
                          f"the field to another column with `columns:` under the source")


def pieces(batch: pa.RecordBatch, batch_rows: int) -> Iterator[Columns]:
    """``batch`` in pieces of ``batch_rows``, checked first: pyarrow's JSON, parquet and Arrow readers
    take text that is not UTF-8 as it is, which failed where a worker made its values (a traceback)."""
    try:
        batch.validate(full=True)
    except pa.ArrowInvalid:
        for name, column in zip(batch.schema.names, batch.columns):
            try:
                column.validate(full=True)
            except pa.ArrowInvalid as e:  # "Invalid UTF8 sequence at string index 9": said by _not_utf8
                raise pa.ArrowInvalid(f"column {name!r}: {' '.join(str(e).split())}") from None
        raise
    for offset in range(0, batch.num_rows, batch_rows):
        yield ArrowColumns(batch.slice(offset, batch_rows))
