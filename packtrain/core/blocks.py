"""What a packed block means to a trainer: its attention segments, position ids and labels.

The one definition packtrain's trainer (packtrain/trainer/data/data.py) and ``packtrain.hf`` (any other
trainer: HF Trainer, TRL) both read, so a block trains the same wherever it goes. A shard row
(packtrain/core/shardfile.py) holds ``input_ids``, ``loss_mask`` and ``doc_lens``; from them::

    input_ids     p p p a a E | q b E | _
    loss_mask     0 0 0 1 1 1 | 0 1 1 | 0
    doc_lens      [6, 3]                          (block of 10: one padding token)
    segments      [6, 3, 1]                       the documents, then the padding tail as one more
    position_ids  0 1 2 3 4 5 | 0 1 2 | 0         restart at every segment
    labels        - - - a a E | - b E | -         the token where loss_mask is 1, else -100

(``-`` is -100.) Labels are unshifted (HF convention: ``labels[i]`` is predicted from position
``i - 1``), so a segment's first token is never a target, whatever its mask says: predicting it
would read the previous document. Nothing here imports torch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from packtrain.core.errors import ContractError

IGNORE_INDEX = -100
"""The label of a position that is no target (PyTorch's and HF's ``ignore_index``)."""


def segment_lens(doc_lens: Sequence[int], block_size: int) -> list[int]:
    """The attention segments of a block: its documents, then the padding tail as one more segment.

    >>> segment_lens([3, 2], 6)
    [3, 2, 1]
    """
    lens = [int(n) for n in doc_lens if n > 0]
    padding = block_size - sum(lens)
    if padding < 0:
        raise ContractError(f"doc_lens {lens} sum to more than block_size {block_size}: the shard is corrupt; rebuild")
    return lens + [padding] if padding else lens


def position_ids_from_doc_lens(doc_lens: Sequence[int], block_size: int) -> np.ndarray:
    """0, 1, ... restarting at every segment (document or padding tail, see :func:`segment_lens`).

    >>> position_ids_from_doc_lens([3, 2], 6).tolist()
    [0, 1, 2, 0, 1, 0]
    """
    return positions_of_segments(segment_lens(doc_lens, block_size), block_size)


def positions_of_segments(segments: Sequence[int], block_size: int) -> np.ndarray:
    """Position ids restarting at every segment of :func:`segment_lens`."""
    starts = np.repeat(np.cumsum([0] + list(segments[:-1])), segments)
    return np.arange(block_size, dtype=np.int64) - starts


def targets(mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
    """Where a position is a supervised target: its loss mask is 1 and it does not start a segment.

    >>> targets(np.array([0, 1, 1, 1, 1]), np.array([0, 1, 2, 0, 1])).tolist()
    [False, True, True, False, True]
    """
    return (mask == 1) & (position_ids != 0)


def labels_of(ids: np.ndarray, supervised: np.ndarray) -> np.ndarray:
    """int64 labels: the token id where ``supervised`` (:func:`targets`), else :data:`IGNORE_INDEX`.

    >>> labels_of(np.array([7, 8, 9]), np.array([False, True, True])).tolist()
    [-100, 8, 9]
    """
    return np.where(supervised, ids.astype(np.int64, copy=False), IGNORE_INDEX)
