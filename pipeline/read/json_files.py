"""The JSON readers of pipeline/read/sources.py: JSON lines (``.jsonl``, and a ``.json`` file that is not
an array) through pyarrow's streaming reader, line by line where it cannot read a block exactly, and a JSON
array file parsed whole. A column no row has is said before any row is read where the file holds its key
nowhere, in any way JSON can write it."""

from __future__ import annotations

import json
import mmap
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pjson

from packtrain.pipeline.read.arrow_columns import num_rows
from packtrain.pipeline.read.compression import arrow_input, file_format, open_binary, open_text
from packtrain.pipeline.read.discover import SourceError
from packtrain.pipeline.read.json_rows import JsonLines, json_problem, parse_row
from packtrain.pipeline.read.read_checks import Columns, ReadBound, bounded_lines, check_columns, pieces

_JSON_BLOCK = 1 << 20  # pyarrow's default block for JSON lines


def read_jsonl(path: Path, columns: list[str], batch_rows: int, bound: ReadBound = ReadBound()) -> Iterator[Columns]:
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
                for piece in pieces(batch.select(columns), batch_rows):
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
        check_columns(path, columns, list(seen))


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
    check_columns(path, _absent_keys(path, columns), list(row))


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


def read_json(path: Path, columns: list[str], batch_rows: int, bound: ReadBound = ReadBound()) -> Iterator[Columns]:
    """A JSON array of objects (parsed whole: json has no streaming form), or JSON lines."""
    with open_binary(path) as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if not head.startswith(b"["):
        yield from read_jsonl(path, columns, batch_rows, bound)
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
    check_columns(path, columns, list(keys))
    for offset in range(0, len(rows), batch_rows):
        yield {c: [row.get(c) for row in rows[offset:offset + batch_rows]] for c in columns}
