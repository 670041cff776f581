"""Shards: packed blocks -> Arrow IPC stream files, uncompressed, memory-mappable.

Rows per shard and rows per record batch are fixed by the block size and ``shard_size_mb``, so
the same blocks always give the same bytes. Each finished shard is fsynced and hashed.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.contract import sha256_file, shard_schema

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
