"""Which split a document goes to, and the one hash of its text: a document is held out for
validation by a hash of its content (``pack.val_fraction``), so appending data never moves an old
document; the same 64-bit blake2b chooses the exactness sample (pipeline/encode/fast/exactness.py)."""

from __future__ import annotations

import hashlib
import math

import numpy as np

from packtrain.pipeline.format.format import Formatted


def is_validation(text: str, val_fraction: float) -> bool:
    """Hold out a document by a hash of its content: appending data never moves old documents."""
    if val_fraction <= 0:
        return False
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < val_fraction * 2**64


def text_digests(encoded: list[bytes]) -> np.ndarray:
    """The 64-bit blake2b of each UTF-8 encoded text, as uint64: the one hash of a document's text, from
    which both its split (:func:`validation_mask`) and the exactness sample (exactness.sampled_mask) follow."""
    return np.frombuffer(b"".join([hashlib.blake2b(text, digest_size=8).digest() for text in encoded]), ">u8").astype(
        np.uint64)


def validation_mask(digests: np.ndarray, val_fraction: float) -> np.ndarray:
    """:func:`is_validation` of many texts at once, given their :func:`text_digests`: one bool each. The
    same comparison with no float rounding (an integer is below x exactly when it is below ceil(x)).

    >>> texts = [f"row {i}" for i in range(1000)]
    >>> digests = text_digests([t.encode("utf-8") for t in texts])
    >>> validation_mask(digests, 0.3).tolist() == [is_validation(t, 0.3) for t in texts]
    True
    """
    if val_fraction <= 0:
        return np.zeros(len(digests), bool)
    below = math.ceil(val_fraction * 2**64)
    if below >= 2**64:
        return np.ones(len(digests), bool)
    return digests < np.uint64(below)


def split_of(docs: list[Formatted], good: list[int], digests: np.ndarray, val_fraction: float) -> np.ndarray:
    """:func:`is_validation` of the documents ``good``: from their text's digest, or of the text that
    chooses their split where that is another (``split_text``: a conversation's last document)."""
    is_val = validation_mask(digests[np.asarray(good, np.int64)], val_fraction)
    for i, k in enumerate(good):
        if docs[k].split_text is not None and docs[k].split_text != docs[k].text:
            is_val[i] = is_validation(docs[k].split_text, val_fraction)
    return is_val
