"""Read rows from a resolved source, streamed in fixed-size batches of Python values (given as
Arrow where pyarrow read them: pipeline/read/arrow_columns.py, whose values are made where they are used).

Memory stays bounded by one batch plus one reader block, whatever the dataset's size (a JSON
*array* file is the exception: it has to be parsed whole). A line, a CSV row or a JSON array file
longer than :class:`ReadBound` (``build.read_memory_mb`` / 8, decompressed) is refused in one line
before it is held: a 1 MB ``.jsonl.gz`` can hold a 1 GiB line (issue 46; the checks every reader makes:
pipeline/read/read_checks.py). Only the requested columns are read
where the format allows it (parquet, arrow, csv, tsv). JSON lines, JSON, CSV and TSV files may be
compressed (``train.jsonl.gz``, ``.bz2``, ``.xz``: pipeline/read/compression.py); they are decompressed
as they are read, and give the rows the file uncompressed gives. The parquet, Arrow, CSV and TSV readers
are here, the JSON lines and JSON ones in pipeline/read/json_files.py.

Batches never cross a file boundary and hold exactly ``batch_rows`` rows, except the last one of
each file; ``RowBatch.start`` is the index of its first row within its file, so a row is named by
``(file, start + i)`` in errors and reports. Files are read in ``ResolvedSource.files`` order::

    files a.jsonl (5 rows), b.jsonl (2 rows), batch_rows=2  ->  (a, 0) (a, 2) (a, 4) (b, 0)
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from packtrain.pipeline.read.arrow_columns import cut, joined, num_rows
from packtrain.pipeline.read.compression import (DECOMPRESSION_ERRORS, TEXT_SUFFIXES, arrow_input, compressed_unnamed,
                                            damaged_fix, describe, file_format, first_not_utf8, open_binary,
                                            open_text)
from packtrain.pipeline.read.discover import DATA_SUFFIXES_TEXT, ResolvedSource, SourceError
from packtrain.pipeline.read.json_files import read_json, read_jsonl
from packtrain.pipeline.read.read_checks import (Columns, MissingColumns, ReadBound, bounded_lines, check_columns,
                                                check_unique, pieces)
from packtrain.pipeline.format.format import template_columns_fix
from packtrain.core.inputs import one_line


@dataclass(frozen=True)
class RowBatch:
    file: str  # path relative to the source's root (posix)
    start: int  # index of the first row within that file
    columns: Columns  # only the requested columns, python values, in the requested order

    @property
    def num_rows(self) -> int:
        return num_rows(self.columns)


def iter_batches(source: ResolvedSource, columns: list[str], batch_rows: int, max_rows: int | None = None,
                 column_fix: str | Callable[[list[str]], str] | None = None,
                 optional: Iterable[str] = (), bound: ReadBound = ReadBound()) -> Iterator[RowBatch]:
    """Rows of ``source`` in file order, ``batch_rows`` at a time, at most ``max_rows`` in all. A file
    without one of ``columns`` raises :class:`SourceError` naming the columns it has, then
    ``column_fix``: how to fix it, from what the caller reads the columns for (``RowFormatter.column_fix``;
    by default, template fields), or a function of the missing columns that says it. A file without
    one of the ``optional`` columns (alpaca's ``input``) reads it as null in every row. ``bound``: the
    longest line, row or JSON array file read (build.read_memory_mb)."""
    try:
        yield from _batches(source, columns, batch_rows, max_rows, frozenset(optional), bound)
    except MissingColumns as e:
        fix = column_fix(e.missing) if callable(column_fix) else column_fix or template_columns_fix()
        raise SourceError(f"{e}; {fix}") from None


def _batches(source: ResolvedSource, columns: list[str], batch_rows: int, max_rows: int | None,
             optional: frozenset = frozenset(), bound: ReadBound = ReadBound()) -> Iterator[RowBatch]:
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    if not columns:
        raise ValueError("iter_batches needs at least one column to read")
    columns = list(dict.fromkeys(columns))
    remaining = max_rows
    for path in source.files:
        if remaining is not None and remaining <= 0:
            return
        rel = path.relative_to(source.root).as_posix()
        start = 0
        for batch in _rebatch(_file_chunks(path, columns, batch_rows, optional, bound), columns, batch_rows):
            n = num_rows(batch)
            if remaining is not None and n > remaining:
                batch, n = cut(batch, remaining)[0], remaining
            yield RowBatch(rel, start, batch)
            start += n
            if remaining is not None:
                remaining -= n
                if remaining <= 0:
                    return


def _rebatch(chunks: Iterator[Columns], columns: list[str], batch_rows: int) -> Iterator[Columns]:
    """Re-cut chunks of any size into batches of exactly ``batch_rows`` rows (the last may be short);
    Arrow chunks stay Arrow (pipeline/read/arrow_columns.py)."""
    held: list[Columns] = []
    rows = 0
    for chunk in chunks:
        k = num_rows(chunk)
        if rows == 0 and k == batch_rows:
            yield joined([chunk], columns)
            continue
        held.append(chunk)
        rows += k
        while rows >= batch_rows:
            batch = joined(held, columns)
            first, rest = cut(batch, batch_rows)
            yield first
            held, rows = [rest], rows - batch_rows
    if rows:
        yield joined(held, columns)


def _file_chunks(path: Path, columns: list[str], batch_rows: int, optional: frozenset,
                 bound: ReadBound = ReadBound()) -> Iterator[Columns]:
    """The file's chunks of ``columns``; an ``optional`` column the file lacks is null in every row."""
    read = False
    try:
        for chunk in _read_chunks(path, columns, batch_rows, bound):
            read = True
            yield chunk
    except MissingColumns as e:
        present = [c for c in columns if c not in e.missing]
        if not optional.issuperset(e.missing):  # name the required ones alone
            check_columns(path, [c for c in columns if c not in optional], e.available)
        if not present:
            raise
        if read:  # JSON lines find a column no row has after reading them all: it was null in each
            return
        for chunk in _read_chunks(path, present, batch_rows, bound):
            rows = num_rows(chunk)
            yield {c: chunk[c] if c in chunk else [None] * rows for c in columns}


def _read_chunks(path: Path, columns: list[str], batch_rows: int, bound: ReadBound = ReadBound()) -> Iterator[Columns]:
    suffix = file_format(path.name)[0]
    readers = {".parquet": _parquet, ".arrow": _arrow, ".jsonl": partial(read_jsonl, bound=bound),
               ".json": partial(read_json, bound=bound), ".csv": partial(_csv, bound=bound), ".tsv": partial(_tsv, bound=bound)}
    if suffix not in readers:
        raise SourceError(f"{path}: unsupported file type {suffix!r}; use one of {DATA_SUFFIXES_TEXT}")
    if mislabelled := compressed_unnamed(path):
        raise SourceError(mislabelled)
    try:
        yield from readers[suffix](path, columns, batch_rows)
    except (pa.ArrowException, OSError, UnicodeDecodeError, csv.Error, RecursionError, *DECOMPRESSION_ERRORS) as e:
        if isinstance(e, UnicodeDecodeError) or re.search(r"\bUTF-?8\b", str(e), re.IGNORECASE):
            raise SourceError(_not_utf8(path, e)) from None
        raise SourceError(f"{path}: cannot be read as {describe(path)} ({one_line(e) or type(e).__name__}); "
                          f"{damaged_fix(path)}") from None


def _not_utf8(path: Path, error: Exception) -> str:
    """The one line for a data file holding text that is not UTF-8 (latin-1, UTF-16, ...): where (a text
    file's first such line; a parquet or Arrow file's column) and how to convert it."""
    if file_format(path.name)[0] in TEXT_SUFFIXES:
        where = first_not_utf8(path)
        return (f"{path}{f', {where}' if where else ''}: not UTF-8 text; data files are read as UTF-8 (as datasets "
                f"reads them): convert it (e.g. `iconv -f latin1 -t utf-8`) or remove it from the source")
    return (f"{path}: a text column holds bytes that are not UTF-8 ({one_line(error)}); write the file again with "
            f"that column's text decoded to UTF-8, or remove it from the source")



def _parquet(path: Path, columns: list[str], batch_rows: int) -> Iterator[Columns]:
    parquet = pq.ParquetFile(path, memory_map=True)
    check_columns(path, columns, parquet.schema_arrow.names)
    check_unique(path, columns, parquet.schema_arrow.names)
    for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns, use_threads=False):
        yield from pieces(batch, batch_rows)


def _arrow(path: Path, columns: list[str], batch_rows: int) -> Iterator[Columns]:
    """Arrow IPC: the stream format (datasets cache, save_to_disk), else the file format."""
    try:
        reader = pa.ipc.open_stream(pa.memory_map(str(path)))
        batches = iter(reader)
    except pa.ArrowInvalid:
        reader = pa.ipc.open_file(pa.memory_map(str(path)))
        batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    check_columns(path, columns, reader.schema.names)
    check_unique(path, columns, reader.schema.names)
    for batch in batches:
        yield from pieces(batch.select(columns), batch_rows)


_CSV_MAX_BLOCK = 1 << 30  # the longest CSV row read: pyarrow's blocks are at most 2 GiB


def _csv(path: Path, columns: list[str], batch_rows: int, delimiter: str = ",",
         bound: ReadBound = ReadBound()) -> Iterator[Columns]:
    """Every requested column is read as text, as written (no "007" -> 7 type guessing). Quoted
    cells may span lines (code and queries often do). A row longer than pyarrow's block (1 MiB) is
    read by reading the file again from that row with a block 4 times larger, as often as it takes,
    up to the bound (build.read_memory_mb / 8): a row longer than that is refused."""
    with open_text(path, newline="") as f:
        header = next(csv.reader(bounded_lines(f, bound, path), delimiter=delimiter), [])
    check_columns(path, columns, header)
    convert = pcsv.ConvertOptions(include_columns=columns, column_types={c: pa.string() for c in columns})
    parse = pcsv.ParseOptions(delimiter=delimiter, newlines_in_values=True)
    done, block = 0, 1 << 20  # pyarrow's default block: a row must fit in one
    while True:
        try:
            with arrow_input(path) as stream:
                skip = done
                for batch in pcsv.open_csv(stream, pcsv.ReadOptions(block_size=block), parse, convert):
                    if skip >= batch.num_rows:
                        skip -= batch.num_rows
                        continue
                    for piece in pieces(batch.slice(skip), batch_rows):
                        yield piece
                        done += num_rows(piece)
                    skip = 0
            if (line := _unclosed_quote(path, delimiter, bound)) is not None:
                raise SourceError(f"{path}: a quoted cell of the row on line {line} is never closed, so every line after "
                                  f"it was read as part of that one cell; close its quote (a quote inside a quoted cell is "
                                  f"written twice, \"\"), or remove that row (a file cut short ends so: download it again)")
            return
        except pa.ArrowInvalid as e:
            if "straddl" not in str(e):
                raise
            if block >= min(bound.limit, _CSV_MAX_BLOCK):
                raise bound.refuse(str(path), f"a row (after the first {done:,})") from None
            block = min(block * 4, bound.limit, _CSV_MAX_BLOCK)  # a row longer than the block (a 10 MB cell): read again from the row it stopped at


def _unclosed_quote(path: Path, delimiter: str, bound: ReadBound) -> int | None:
    """The line where the file's last quoted cell starts, where it never closes (the file ends inside it);
    None otherwise. pyarrow's reader takes such a cell to the end of the file, the rows after its quote
    with it, and says nothing. An even number of quotes cannot leave one open, unless a quote inside an
    unquoted cell (``5" tall``, taken as it is) pairs with it: the quotes are counted first (one pass,
    bytes), and only an odd count is parsed, by Python's strict reader, whose other complaints (``"a"b``,
    which pyarrow takes) leave the file as pyarrow read it."""
    quotes = 0
    with open_binary(path) as f:
        while chunk := f.read(1 << 20):
            quotes += chunk.count(b'"')
    if quotes % 2 == 0:
        return None
    with open_text(path, newline="") as f:
        reader = csv.reader(bounded_lines(f, bound, path), delimiter=delimiter, strict=True)
        start = 1
        try:
            for _ in reader:
                start = reader.line_num + 1
        except csv.Error as e:
            return start if "unexpected end of data" in str(e) else None
    return None


def _tsv(path: Path, columns: list[str], batch_rows: int, bound: ReadBound = ReadBound()) -> Iterator[Columns]:
    """Tab-separated values: the CSV rules with a tab between cells (``datasets``' ``sep="\\t"``)."""
    yield from _csv(path, columns, batch_rows, delimiter="\t", bound=bound)
