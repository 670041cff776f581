"""Compressed text data files: a file's format and compression from its name, and streams that
decompress as they are read (never the whole file at once).

``datasets.load_dataset`` reads ``train.jsonl.gz``, ``rows.csv.bz2`` or ``dump.json.xz`` as the
``.jsonl`` / ``.csv`` / ``.json`` file they hold; so does packtrain. Only the text formats are read
compressed (parquet and arrow compress inside the file)::

    >>> file_format("data/train.jsonl.gz"), file_format("rows.TSV"), file_format("x.parquet.gz")
    (('.jsonl', '.gz'), ('.tsv', ''), ('.gz', ''))

The source's fingerprint hashes a file as stored (compressed); the rows are what it holds.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import io
import lzma
import re
import zlib
from pathlib import Path, PurePosixPath
from typing import IO

COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz"}  # suffix -> what the data must be
TEXT_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")  # the formats that may be compressed
_OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
_MAGIC = {".gz": re.compile(rb"\x1f\x8b"), ".bz2": re.compile(rb"BZh[1-9]1AY&SY"), ".xz": re.compile(rb"\xfd7zXZ\x00")}
_ARROW_CODECS = {".gz": "gzip", ".bz2": "bz2"}  # pyarrow's own streams (no GIL); xz through lzma
# what a damaged or mislabelled compressed file raises while read (besides OSError, which gzip's and
# bz2's own errors and pyarrow's "Truncated compressed stream" are)
DECOMPRESSION_ERRORS = (EOFError, zlib.error, lzma.LZMAError)


def file_format(name: str | PurePosixPath | Path) -> tuple[str, str]:
    """(the format's suffix, the compression's suffix or ""), lowercase. A compression suffix counts
    only after a text format's (``a.jsonl.gz``); otherwise the last suffix is the format
    (``a.gz``, ``a.parquet.gz``: ``.gz``, which no reader reads)."""
    path = PurePosixPath(name)
    suffix = path.suffix.lower()
    if suffix in COMPRESSIONS:
        inner = PurePosixPath(path.stem).suffix.lower()
        if inner in TEXT_SUFFIXES:
            return inner, suffix
    return suffix, ""


def describe(path: Path) -> str:
    """How the file is read, for errors: ``jsonl``, ``gzip-compressed jsonl``."""
    fmt, comp = file_format(path.name)
    return f"{COMPRESSIONS[comp]}-compressed {fmt[1:]}" if comp else fmt[1:]


def damaged_fix(path: Path) -> str:
    """The fix for a file that cannot be read: for a compressed one, that it may be cut short or not
    hold what its name says."""
    _, comp = file_format(path.name)
    if not comp:
        return "check the file (re-download or regenerate it) or remove it from the source"
    return (f"the file may be damaged, cut short, or not {COMPRESSIONS[comp]} data: re-download or regenerate it, "
            f"rename it without {comp} if it is not compressed, or remove it from the source")


def compressed_unnamed(path: Path) -> str | None:
    """Where a text data file named without a compression suffix holds compressed data (``train.jsonl``
    that is gzip's bytes; ``load_dataset`` reads it by its first bytes, packtrain by its name): the
    one-line error that says to rename it. Else None."""
    fmt, comp = file_format(path.name)
    if comp or fmt not in TEXT_SUFFIXES:
        return None
    with open(path, "rb") as f:
        head = f.read(10)
    found = next((suffix for suffix, magic in _MAGIC.items() if magic.match(head)), None)
    if found is None:
        return None
    return (f"{path}: holds {COMPRESSIONS[found]}-compressed data, not {fmt[1:]} text; rename it {path.name}{found} "
            f"(a compressed file is read as its name says), or decompress it")


def open_binary(path: Path) -> IO[bytes]:
    """The file's bytes, decompressed as they are read where its name says it is compressed."""
    return _OPENERS.get(file_format(path.name)[1], open)(path, "rb")


def open_text(path: Path, newline: str | None = None) -> IO[str]:
    """The file's text (UTF-8, a BOM dropped), decompressed as it is read; ``newline`` as for ``open``."""
    if not file_format(path.name)[1]:
        return open(path, encoding="utf-8-sig", newline=newline)
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", newline=newline)


def arrow_input(path: Path):
    """What pyarrow's streaming readers read: the path itself, or a stream decompressing it as read
    (pyarrow's own for gzip and bz2, Python's lzma for xz). Use it as a context manager."""
    import pyarrow as pa

    comp = file_format(path.name)[1]
    if not comp:
        return pa.OSFile(str(path))
    if comp in _ARROW_CODECS:
        return pa.CompressedInputStream(pa.OSFile(str(path)), _ARROW_CODECS[comp])
    return open_binary(path)


NEWLINE = b"\n"


def first_not_utf8(path: Path, chunk_bytes: int = 1 << 20) -> str | None:
    """Where a text data file (decompressed as it is read) first holds bytes that are not UTF-8, for
    errors: ``line 10 (byte 0xe9)``; None where it is all UTF-8. Memory stays one chunk, however long
    its lines."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    lines = 1
    with open_binary(path) as f:
        while True:
            chunk = f.read(chunk_bytes)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:  # e.object: the bytes the decoder held back (part of a character), then chunk
                line = lines + e.object[:e.start].count(NEWLINE)
                return f"line {line} (byte 0x{e.object[e.start]:02x})"
            if not chunk:
                return None
            lines += chunk.count(NEWLINE)
