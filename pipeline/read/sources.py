"""Read rows from a resolved source, streamed in fixed-size batches of Python values (given as
Arrow where pyarrow read them: pipeline/read/arrow_columns.py, whose values are made where they are used).

Memory stays bounded by one batch plus one reader block, whatever the dataset's size (a JSON
*array* file is the exception: it has to be parsed whole). A line, a CSV row or a JSON array file
longer than :class:`ReadBound` (``build.read_memory_mb`` / 8, decompressed) is refused in one line
before it is held: a 1 MB ``.jsonl.gz`` can hold a 1 GiB line (issue 46). Only the requested columns are read
where the format allows it (parquet, arrow, csv, tsv). JSON lines, JSON, CSV and TSV files may be
compressed (``train.jsonl.gz``, ``.bz2``, ``.xz``: pipeline/read/compression.py); they are decompressed
as they are read, and give the rows the file uncompressed gives.

Batches never cross a file boundary and hold exactly ``batch_rows`` rows, except the last one of
each file; ``RowBatch.start`` is the index of its first row within its file, so a row is named by
``(file, start + i)`` in errors and reports. Files are read in ``ResolvedSource.files`` order::

    files a.jsonl (5 rows), b.jsonl (2 rows), batch_rows=2  ->  (a, 0) (a, 2) (a, 4) (b, 0)
"""

from __future__ import annotations

import csv
import json
import mmap
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq

from packtrain.pipeline.read.arrow_columns import ArrowColumns, cut, joined, num_rows
from packtrain.pipeline.read.json_rows import JsonLines, json_problem, parse_row
from packtrain.pipeline.read.compression import (DECOMPRESSION_ERRORS, TEXT_SUFFIXES, arrow_input, compressed_unnamed,
                                            damaged_fix, describe, file_format, first_not_utf8, open_binary,
                                            open_text)
from packtrain.pipeline.read.discover import DATA_SUFFIXES_TEXT, ResolvedSource, SourceError
from packtrain.pipeline.format.format import template_columns_fix
from packtrain.core.config_build import BuildConfig
from packtrain.core.config_names import close_choices
from packtrain.core.inputs import one_line

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
            _check_columns(path, [c for c in columns if c not in optional], e.available)
        if not present:
            raise
        if read:  # JSON lines find a column no row has after reading them all: it was null in each
            return
        for chunk in _read_chunks(path, present, batch_rows, bound):
            rows = num_rows(chunk)
            yield {c: chunk[c] if c in chunk else [None] * rows for c in columns}


def _read_chunks(path: Path, columns: list[str], batch_rows: int, bound: ReadBound = ReadBound()) -> Iterator[Columns]:
    suffix = file_format(path.name)[0]
    readers = {".parquet": _parquet, ".arrow": _arrow, ".jsonl": partial(_jsonl, bound=bound),
               ".json": partial(_json, bound=bound), ".csv": partial(_csv, bound=bound), ".tsv": partial(_tsv, bound=bound)}
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


class MissingColumns(SourceError):
    """A data file lacks columns the format reads; :func:`iter_batches` adds the fix its caller knows."""

    def __init__(self, message: str, missing: list[str], available: list[str]):
        super().__init__(message)
        self.missing, self.available = missing, available


def _check_columns(path: Path, columns: list[str], available: list[str]) -> None:
    missing = [c for c in columns if c not in available]
    if missing:
        raise MissingColumns(f"{path}: no column {', '.join(map(repr, missing))}{close_choices(missing, available)} "
                             f"(it has: {', '.join(map(repr, available)) or 'none'})", missing, available)


def _check_unique(path: Path, columns: list[str], names: list[str]) -> None:
    """A parquet or Arrow schema may name two columns alike (pyarrow writes what it is given); reading
    one of them by name failed with a KeyError traceback: refused in one line naming it."""
    twice = [c for c in columns if names.count(c) > 1]
    if twice:
        raise SourceError(f"{path}: the column {twice[0]!r} appears {names.count(twice[0])} times in the file, so "
                          f"which one to read is not known; write the file again with one column of each name, or map "
                          f"the field to another column with `columns:` under the source")


def _pieces(batch: pa.RecordBatch, batch_rows: int) -> Iterator[Columns]:
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


def _parquet(path: Path, columns: list[str], batch_rows: int) -> Iterator[Columns]:
    parquet = pq.ParquetFile(path, memory_map=True)
    _check_columns(path, columns, parquet.schema_arrow.names)
    _check_unique(path, columns, parquet.schema_arrow.names)
    for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns, use_threads=False):
        yield from _pieces(batch, batch_rows)


def _arrow(path: Path, columns: list[str], batch_rows: int) -> Iterator[Columns]:
    """Arrow IPC: the stream format (datasets cache, save_to_disk), else the file format."""
    try:
        reader = pa.ipc.open_stream(pa.memory_map(str(path)))
        batches = iter(reader)
    except pa.ArrowInvalid:
        reader = pa.ipc.open_file(pa.memory_map(str(path)))
        batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    _check_columns(path, columns, reader.schema.names)
    _check_unique(path, columns, reader.schema.names)
    for batch in batches:
        yield from _pieces(batch.select(columns), batch_rows)


_CSV_MAX_BLOCK = 1 << 30  # the longest CSV row read: pyarrow's blocks are at most 2 GiB


def _csv(path: Path, columns: list[str], batch_rows: int, delimiter: str = ",",
         bound: ReadBound = ReadBound()) -> Iterator[Columns]:
    """Every requested column is read as text, as written (no "007" -> 7 type guessing). Quoted
    cells may span lines (code and queries often do). A row longer than pyarrow's block (1 MiB) is
    read by reading the file again from that row with a block 4 times larger, as often as it takes,
    up to the bound (build.read_memory_mb / 8): a row longer than that is refused."""
    with open_text(path, newline="") as f:
        header = next(csv.reader(bounded_lines(f, bound, path), delimiter=delimiter), [])
    _check_columns(path, columns, header)
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
                    for piece in _pieces(batch.slice(skip), batch_rows):
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


_JSON_BLOCK = 1 << 20  # pyarrow's default block for JSON lines


def _jsonl(path: Path, columns: list[str], batch_rows: int, bound: ReadBound = ReadBound()) -> Iterator[Columns]:
    """JSON lines through pyarrow's streaming reader, the requested columns as text and every other field
    skipped; where a requested column holds anything but text or null in some row (a number, a list, an
    object: what pyarrow would convert otherwise than ``json.loads``), line by line from that block on.

    pyarrow is given the schema rather than asked to infer it: inferring the type of a field nested about
    10,000 levels deep crashed the process with a segmentation fault, even a field the build does not read
    (its parser reads any depth; the inference recurses). A column no row has is said before any row is
    read where the file's bytes hold its key nowhere (:func:`_keys_nowhere`), else after the rows."""
    _keys_nowhere(path, columns, bound)
    done, unseen = 0, set(columns)  # unseen: no row read so far holds a value in that column
    schema = pa.schema([(c, pa.string()) for c in columns])
    try:
        with arrow_input(path) as stream:
            # pyarrow reads an object up to two blocks long: blocks of half the bound, where its default
            # (1 MiB) is more, leave every longer line to the bounded line-by-line read
            reader = pjson.open_json(stream, pjson.ReadOptions(block_size=min(_JSON_BLOCK, bound.limit // 2)),
                                     pjson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"))
            for batch in reader:
                unseen -= {c for c in unseen if batch.column(c).null_count < batch.num_rows}
                for piece in _pieces(batch.select(columns), batch_rows):
                    yield piece
                    done += num_rows(piece)
    except pa.ArrowInvalid:
        yield from _json_lines(path, columns, batch_rows, skip=done, bound=bound, unseen=unseen)
        return
    if unseen and done:  # null in every row: lacking from every row is an error (a file with no rows lacks nothing)
        yield from _json_lines(path, columns, batch_rows, skip=done, bound=bound, unseen=unseen)


def _json_lines(path: Path, columns: list[str], batch_rows: int, skip: int = 0,
                bound: ReadBound = ReadBound(), unseen: Iterable[str] | None = None) -> Iterator[Columns]:
    """One JSON object per non-blank line; the first ``skip`` rows were already read. A column some
    rows lack is null there (a bad row, counted); one that no row has is an error, said at the end: the
    lines are parsed here (from the first, skipped ones included) only while a column of ``unseen``
    (default: all) is in no row parsed yet. The batches are the lines, parsed where they are used
    (pipeline/read/json_rows.py)."""
    lines: list[str] = []
    linenos: list[int] = []
    row = 0
    seen: dict[str, None] = {}  # every key of the rows parsed, while a column is still unseen
    unseen = set(columns if unseen is None else unseen)
    with open_text(path) as f:
        for lineno, line in enumerate(bounded_lines(f, bound, path), 1):
            if not line.strip():
                continue
            if unseen:  # parsed here only until every column is seen (in the worker that uses it, after)
                obj = parse_row(str(path), lineno, line)
                seen.update(dict.fromkeys(obj))
                unseen.difference_update(obj)
            if row < skip:
                row += 1
                continue
            lines.append(line)
            linenos.append(lineno)
            row += 1
            if len(lines) == batch_rows:
                yield JsonLines(str(path), lines, linenos, columns)
                lines, linenos = [], []
    if lines:
        yield JsonLines(str(path), lines, linenos, columns)
    if unseen and row:  # a file with no rows lacks nothing
        _check_columns(path, columns, list(seen))


def _keys_nowhere(path: Path, columns: list[str], bound: ReadBound = ReadBound()) -> None:
    """Raise :class:`MissingColumns` (naming the first row's keys) for the columns whose key is written
    nowhere in a JSON lines file, in any of the ways JSON can write it (:func:`_json_key`): a misspelt
    column is then said at once, not after every line of a large file was parsed. A file whose first
    row is not a JSON object, or that has none, is left to the line-by-line read (it says why)."""
    try:
        with open_text(path) as f:  # the first line bounded: it may be the 1 GiB one
            first = next((line for line in bounded_lines(f, bound, path) if line.strip()), None)
        row = json.loads(first) if first is not None else None
    except (UnicodeDecodeError, ValueError, RecursionError):  # said, with its line, by the line-by-line read
        return
    if not isinstance(row, dict):
        return
    _check_columns(path, _absent_keys(path, columns), list(row))


def _absent_keys(path: Path, columns: list[str], chunk_bytes: int = 1 << 20) -> list[str]:
    """The columns whose key a (non-empty) JSON lines file holds nowhere. A plain file is memory-mapped
    and searched whole; a compressed one is decompressed a chunk at a time (memory stays bounded), each
    searched with the end of the one before it, for the key in quotes (the colon after it may lie a
    whitespace run away, in the next chunk: a key found without it only leaves the error to the end)."""
    quoted = {c: json.dumps(c, ensure_ascii=False).encode("utf-8", "surrogatepass") for c in columns}
    if not file_format(path.name)[1]:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            # the key as itself first (a plain find), the escaped ways only where that is not found
            return [c for c in columns if data.find(quoted[c]) < 0 and _json_key(c).search(data) is None]
    absent = {c: _json_key(c, colon=False) for c in columns}
    overlap = 2 + 12 * max(map(len, columns))  # the longest way to write a key: quotes, \uXXXX\uXXXX per character
    tail = b""
    with open_binary(path) as f:
        while absent and (chunk := f.read(chunk_bytes)):
            data = tail + chunk
            for c in [c for c, key in absent.items() if data.find(quoted[c]) >= 0 or key.search(data)]:
                del absent[c]
            tail = data[-overlap:]
    return [c for c in columns if c in absent]


def _json_key(key: str, colon: bool = True) -> re.Pattern[bytes]:
    """Every way JSON writes ``key`` as an object's key: each character as itself (UTF-8) where JSON
    allows it, as ``\\uXXXX`` (hex digits in either case; a surrogate pair above U+FFFF) or as its
    short escape (``\\"``, ``\\n``, ...), in quotes, then JSON's whitespace and the colon (without
    ``colon``: the quoted key alone)."""
    short = {'"': '"', "\\": "\\", "/": "/", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}
    parts = []
    for ch in key:
        # as itself: not a quote, backslash or control character (JSON escapes them), nor a lone surrogate
        # (UTF-8 has none: only escaped)
        ways = [] if ch in '"\\' or ord(ch) < 0x20 or 0xD800 <= ord(ch) < 0xE000 else [re.escape(ch.encode("utf-8"))]
        if ch in short:
            ways.append(re.escape(("\\" + short[ch]).encode()))
        above = ord(ch) - 0x10000  # above the BMP: escaped as a surrogate pair
        units = [ord(ch)] if above < 0 else [0xD800 + (above >> 10), 0xDC00 + (above & 0x3FF)]
        ways.append(b"".join(b"\\\\u" + b"".join(b"[%s%s]" % (d.encode(), d.upper().encode()) if d.isalpha()
                                                 else d.encode() for d in f"{u:04x}") for u in units))
        parts.append(b"(?:" + b"|".join(ways) + b")")
    return re.compile(b'"' + b"".join(parts) + (b'"[ \\t\\n\\r]*:' if colon else b'"'))


def _json(path: Path, columns: list[str], batch_rows: int, bound: ReadBound = ReadBound()) -> Iterator[Columns]:
    """A JSON array of objects (parsed whole: json has no streaming form), or JSON lines."""
    with open_binary(path) as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if not head.startswith(b"["):
        yield from _jsonl(path, columns, batch_rows, bound)
        return
    try:
        with open_text(path) as f:
            text = f.read(bound.limit + 1)
        if len(text) > bound.limit:
            raise bound.refuse(str(path), "a JSON array file (parsed whole)")
        rows = json.loads(text)
    except (ValueError, RecursionError) as e:
        at = f", line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        raise SourceError(f"{path}{at}: {json_problem(e)}; fix the file") from None
    keys: dict[str, None] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise SourceError(f"{path}, row {i}: expected an array of JSON objects, got {type(row).__name__}")
        keys.update(dict.fromkeys(row))
    _check_columns(path, columns, list(keys))
    for offset in range(0, len(rows), batch_rows):
        yield {c: [row.get(c) for row in rows[offset:offset + batch_rows]] for c in columns}
