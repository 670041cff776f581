"""The machine's store of near dedup's token tables (pipeline/pack/near_words.py :func:`tokenizer_table`):
what every token id of a tokenizer reads as, normalized, made once per tokenizer content and kept, so a
build with ``dedup: near`` or ``decontaminate`` does not load tokenizer.json again and decode its whole
vocabulary (about 1 s of a 200k-row build with Qwen3's 151,669 ids).

A table is about the tokenizer.json content (its sha256), the vocabulary size, the versions of what makes
it (tokenizers decodes, Python's Unicode tables lowercase and split) and :data:`TABLE_VERSION`; its file
is named by the sha256 of that (:func:`about`) and holds it, with the sha256 of the arrays: a file about
something else, damaged or cut short is no table (made again, and written over). The store is
:func:`store_dir`: ``PACKTRAIN_NEAR_TABLES_DIR`` where set (``off``: no store), else
``<packtrain models directory>/.near-tables`` (beside the store of fast-encoder proofs,
pipeline/encode/machine_notes.py). A file is written atomically under a name unique to its writer and
renamed into place (two builds at once each write a whole file; both are the same table); a store that
cannot be written is not written (the table is made in every build, the same bytes). The store decides
nothing about a build's bytes: with it on, off, warm or cold the shards are the same (tests/test_near_dup.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import unicodedata
import zipfile
from importlib.metadata import version
from pathlib import Path

import numpy as np

from packtrain.core.files import write_atomic
from packtrain.pipeline.encode.machine_notes import machine_store, remove_dead_writers
from packtrain.pipeline.errors import read_as_hashed
from packtrain.pipeline.pack import near_words

STORE_VARIABLE = "PACKTRAIN_NEAR_TABLES_DIR"
TABLES = ".near-tables"  # under the models directory
TABLE_VERSION = 1
"""Raise when :func:`near_words.token_table` or :func:`near_words.tokenizer_table` changes what it makes."""


def store_dir() -> Path | None:
    """Where this machine's token tables are kept, or None where ``PACKTRAIN_NEAR_TABLES_DIR`` is ``off``."""
    return machine_store(STORE_VARIABLE, TABLES)


def about(content_hash: str, vocab_size: int) -> str:
    """What the table of the tokenizer.json of sha256 ``content_hash`` depends on."""
    return (f"{content_hash} vocab {vocab_size} tokenizers {version('tokenizers')} "
            f"unicode {unicodedata.unidata_version} table {TABLE_VERSION}")


def table_path(store: Path, what: str) -> Path:
    return store / f"{hashlib.sha256(what.encode()).hexdigest()[:32]}.npz"


def token_table(tokenizer_file: Path, content_hash: str, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`near_words.tokenizer_table` of ``tokenizer_file`` (whose sha256 is ``content_hash``, else
    :class:`packtrain.pipeline.errors.ContentChanged`), from the store where it holds it, else made
    from that content and kept there."""
    store = store_dir()
    what = about(content_hash, vocab_size)
    if store is not None and (kept := read_table(table_path(store, what), what, vocab_size)) is not None:
        return kept
    raw = read_as_hashed(Path(tokenizer_file), content_hash, "build again", "a tokenizers file")
    table = near_words.tokenizer_table(raw.decode("utf-8"), vocab_size)
    if store is not None:
        write_table(store, what, table)
    return table


def checksum(data: np.ndarray, offsets: np.ndarray) -> str:
    return hashlib.sha256(data.tobytes() + offsets.astype("<i8").tobytes()).hexdigest()


def read_table(path: Path, what: str, vocab_size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The table in ``path`` where it is a whole one about ``what``, else None."""
    try:
        with np.load(path, allow_pickle=False) as f:
            data, offsets = f["data"], f["offsets"]
            seal = bytes(f["about"]).decode(), bytes(f["sha256"]).decode()
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError):
        return None
    whole = (data.dtype == np.uint8 and offsets.dtype == np.int64 and data.ndim == offsets.ndim == 1
             and len(offsets) > vocab_size and offsets[0] == 0 and offsets[-1] == len(data))
    if not whole or seal != (what, checksum(data, offsets)):
        return None
    return data, offsets


def write_table(store: Path, what: str, table: tuple[np.ndarray, np.ndarray]) -> None:
    """Keep ``table`` in ``store`` (atomically; quietly not where the store cannot be written)."""
    data, offsets = table
    buffer = io.BytesIO()
    np.savez(buffer, data=data, offsets=offsets.astype(np.int64), about=np.frombuffer(what.encode(), np.uint8),
             sha256=np.frombuffer(checksum(data, offsets).encode(), np.uint8))
    with contextlib.suppress(OSError):
        store.mkdir(parents=True, exist_ok=True)
        remove_dead_writers(store)
        write_atomic(table_path(store, what), buffer.getvalue())
