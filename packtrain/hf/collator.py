"""Rows of :func:`packtrain.hf.load_build` into the batch HF's attention paths read, documents kept apart.

What HF's paths read to keep packed documents from attending to each other (transformers 5):

- **sdpa / eager**: ``position_ids`` that restart at every document and *no* ``attention_mask``:
  ``create_causal_mask`` then finds the documents from the restarts and builds the block-diagonal
  causal mask (the path packtrain's own trainer takes on a CPU);
- **flash attention** (``flash_attention_2``/``_3``, the hub's flash kernels): ``cu_seq_lens_q/k``
  (int32, the cumulative segment lengths over the whole batch, from 0) and ``max_length_q/k`` (ints),
  handed to the varlen kernel as they are, with no host sync; without them, position ids are read
  only where the batch is one row (``DataCollatorWithFlattening``'s and TRL's padding-free layout).

:class:`PackedCollator` gives both, from the rows' position ids, and never an attention mask (one would
make the flash path unpad by it and the sdpa path ignore the restarts). Two blocks of 6 holding
documents [3, 2] and [6]::

    input_ids     [[a a a b b .], [c c c c c c]]          int64 [2, 6]    (flatten=True: [1, 12])
    position_ids  [[0 1 2 0 1 0], [0 1 2 3 4 5]]
    labels        as the rows give them (-100 at every segment start: packtrain/core/blocks.py)
    cu_seq_lens_q/k   [0, 3, 5, 6, 12]                    int32
    max_length_q/k    6                                   the block length: a bound on every segment

The bound, not the longest segment, as packtrain's trainer gives it (packtrain.trainer.data.data.collate): the
kernels are exact for any bound >= the longest segment, and a constant one keeps torch.compile from
recompiling for every new longest document.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from packtrain.hf.dataset import InteropError

ROW_COLUMNS = ("input_ids", "labels", "position_ids")


@dataclass(frozen=True)
class PackedCollator:
    """The ``data_collator`` for HF Trainer and TRL's SFTTrainer over :func:`packtrain.hf.load_build`.

    ``flatten``: the batch as one row ``[1, batch x block_size]``, the layout of transformers'
    ``DataCollatorWithFlattening`` and TRL's padding-free collator (what a path that only reads
    position ids of a one-row batch, or a per-row token count like TRL's ``num_tokens``, expects); the
    same documents, positions, labels and boundaries either way. Default: ``[batch, block_size]``.

    ``seq_lengths``: also give the segments' lengths as ``packed_seq_lengths`` (int32), the key Unsloth's
    models read for their block-diagonal attention (with ``flatten``)."""

    flatten: bool = False
    seq_lengths: bool = False

    def __call__(self, features: list[dict]) -> dict:
        if not features:
            raise InteropError("PackedCollator got an empty batch")
        missing = [column for column in ROW_COLUMNS if column not in features[0]]
        if missing:
            raise InteropError(f"PackedCollator needs rows with {', '.join(ROW_COLUMNS)} (missing: {', '.join(missing)}):"
                               " give it the dataset packtrain.hf.load_build returns")
        lengths = {len(feature["input_ids"]) for feature in features}
        if len(lengths) > 1:
            raise InteropError(f"PackedCollator got blocks of {sorted(lengths)} tokens in one batch: every row of a "
                               "build has the build's block_size; do not mix builds in one dataset")
        ids, labels, positions = (torch.from_numpy(np.stack([np.asarray(f[c], dtype=np.int64) for f in features]))
                                  for c in ROW_COLUMNS)
        rows, length = ids.shape
        starts = (positions.reshape(-1) == 0).nonzero().reshape(-1)
        cu_seq_lens = torch.cat([starts, torch.tensor([rows * length])]).to(torch.int32)
        shape = (1, rows * length) if self.flatten else (rows, length)
        batch = {"input_ids": ids.reshape(shape), "labels": labels.reshape(shape), "position_ids": positions.reshape(shape),
                 "cu_seq_lens_q": cu_seq_lens, "cu_seq_lens_k": cu_seq_lens, "max_length_q": length, "max_length_k": length}
        if self.seq_lengths:
            batch["packed_seq_lengths"] = cu_seq_lens.diff()
        return batch
