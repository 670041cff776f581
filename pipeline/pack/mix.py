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


def unique(keys: Sequence[bytes], seen: set[bytes]) -> np.ndarray:
    """Indices of the documents whose key is not in ``seen`` nor earlier in ``keys``; adds their keys to ``seen``.

    >>> seen = {b"x"}
    >>> unique([b"a", b"x", b"a", b"b"], seen).tolist(), sorted(seen)
    ([0, 3], [b'a', b'b', b'x'])
    """
    keep = []
    for i, key in enumerate(keys):
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return np.asarray(keep, dtype=np.int64)


def weighted(indices: np.ndarray, keys: Sequence[bytes], weight: float) -> np.ndarray:
    """``indices`` repeated ``floor(weight)`` times, then the ``fraction * n`` (rounded half up) of them
    with the smallest keys, in index order.

    >>> keys = [b"d", b"a", b"c", b"b"]
    >>> weighted(np.arange(4), keys, 2.5).tolist()
    [0, 1, 2, 3, 0, 1, 2, 3, 1, 3]
    >>> weighted(np.arange(4), keys, 0.25).tolist()
    [1]
    """
    whole = math.floor(weight)
    fraction = weight - whole
    extra = math.floor(fraction * len(indices) + 0.5)  # half up (Python's round() goes to even)
    chosen = sorted(sorted(indices.tolist(), key=lambda i: keys[i])[:extra]) if extra else []  # no sort for none
    return np.concatenate([np.tile(indices, whole), np.asarray(chosen, dtype=np.int64)]).astype(np.int64)


def deduplicated(keys: dict[str, list[list[bytes]]], dedup: bool) -> dict[str, list[np.ndarray]]:
    """Per split, per source: the indices of the documents exact dedup keeps (all with ``dedup`` off).
    Validation first: a training document equal to a validation one is dropped.

    >>> kept = deduplicated({"val": [[b"v"], []], "train": [[b"a", b"v", b"a"], [b"a", b"b"]]}, dedup=True)
    >>> [s.tolist() for s in kept["val"]], [s.tolist() for s in kept["train"]]
    ([[0], []], [[0], [1]])
    """
    seen: set[bytes] = set()
    return {split: [unique(source_keys, seen) if dedup else np.arange(len(source_keys), dtype=np.int64)
                    for source_keys in keys[split]] for split in ("val", "train")}


def select(keys: dict[str, list[list[bytes]]], weights: Sequence[float], dedup: bool,
           dropped: dict[str, list[np.ndarray]] | None = None, kept: dict[str, list[np.ndarray]] | None = None
           ) -> tuple[dict[str, list[np.ndarray]], dict[str, list[int]]]:
    """Per split (``"train"``, ``"val"``), per source: the indices of the documents to pack, in order
    (a document repeated as its weight says), and the number of exact duplicates dropped.
    ``keys[split][source]`` lists that source's document keys; ``dropped[split][source]``, a boolean per
    document, drops more (near-duplicates: pipeline/pack/near_dup.py) before the weights; ``kept``:
    :func:`deduplicated` of ``keys`` where the caller made it already (the near pass needs it first).

    >>> keys = {"val": [[b"v"], []], "train": [[b"a", b"v", b"a"], [b"a", b"b"]]}
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


def exact_overlap(keys: dict[str, list[list[bytes]]]) -> list[int]:
    """Per source: its validation documents that have an exact copy among the training documents.

    >>> exact_overlap({"val": [[b"v", b"w"], [b"x"]], "train": [[b"a", b"v"], [b"v"]]})
    [1, 0]
    """
    train = {key for source_keys in keys["train"] for key in source_keys}
    return [sum(key in train for key in source_keys) for source_keys in keys["val"]]


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
