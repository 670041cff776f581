"""Shards: tokenized documents -> packed blocks -> Arrow IPC stream files, uncompressed,
memory-mappable.

``pack_split`` reads one split's documents from every source's token spill, plans the blocks
(pipeline/pack.py) and writes them with a ``ShardWriter``. Rows per shard and rows per record batch
are fixed by the block size and ``shard_size_mb``, so the same blocks always give the same bytes.
Each finished shard is fsynced and hashed.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline import report as reporting
from pipeline.contract import sha256_file, shard_schema
from pipeline.faults import crash_point
from pipeline.pack import assemble_block, pack_bfd, pack_wrap, plan_pieces

ROWS_PER_BATCH = 256


class ShardWriter:
    """Append blocks one at a time; files ``<split>-00000.arrow``, ``<split>-00001.arrow``, ..."""

    def __init__(self, directory: Path, split: str, block_size: int, dtype: np.dtype, shard_size_mb: int):
        self.directory = Path(directory)
        self.split = split
        self.block_size = block_size
        self.dtype = np.dtype(dtype)
        self.schema = shard_schema(block_size, self.dtype)
        row_bytes = block_size * (self.dtype.itemsize + 1)
        self.rows_per_shard = max(1, shard_size_mb * 2**20 // row_bytes)
        self.rows_per_batch = min(ROWS_PER_BATCH, self.rows_per_shard)
        self.shards: list[dict] = []
        self._ids: list[np.ndarray] = []
        self._mask: list[np.ndarray] = []
        self._lens: list[list[int]] = []
        self._writer: pa.RecordBatchStreamWriter | None = None
        self._sink = None
        self._rows_in_shard = 0

    def add(self, ids: np.ndarray, mask: np.ndarray, doc_lens: list[int]) -> None:
        self._ids.append(ids)
        self._mask.append(mask)
        self._lens.append(doc_lens)
        if len(self._ids) == self.rows_per_batch or self._rows_in_shard + len(self._ids) == self.rows_per_shard:
            self._flush()

    def close(self) -> list[dict]:
        """Flush and close; returns one ``{file, rows, bytes, sha256}`` per shard."""
        self._flush()
        self._finish_shard()
        return self.shards

    def _flush(self) -> None:
        if not self._ids:
            return
        if self._writer is None:
            path = self.directory / f"{self.split}-{len(self.shards):05d}.arrow"
            self._sink = open(path, "wb")
            self._writer = pa.ipc.new_stream(self._sink, self.schema)
        n = len(self._ids)
        ids = pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate(self._ids).astype(self.dtype, copy=False)), self.block_size)
        mask = pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate(self._mask)), self.block_size)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum([len(lens) for lens in self._lens], out=offsets[1:])
        values = pa.array(np.fromiter((x for lens in self._lens for x in lens), dtype=np.uint32, count=int(offsets[-1])))
        doc_lens = pa.ListArray.from_arrays(pa.array(offsets), values)
        self._writer.write_batch(pa.record_batch([ids, mask, doc_lens], schema=self.schema))
        self._rows_in_shard += n
        self._ids, self._mask, self._lens = [], [], []
        if self._rows_in_shard >= self.rows_per_shard:
            self._finish_shard()

    def _finish_shard(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._sink.flush()
        os.fsync(self._sink.fileno())
        self._sink.close()
        path = Path(self._sink.name)
        self.shards.append({"file": path.name, "rows": self._rows_in_shard, "bytes": path.stat().st_size,
                            "sha256": sha256_file(path)})
        self._writer, self._sink, self._rows_in_shard = None, None, 0


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
    if config.pack.strategy == "bfd":
        pieces, counts = plan_pieces(lengths.tolist(), prompt_lengths.tolist(), block_size, config.pack.overlong)
        blocks = pack_bfd(pieces, block_size)
    else:
        blocks = pack_wrap(lengths.tolist(), block_size)
        counts = None
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
