"""Shards: tokenized documents -> packed blocks -> Arrow IPC stream files, uncompressed,
memory-mappable.

``pack_split`` reads one split's documents from every source's token spill, plans the blocks
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

def concat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0, np.int64)


class SourceSpill:
    """One source's documents of one split: tokens memory-mapped, lengths in memory."""

    def __init__(self, directory: Path, split: str, dtype):
        self.lengths = np.load(directory / f"{split}.lengths.npy")
        self.prompt_lengths = np.load(directory / f"{split}.prompts.npy")
        path = directory / f"{split}.tokens"
        # a plain ndarray view of the mapping: slicing an np.memmap goes through Python-level hooks
        self.tokens = np.asarray(np.memmap(path, dtype=dtype, mode="r")) if path.stat().st_size else np.zeros(0, dtype)


def pack_split(config, spills: list[SourceSpill], split: str, dtype, pad_id: int, tmp: Path) -> tuple[list[dict], dict]:
    block_size = config.pack.block_size
    lengths = concat([s.lengths for s in spills])
    prompt_lengths = concat([s.prompt_lengths for s in spills])
    blocks, counts = pack(lengths.tolist(), prompt_lengths.tolist(), block_size, config.pack.strategy,
                          config.pack.overlong)
    documents = DocumentView(spills)
    writer = ShardWriter(tmp, split, block_size, dtype, config.pack.shard_size_mb)
    real = supervised = 0
    for block in blocks:
        ids, mask, doc_lens = assemble_block(block, documents, prompt_lengths, block_size, pad_id, dtype)
        writer.add(ids, mask, doc_lens)
        real += sum(doc_lens)
        supervised += int(mask.sum())
        crash_point("mid_shard")
    shards = writer.close()
    totals = reporting.split_totals(lengths, prompt_lengths, len(blocks), real, supervised, block_size, counts)
    return shards, totals


class DocumentView:
    """``view[doc]``: one document's tokens (documents numbered across sources, in source order),
    sliced from its source's memory-mapped token file."""

    def __init__(self, spills: list[SourceSpill]):
        self.spills = spills
        self.first_doc = np.cumsum([0] + [len(s.lengths) for s in spills])[:-1].tolist()
        self.offsets = []
        for s in spills:
            offsets = np.zeros(len(s.lengths) + 1, dtype=np.int64)
            np.cumsum(s.lengths, out=offsets[1:])
            self.offsets.append(offsets)

    def __getitem__(self, doc: int) -> np.ndarray:
        source = bisect_right(self.first_doc, doc) - 1
        local = doc - self.first_doc[source]
        offsets = self.offsets[source]
        return self.spills[source].tokens[offsets[local] : offsets[local + 1]]
