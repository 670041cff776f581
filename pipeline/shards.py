"""Shards: tokenized documents -> packed blocks -> Arrow IPC stream files, uncompressed,
memory-mappable.

``pack_split`` reads one split's documents from every source's token spill (pipeline/spill.py; those mixing chose,
pipeline/mix.py, as many times as it chose them), plans the blocks
(pipeline/pack.py) and writes them with the core's ``ShardWriter`` (packtrain/core/shardfile.py). Rows per shard and rows per record batch
are fixed by the block size and ``shard_size_mb``, so the same blocks always give the same bytes.
Each finished shard is fsynced and hashed.
"""

from __future__ import annotations

from bisect import bisect_right
from pathlib import Path

import numpy as np

from packtrain.pipeline import report as reporting
from packtrain.core.shardfile import ShardWriter
from packtrain.core.faults import crash_point
from packtrain.pipeline.pack import assemble_block, pack
from packtrain.pipeline.spill import SourceSpill, concat


def pack_split(config, spills: list[SourceSpill], selections: list[np.ndarray], split: str, dtype, pad_id: int,
               tmp: Path) -> tuple[list[dict], dict]:
    """Pack the documents ``selections[i]`` (indices, repeats allowed: pipeline/mix.py) of ``spills[i]``."""
    block_size = config.pack.block_size
    documents = DocumentView(spills, selections)
    lengths = concat([s.lengths[sel] for s, sel in zip(spills, selections)])
    prompt_lengths = concat([s.prompt_lengths[sel] for s, sel in zip(spills, selections)])
    blocks, counts = pack(lengths.tolist(), prompt_lengths.tolist(), block_size, config.pack.strategy,
                          config.pack.overlong, masks=documents.irregular_masks(lengths, prompt_lengths))
    writer = ShardWriter(tmp, split, block_size, dtype, config.pack.shard_size_mb)
    masks = documents.masks()
    real = supervised = 0
    for block in blocks:
        ids, mask, doc_lens = assemble_block(block, documents, masks, block_size, pad_id, dtype)
        writer.add(ids, mask, doc_lens)
        real += sum(doc_lens)
        supervised += int(mask.sum())
        crash_point("mid_shard")
    shards = writer.close()
    totals = reporting.split_totals(lengths, prompt_lengths, len(blocks), real, supervised, block_size, counts)
    return shards, totals


class DocumentView:
    """``view[doc]``: one packed document's tokens (``view.masks()[doc]``: its loss mask), documents
    numbered across sources in source order through each source's selection, sliced from the
    source's memory-mapped files."""

    def __init__(self, spills: list[SourceSpill], selections: list[np.ndarray]):
        self.spills = spills
        self.selections = selections
        self.first_doc = np.cumsum([0] + [len(sel) for sel in selections])[:-1].tolist()

    def locate(self, doc: int) -> tuple[SourceSpill, int, int]:
        source = bisect_right(self.first_doc, doc) - 1
        spill = self.spills[source]
        local = int(self.selections[source][doc - self.first_doc[source]])
        return spill, int(spill.offsets[local]), int(spill.offsets[local + 1])

    def __getitem__(self, doc: int) -> np.ndarray:
        spill, a, b = self.locate(doc)
        return spill.tokens[a:b]

    def masks(self) -> "MaskView":
        return MaskView(self)

    def irregular_masks(self, lengths: np.ndarray, prompt_lengths: np.ndarray) -> dict[int, np.ndarray]:
        """The masks of the documents whose loss is not on every token from the prompt's end on
        (conversations with several assistant turns), for plan_pieces; the others need none."""
        supervised = concat([s.supervised()[sel] for s, sel in zip(self.spills, self.selections)])
        irregular = np.flatnonzero(supervised != lengths - prompt_lengths)
        return {int(doc): self.masks()[int(doc)] for doc in irregular}


class MaskView:
    """``masks[doc]``: the loss mask of the packed document ``doc`` of a :class:`DocumentView`."""

    def __init__(self, view: DocumentView):
        self.view = view

    def __getitem__(self, doc: int) -> np.ndarray:
        spill, a, b = self.view.locate(doc)
        return spill.masks[a:b]
