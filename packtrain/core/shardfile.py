"""The shard file format, its one writer (:class:`ShardWriter`, which the build's
packtrain/pipeline/pack/shards.py feeds) and its one reader (:func:`open_shard`: the trainer, ``packtrain
inspect`` and the tests).

One Arrow IPC *stream* file per shard, uncompressed, one row per packed block. Shard row (``block_size`` = B, default 2048)::

    input_ids  fixed_size_list<uint16|uint32>[B]   tokens; padding after the last document
    loss_mask  fixed_size_list<uint8>[B]           1 where the token is a supervised target
    doc_lens   list<uint32>                        lengths of the documents (or document pieces)
                                                   packed in the block, in order; the padding is
                                                   B - sum(doc_lens) tokens at the end

Example, B = 10: a 3-token prompt ``p`` with a 2-token answer ``a`` and eos ``E``, then a
second document (prompt ``q``, answer ``b``, eos), then one padding token ``_``::

    input_ids  p p p a a E | q b E | _
    loss_mask  0 0 0 1 1 1 | 0 1 1 | 0
    doc_lens   [6, 3]                      (padding = 10 - 9 = 1 token)

The trainer resets position ids at every document start and never lets a document attend to
another one in the same block.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from packtrain.core.contract import FORMAT_VERSION
from packtrain.core.hashing import sha256_file
from packtrain.core.errors import ContractError

def shard_schema(block_size: int, dtype: np.dtype) -> pa.Schema:
    token_type = pa.uint16() if np.dtype(dtype) == np.uint16 else pa.uint32()
    return pa.schema(
        [
            pa.field("input_ids", pa.list_(token_type, block_size), nullable=False),
            pa.field("loss_mask", pa.list_(pa.uint8(), block_size), nullable=False),
            pa.field("doc_lens", pa.list_(pa.uint32()), nullable=False),
        ],
        metadata={"packtrain.format_version": str(FORMAT_VERSION), "packtrain.block_size": str(block_size)},
    )


ROWS_PER_BATCH = 256


def arrow_view(values: np.ndarray) -> pa.Array:
    """A 1-d numpy array of fixed-width numbers as an Arrow array without nulls, over the same
    memory. ``pa.array(ndarray)`` gives the same array, but its first call imports pandas to probe
    the input (0.4-0.5 s of a build; docs/BENCHMARKS.md)."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


class ShardWriter:
    """Append blocks (one or many at a time); files ``<split>-00000.arrow``, ``<split>-00001.arrow``, ..."""

    def __init__(self, directory: Path, split: str, block_size: int, dtype: np.dtype, shard_size_mb: int,
                 rows_per_shard: int | None = None, rows_per_batch: int = ROWS_PER_BATCH):
        self.directory = Path(directory)
        self.split = split
        self.block_size = block_size
        self.dtype = np.dtype(dtype)
        self.schema = shard_schema(block_size, self.dtype)
        row_bytes = block_size * (self.dtype.itemsize + 1)
        self.rows_per_shard = rows_per_shard or max(1, shard_size_mb * 2**20 // row_bytes)
        self.rows_per_batch = min(rows_per_batch, self.rows_per_shard)
        self.shards: list[dict] = []
        self._ids: list[np.ndarray] = []  # [rows, block_size] chunks of the record batch being filled
        self._mask: list[np.ndarray] = []
        self._lens: list[list[int]] = []  # doc_lens of each of its rows
        self._rows = 0  # rows in the record batch being filled
        self._writer: pa.RecordBatchStreamWriter | None = None
        self._sink = None
        self._rows_in_shard = 0
        self._sealer: ThreadPoolExecutor | None = None  # each finished shard's fsync and sha256 (:func:`seal`)
        self._sealed: list[Future] = []

    def add(self, ids: np.ndarray, mask: np.ndarray, doc_lens: list[int]) -> None:
        """One block."""
        self.add_rows(ids[None], mask[None], [doc_lens])

    def add_rows(self, ids: np.ndarray, mask: np.ndarray, doc_lens: list[list[int]]) -> None:
        """Blocks ``ids[i]``, ``mask[i]`` ([rows, block_size] each) with ``doc_lens[i]``: the same bytes
        as adding them one by one, each record batch and shard cut at the same row."""
        at = 0
        while at < len(ids):
            room = min(self.rows_per_batch, self.rows_per_shard - self._rows_in_shard) - self._rows
            take = min(room, len(ids) - at)
            self._ids.append(ids[at : at + take])
            self._mask.append(mask[at : at + take])
            self._lens.extend(doc_lens[at : at + take])
            self._rows += take
            at += take
            if take == room:
                self._flush()

    def close(self) -> list[dict]:
        """Flush and close; returns one ``{file, rows, bytes, sha256}`` per shard, each on disk (fsynced)."""
        self._flush()
        self._finish_shard()
        if self._sealer is not None:
            try:
                for shard, sealed in zip(self.shards, self._sealed):
                    shard.update(sealed.result())
            finally:
                self._sealer.shutdown()
        return self.shards

    def _flush(self) -> None:
        if not self._rows:
            return
        if self._writer is None:
            path = self.directory / f"{self.split}-{len(self.shards):05d}.arrow"
            self._sink = open(path, "wb")
            self._writer = pa.ipc.new_stream(self._sink, self.schema)
        n = self._rows
        ids = np.concatenate(self._ids).reshape(-1).astype(self.dtype, copy=False)
        ids = pa.FixedSizeListArray.from_arrays(arrow_view(ids), self.block_size)
        mask = pa.FixedSizeListArray.from_arrays(arrow_view(np.concatenate(self._mask).reshape(-1)), self.block_size)
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum([len(lens) for lens in self._lens], out=offsets[1:])
        values = np.fromiter((x for lens in self._lens for x in lens), dtype=np.uint32, count=int(offsets[-1]))
        doc_lens = pa.ListArray.from_arrays(arrow_view(offsets), arrow_view(values))
        self._writer.write_batch(pa.record_batch([ids, mask, doc_lens], schema=self.schema))
        self._rows_in_shard += n
        self._ids, self._mask, self._lens, self._rows = [], [], [], 0
        if self._rows_in_shard >= self.rows_per_shard:
            self._finish_shard()

    def _finish_shard(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._sink.flush()
        if self._sealer is None:
            self._sealer = ThreadPoolExecutor(1, thread_name_prefix="seal-shard")
        self.shards.append({"file": Path(self._sink.name).name, "rows": self._rows_in_shard})
        self._sealed.append(self._sealer.submit(seal, self._sink))  # while the next shard is packed and written
        self._writer, self._sink, self._rows_in_shard = None, None, 0


def seal(sink) -> dict:
    """fsync and close a finished shard's file; its ``bytes`` and ``sha256``. In a thread of its own
    (both release the GIL): a 1M-row build's 856 MB of shards cost its process 0.8 s of hashing and
    the disk's fsyncs, now beside the packing, not in its way."""
    os.fsync(sink.fileno())
    sink.close()
    path = Path(sink.name)
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


@dataclass
class ShardBlocks:
    """The blocks of one memory-mapped shard, as zero-copy numpy views per record batch (no token
    is read until it is used); ``starts[i]`` is the first row of batch ``i``."""

    starts: np.ndarray
    input_ids: list[np.ndarray]  # [rows of the batch, B]
    loss_mask: list[np.ndarray]  # [rows of the batch, B]
    doc_offsets: list[np.ndarray]
    doc_values: list[np.ndarray]

    def __len__(self) -> int:
        return int(self.starts[-1])

    def block(self, row: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(input_ids [B], loss_mask [B], doc_lens) of one block: views, nothing copied."""
        if not 0 <= row < len(self):
            raise IndexError(f"block {row} out of range (0..{len(self) - 1})")
        b = int(np.searchsorted(self.starts, row, side="right")) - 1
        r = row - int(self.starts[b])
        offsets = self.doc_offsets[b]
        return self.input_ids[b][r], self.loss_mask[b][r], self.doc_values[b][offsets[r]:offsets[r + 1]]

    def filled(self) -> np.ndarray:
        """Document tokens of every block (the rest of a block is padding, after its documents); int64 [rows]."""
        parts = []
        for offsets, values in zip(self.doc_offsets, self.doc_values):
            running = np.concatenate([[0], np.cumsum(values, dtype=np.int64)])
            parts.append(running[offsets[1:]] - running[offsets[:-1]])
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
        """Every block at once: (input_ids [rows, B], loss_mask [rows, B], doc_lens per block)."""
        blocks = [self.block(row) for row in range(len(self))]
        width = self.input_ids[0].shape[1] if self.input_ids else 0
        return (np.stack([b[0] for b in blocks]) if blocks else np.zeros((0, width), np.uint16),
                np.stack([b[1] for b in blocks]) if blocks else np.zeros((0, width), np.uint8),
                [b[2].tolist() for b in blocks])


# The Arrow types a shard's columns hold, as numpy reads their values buffer.
_NUMPY_TYPES = {pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.int32(): np.int32}


def _view(array: pa.Array) -> np.ndarray:
    """The values of a primitive Arrow array without nulls, as a numpy view of its buffer (no copy).
    pyarrow's own ``to_numpy`` imports pandas where it is installed: 0.3 CPU s of every process that
    opens a shard, the trainer's start-up among them."""
    dtype = _NUMPY_TYPES.get(array.type)
    if dtype is None or array.null_count:
        raise ValueError(f"a column of {array.type} with {array.null_count} nulls, not {sorted(map(str, _NUMPY_TYPES))} without")
    itemsize = np.dtype(dtype).itemsize
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * itemsize)


def open_shard(path: str | os.PathLike, block_size: int) -> ShardBlocks:
    """Memory-map one shard; a file that is not an Arrow stream of ``block_size`` blocks is a ContractError."""
    try:
        batches = list(pa.ipc.open_stream(pa.memory_map(str(path), "r")))
        shard = ShardBlocks(np.zeros(len(batches) + 1, dtype=np.int64), [], [], [], [])
        for i, batch in enumerate(batches):
            rows = batch.num_rows
            shard.starts[i + 1] = shard.starts[i] + rows
            for name, views in (("input_ids", shard.input_ids), ("loss_mask", shard.loss_mask)):
                views.append(_view(batch.column(name).flatten()).reshape(rows, block_size))
            doc_lens = batch.column("doc_lens")
            shard.doc_offsets.append(_view(doc_lens.offsets))
            shard.doc_values.append(_view(doc_lens.values))
    except (pa.ArrowInvalid, OSError, KeyError, ValueError) as e:
        if not os.path.lexists(path):  # not corrupt: gone (a build removed while a run reads it)
            raise ContractError(f"shard {path} is missing: its build was removed or changed after it was checked "
                                f"(keep a build while a run trains on it); rebuild it (the same inputs give the same "
                                f"build id), then continue a stopped run with --resume auto") from None
        raise ContractError(f"shard {path} cannot be read as packed blocks of {block_size} tokens ({e}): "
                         "corrupt; rebuild it") from None
    return shard
