"""The longest document a worker encodes, from ``build.read_memory_mb``: encoding holds far more than the text.

The model's tokenizer (the HF one, which every build runs on its checked documents and on whatever no
shortcut makes) holds each token as an object with its text, id and offsets: a 2 MB document of one
token per byte took a build to 920 MB, and a 50 MB JSON line (a fifth of the line bound, issue 46) past
13 GB before it was stopped (attack 52, 2026-12-06). So a document's text may be at most
``read_memory_mb / ENCODE_SHARE`` bytes (UTF-8): 4 MiB by default. A longer one stops the build in one
line naming its row (:class:`DocumentTooLong`, named by pipeline/encode/source_caches.py), before it is
encoded; like the read bound it decides whether a build runs, never its bytes (not in the build id)::

    read_memory_mb 2048 -> documents of at most 4 MiB of text; 16 -> 32 KiB
"""

from __future__ import annotations

from packtrain.pipeline.errors import BuildError

ENCODE_SHARE = 512
"""Bytes the encode holds per byte of a document's text, at most (measured up to ~460 at one token per byte)."""


def document_limit(read_memory_mb: int) -> int:
    """The longest document's text, in UTF-8 bytes, under ``build.read_memory_mb``."""
    return read_memory_mb * (1 << 20) // ENCODE_SHARE


class DocumentTooLong(BuildError):
    """Row ``row`` of a batch (as the worker was given it) formats to ``size`` bytes of text, more than
    ``limit``; the build names the row (source, file, row) and says the fix."""

    def __init__(self, row: int, size: int, limit: int):
        super().__init__(row, size, limit)
        self.row, self.size, self.limit = row, size, limit

    def named(self, row_id: str, read_memory_mb: int) -> BuildError:
        return BuildError(
            f"{row_id}: a document of {size_text(self.size)} of text once formatted, more than {size_text(self.limit)} "
            f"(build.read_memory_mb {read_memory_mb} / {ENCODE_SHARE}): the model's tokenizer holds up to "
            f"{ENCODE_SHARE} bytes per byte of text while it encodes one (up to {size_text(self.size * ENCODE_SHARE)} "
            f"here), so it is not encoded; remove or split that row, or raise build.read_memory_mb if this machine "
            f"has the memory")

    def __str__(self) -> str:
        return f"row {self.row} of its batch: a document of {self.size:,} bytes of text, more than {self.limit:,}"


def check_lengths(texts: list[str], rows: list[int], limit: int) -> None:
    """Raise :class:`DocumentTooLong` for the first of ``texts`` (documents of the batch's rows ``rows``)
    longer than ``limit`` bytes of UTF-8; a text of at most ``limit / 4`` characters is never measured."""
    for text, row in zip(texts, rows):
        if len(text) > limit // 4 and (size := len(text.encode("utf-8", "surrogatepass"))) > limit:
            raise DocumentTooLong(row, size, limit)


def size_text(size: int) -> str:
    """``100 bytes``, ``16.0 KiB``, ``4.8 MiB``, ``2.4 GiB``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):,.1f} {unit}"
    return f"{size:,} bytes"
