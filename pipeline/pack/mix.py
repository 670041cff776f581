"""Mixing: which tokenized documents are packed, and how many times. Pure functions on document keys.

Every document is keyed by a hash of its tokens and its loss mask (:func:`document_keys`). With
``build.dedup: exact`` a document is packed once whatever the number of its copies, within a
source and across sources (the first in source order is kept), and a training document whose
key is also a validation document's is dropped: a document in val is never also in train.
Then each source's ``weight`` multiplies its training documents::

    source documents a b c d (after dedup), weight 2.5
    -> a b c d  a b c d  + the 2 (= 0.5 x 4) documents of smallest key, say b d
    weight 0.25 -> the 1 (= 0.25 x 4) document of smallest key

The fractional part is exact (``fraction x n`` documents, rounded half up) and deterministic: chosen by key,
not by position or a random generator, so the same documents are chosen in every build.
Validation documents are deduplicated but never weighted (eval measures the data as it is).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


KEY_BYTES = 16


def document_keys(tokens: np.ndarray, masks: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A 16-byte key per document, as rows of a uint8 array: the blake2b of its tokens (their bytes
    in ``tokens``' dtype, the build's token dtype) and of its loss mask.

    >>> keys = document_keys(np.array([1, 2, 1, 2, 1, 2]), np.array([0, 1, 0, 1, 1, 1], np.uint8), np.array([2, 2, 2]))
    >>> keys.shape, bytes(keys[0]) == bytes(keys[1]), bytes(keys[0]) == bytes(keys[2])   # the third: another mask
    ((3, 16), True, False)
    """
    offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    token_bytes = memoryview(np.ascontiguousarray(tokens)).cast("B")
    mask_bytes = memoryview(np.ascontiguousarray(masks)).cast("B")
    width = tokens.dtype.itemsize
    out = bytearray()
    for a, b in zip(offsets[:-1], offsets[1:]):  # no copy of a document: hashed from views
        key = hashlib.blake2b(token_bytes[a * width : b * width], digest_size=KEY_BYTES)
        key.update(b"|")
        key.update(mask_bytes[a:b])
        out += key.digest()
    return np.frombuffer(bytes(out), np.uint8).reshape(-1, KEY_BYTES)


def key_rows(*keys: bytes) -> np.ndarray:
    """Keys given as bytes, as the uint8 [n, KEY_BYTES] rows every function here takes (each padded with
    zero bytes): for examples and tests.

    >>> key_rows(b"ab").tolist() == [[97, 98] + [0] * 14]
    True
    """
    return np.frombuffer(b"".join(k.ljust(KEY_BYTES, b"\0") for k in keys), np.uint8).reshape(-1, KEY_BYTES)


def sort_order(keys: np.ndarray) -> np.ndarray:
    """The stable order of the key rows ``keys`` (uint8 [n, KEY_BYTES]) by their bytes: equal keys in row
    order. Sorted as two big-endian 64-bit halves, no Python object per document (a million keys as bytes
    objects and sets held 0.1 GiB: docs/BENCHMARKS.md).

    >>> sort_order(key_rows(b"b", b"a", b"b", b"ab")).tolist()
    [1, 3, 0, 2]
    """
    halves = np.ascontiguousarray(keys, np.uint8).view(">u8").reshape(len(keys), 2).astype(np.uint64)
    order = np.argsort(halves[:, 0], kind="stable")  # the first half decides all but copies (0.2 s a million)
    first = halves[order, 0]
    tied = np.flatnonzero(first[1:] == first[:-1])
    if len(tied) and (halves[order[tied], 1] != halves[order[tied + 1], 1]).any():  # equal first halves, not copies
        return np.lexsort((halves[:, 1], halves[:, 0]))  # (2**-64 a pair for hashes: both halves, 0.4-0.8 s)
    return order


class Ranked(NamedTuple):
    """Every source's documents, validation's sources first, then training's (in that concatenation),
    sorted by key once (:func:`ranked`), for dedup and the overlap both."""

    order: np.ndarray  # the documents by key, copies in document order
    key: np.ndarray  # each of them, in that order, its key numbered from 0: copies share a number


def ranked(keys: dict[str, list[np.ndarray]]) -> Ranked:
    """:class:`Ranked` of the key rows ``keys[split][source]``.

    >>> r = ranked({"val": [key_rows(b"b")], "train": [key_rows(b"a", b"b")]})
    >>> r.order.tolist(), r.key.tolist()
    ([1, 0, 2], [0, 1, 1])
    """
    parts = [source_keys for split in ("val", "train") for source_keys in keys[split]]
    everything = np.ascontiguousarray(np.concatenate(parts) if parts else np.zeros((0, KEY_BYTES), np.uint8), np.uint8)
    order = sort_order(everything)
    ordered = everything[order]
    starts = np.ones(len(order), bool)  # where a new key starts
    starts[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    return Ranked(order, np.cumsum(starts) - 1)


def weighted(indices: np.ndarray, keys: np.ndarray, weight: float) -> np.ndarray:
    """``indices`` repeated ``floor(weight)`` times, then the ``fraction * n`` (rounded half up) of them
    with the smallest keys (``keys``: uint8 rows), in index order.

    >>> keys = key_rows(b"d", b"a", b"c", b"b")
    >>> weighted(np.arange(4), keys, 2.5).tolist()
    [0, 1, 2, 3, 0, 1, 2, 3, 1, 3]
    >>> weighted(np.arange(4), keys, 0.25).tolist()
    [1]
    """
    whole = math.floor(weight)
    fraction = weight - whole
    extra = math.floor(fraction * len(indices) + 0.5)  # half up (Python's round() goes to even)
    chosen = np.sort(indices[sort_order(keys[indices])[:extra]]) if extra else indices[:0]  # no sort for none
    return np.concatenate([np.tile(indices, whole), chosen]).astype(np.int64)


def deduplicated(keys: dict[str, list[np.ndarray]], dedup: bool, rank: Ranked | None = None
                 ) -> dict[str, list[np.ndarray]]:
    """Per split, per source: the indices of the documents exact dedup keeps (all with ``dedup`` off):
    the first copy of each key, validation first (a training document equal to a validation one is
    dropped), then source by source. ``rank``: :func:`ranked` of ``keys``, where the caller has it.

    >>> kept = deduplicated({"val": [key_rows(b"v"), key_rows()], "train": [key_rows(b"a", b"v", b"a"),
    ...                                                                     key_rows(b"a", b"b")]}, dedup=True)
    >>> [s.tolist() for s in kept["val"]], [s.tolist() for s in kept["train"]]
    ([[0], []], [[0], [1]])
    """
    parts = [source_keys for split in ("val", "train") for source_keys in keys[split]]
    first = np.ones(sum(len(k) for k in parts), bool)
    if dedup:
        rank = ranked(keys) if rank is None else rank
        first[rank.order[1:][rank.key[1:] == rank.key[:-1]]] = False  # a later copy of the key before it
    bounds = np.cumsum([0] + [len(k) for k in parts])
    kept = [np.flatnonzero(first[a:b]).astype(np.int64) for a, b in zip(bounds[:-1], bounds[1:])]
    return {"val": kept[: len(keys["val"])], "train": kept[len(keys["val"]) :]}


def select(keys: dict[str, list[np.ndarray]], weights: Sequence[float], dedup: bool,
           dropped: dict[str, list[np.ndarray]] | None = None, kept: dict[str, list[np.ndarray]] | None = None
           ) -> tuple[dict[str, list[np.ndarray]], dict[str, list[int]]]:
    """Per split (``"train"``, ``"val"``), per source: the indices of the documents to pack, in order
    (a document repeated as its weight says), and the number of exact duplicates dropped.
    ``keys[split][source]``: that source's document keys (uint8 rows, as the spill holds them);
    ``dropped[split][source]``, a boolean per document, drops more (near-duplicates:
    pipeline/pack/near_dup.py) before the weights; ``kept``: :func:`deduplicated` of ``keys`` where the
    caller made it already (the near pass needs it first).

    >>> keys = {"val": [key_rows(b"v"), key_rows()], "train": [key_rows(b"a", b"v", b"a"), key_rows(b"a", b"b")]}
    >>> out, duplicates = select(keys, [1.0, 2.0], dedup=True)
    >>> [s.tolist() for s in out["val"]], [s.tolist() for s in out["train"]], duplicates
    ([[0], []], [[0], [1, 1]], {'val': [0, 0], 'train': [2, 1]})
    """
    kept = deduplicated(keys, dedup) if kept is None else kept
    out: dict[str, list[np.ndarray]] = {}
    duplicates: dict[str, list[int]] = {}
    for split in ("val", "train"):
        out[split], duplicates[split] = [], []
        for i, (source_keys, weight) in enumerate(zip(keys[split], weights)):
            chosen = kept[split][i]
            duplicates[split].append(len(source_keys) - len(chosen))
            if dropped is not None:
                chosen = chosen[~dropped[split][i][chosen]]
            out[split].append(weighted(chosen, source_keys, weight) if split == "train" else chosen)
    return out, duplicates


def exact_overlap(keys: dict[str, list[np.ndarray]], rank: Ranked | None = None) -> list[int]:
    """Per source: its validation documents that have an exact copy among the training documents.
    ``rank``: :func:`ranked` of ``keys``, where the caller has it.

    >>> exact_overlap({"val": [key_rows(b"v", b"w"), key_rows(b"x")], "train": [key_rows(b"a", b"v"), key_rows(b"v")]})
    [1, 0]
    """
    val, train = keys["val"], keys["train"]
    if not sum(len(k) for k in val):
        return [0] * len(val)
    order, key = ranked(keys) if rank is None else rank
    source = np.concatenate([np.full(len(k), i) for i, k in enumerate(val)] + [np.full(len(k), -1) for k in train])[order]
    has_train = np.zeros(key[-1] + 1, bool)
    has_train[key[source < 0]] = True
    return np.bincount(source[(source >= 0) & has_train[key]], minlength=len(val)).tolist()


def counts(lengths: np.ndarray, duplicates: int, selection: np.ndarray) -> dict:
    """What mixing did to one source's split: documents and tokens before it, duplicates dropped,
    documents and tokens packed (after dedup and weight)."""
    return {
        "documents_before": int(len(lengths)),
        "tokens_before": int(lengths.sum()),
        "duplicates": int(duplicates),
        "documents": int(len(selection)),
        "tokens": int(lengths[selection].sum()) if len(selection) else 0,
    }
