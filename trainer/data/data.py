"""Shards -> batches: a map-style Dataset over the memory-mapped blocks, and a loader (the sampler that
orders them into epochs and steps: trainer/data/epochs.py).

The trainer reads the build's Arrow shards and nothing else. One row of a shard is one packed block
of ``B`` tokens (see ``packtrain/core/contract.py``). For every block the dataset returns::

    input_ids     p p p a a E | q b E | _         int64 [B]
    position_ids  0 1 2 3 4 5 | 0 1 2 | 0         int64 [B]   reset at every document start
    labels        - - - a a E | - b E | -         int64 [B]   token id where loss_mask == 1, else -100

(``-`` is -100.) The model's loss shifts labels by one: ``labels[i]`` is predicted from position
``i - 1``. A document's first token is therefore never a target (its label is forced to -100 even
if the mask says otherwise: predicting it would read the previous document). The padding after the
last document gets its own run of position ids, so it is a separate "document" nobody attends to.
Segments, positions and labels are defined once, in packtrain/core/blocks.py, which packtrain.hf
reads too: HF Trainer and TRL get the same labels from a build as this trainer.

With ``train.max_seq_length`` L shorter than the block (the cpu profile: 512 of 2048), every block
is read as ``ceil(B / L)`` windows of L tokens, each an item of its own: the documents are cut at
the window edges, positions restart there, no document attends across an edge, and the loss mask is
cut alike (a cut document's first token in the next window is not a target: nothing before it in
the window belongs to it). Documents [700, 1348] in a block of 2048, L = 512::

    block      |0 ........ 700|700 ......................................... 2048|
    windows    |0      512|512       1024|1024      1536|1536      2048|
    doc_lens   [512]      [188, 324]      [512]          [512]

The last window is padded up to L when L does not divide B; a window of padding only (the tail of
a block whose documents end before it) is left out. The build is the same whatever L.

Shards are opened lazily, in the process that reads them (each DataLoader worker after the fork):
``__init__`` stores paths only; the first ``__getitem__`` memory-maps the file and keeps numpy
views of the record batches (zero-copy, no token is read until it is used).
"""

from __future__ import annotations

import logging
import signal
import weakref
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, Subset
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from packtrain.core.errors import PacktrainError
from packtrain.core.machine import affinity_cpus

# a block's segments, positions and labels: defined once in the core, for packtrain.hf as well; importable from here
from packtrain.core.blocks import (IGNORE_INDEX, labels_of, position_ids_from_doc_lens,  # noqa: F401
                                   positions_of_segments, segment_lens, targets)
from packtrain.core.contract import Manifest
from packtrain.core.shardfile import ShardBlocks, open_shard
from packtrain.trainer.model.attention import attention_inputs
from packtrain.trainer.run.distributed import World
# the train loader's sampler and stream live in trainer/data/epochs.py; importable from here as before
from packtrain.trainer.data.epochs import PAD, BatchStream, BlockSampler, permutation_seed  # noqa: F401

log = logging.getLogger("packtrain.train")


def window_doc_lens(doc_lens: Sequence[int], block_size: int, seq_length: int) -> list[list[int]]:
    """The documents of each window of ``seq_length`` tokens of a block (``ceil(block_size /
    seq_length)`` windows): every document cut at the window edges. Padding is what a window's
    lengths leave; the last window counts ``seq_length`` tokens, padded past the block's end.

    >>> window_doc_lens([700, 1348], 2048, 512)
    [[512], [188, 324], [512], [512]]
    >>> window_doc_lens([3, 2], 6, 4)   # window 1: the block's padding token, then 2 past its end
    [[3, 1], [1]]
    """
    return [doc_lens_in(doc_lens, start, seq_length) for start in range(0, block_size, seq_length)]


def doc_lens_in(doc_lens: Sequence[int], start: int, length: int) -> list[int]:
    """The lengths of the documents' parts inside tokens ``[start, start + length)`` of a block."""
    lens = np.asarray([int(n) for n in doc_lens if n > 0], dtype=np.int64)
    ends = np.cumsum(lens)
    overlap = np.minimum(ends, start + length) - np.maximum(ends - lens, start)
    return overlap[overlap > 0].tolist()


def cut_window(ids: np.ndarray, mask: np.ndarray, doc_lens: Sequence[int], window: int,
               seq_length: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Window ``window`` of a block (:func:`window_doc_lens`): its tokens, loss mask and documents;
    the last window padded with token 0 and mask 0 up to ``seq_length``."""
    start = window * seq_length
    ids, mask = ids[start:start + seq_length], mask[start:start + seq_length]
    if len(ids) < seq_length:
        ids, mask = np.pad(ids, (0, seq_length - len(ids))), np.pad(mask, (0, seq_length - len(mask)))
    return ids, mask, doc_lens_in(doc_lens, start, seq_length)


class BlockDataset(Dataset):
    """Map-style dataset over the sequences of one split (``train`` or ``val``) of a build: its blocks,
    or with ``seq_length`` shorter than the block, every block's windows in order (at most ``k =
    ceil(block_size / seq_length)`` per block: those holding a document token; ``__init__`` then reads
    the blocks' document lengths once, and keeps no shard open).

    Item ``i`` is a dict of int64 tensors ``input_ids``, ``labels``, ``position_ids`` (all ``[L]``, L
    the sequence length), ``seq_lens`` (int32, the sequence's attention segments: :func:`segment_lens`)
    and scalars ``n_tokens`` (non-padding tokens), ``n_sup`` (supervised targets) and ``attn_pairs``
    (sum over documents of n*(n+1)/2: causal attention pairs, for the FLOP count).
    """

    def __init__(self, build_dir: str | Path, manifest: Manifest, split: str, seq_length: int | None = None):
        shards = manifest.train if split == "train" else manifest.val
        self.paths = [Path(build_dir) / s.file for s in shards]  # paths only: opened lazily per process
        self.rows = np.cumsum([0] + [s.rows for s in shards])
        self.block_size = manifest.block_size
        self.seq_length = min(seq_length or self.block_size, self.block_size)
        self.windows = -(-self.block_size // self.seq_length)  # at most, per block
        self._open: dict[int, ShardBlocks] = {}
        self.starts = None  # windows: the first item of every block (None: an item is a block)
        if self.windows > 1:
            filled = [open_shard(path, self.block_size).filled() for path in self.paths]  # views, dropped here
            per_block = -(-np.concatenate([np.zeros(0, np.int64), *filled]) // self.seq_length)
            self.starts = np.concatenate([[0], np.cumsum(per_block)])

    @property
    def blocks(self) -> int:
        return int(self.rows[-1])

    def __len__(self) -> int:
        return self.blocks if self.starts is None else int(self.starts[-1])

    def items_of_blocks(self, first: int, stop: int) -> range:
        """The items (blocks, or their windows) of blocks ``first`` to ``stop - 1``."""
        return range(first, stop) if self.starts is None else range(int(self.starts[first]), int(self.starts[stop]))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"{'block' if self.windows == 1 else 'window'} {index} out of range (0..{len(self) - 1})")
        block, window = index, 0
        if self.starts is not None:
            block = int(np.searchsorted(self.starts, index, side="right")) - 1
            window = index - int(self.starts[block])
        s = int(np.searchsorted(self.rows, block, side="right")) - 1
        if s not in self._open:
            self._open[s] = open_shard(self.paths[s], self.block_size)
        ids, mask, doc_lens = self._open[s].block(block - int(self.rows[s]))
        if self.windows > 1:
            ids, mask, doc_lens = cut_window(ids, mask, doc_lens, window, self.seq_length)
        return sequence_item(ids, mask, doc_lens, self.seq_length)


def sequence_item(ids: np.ndarray, mask: np.ndarray, doc_lens, length: int) -> dict[str, torch.Tensor]:
    """The item of one sequence (a block or a window): see :class:`BlockDataset`."""
    ids = ids.astype(np.int64)  # the one copy: uint16/uint32 -> int64
    segments = segment_lens(doc_lens, length)
    position_ids = positions_of_segments(segments, length)
    supervised = targets(mask, position_ids)
    labels = labels_of(ids, supervised)
    n = np.asarray(doc_lens, dtype=np.int64)
    return {
        "input_ids": torch.from_numpy(ids),
        "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(position_ids),
        "seq_lens": torch.tensor(segments, dtype=torch.int32),
        "n_tokens": torch.tensor(int(n.sum())),
        "n_sup": torch.tensor(int(supervised.sum())),
        "attn_pairs": torch.tensor(int((n * (n + 1) // 2).sum())),
    }


def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack blocks (all have the same length); per-block counts become [batch] tensors.

    The blocks' attention segments become what varlen attention takes (trainer/model/attention.py), made
    here on the CPU so no training step syncs with the GPU for them: ``cu_seq_lens`` (int32, the
    cumulative segment lengths over the whole micro-batch, starting at 0) and ``max_length`` (a 0-d
    tensor: the block length, a bound on every segment). The kernel is exact for any bound >= the
    longest segment; a constant one keeps torch.compile from recompiling for every new longest
    document (measured: the exact maximum made compilation run past 150 s on an H100, the constant
    one compiles once). Blocks of 6 holding documents [3, 2] and [6]::

        seq_lens      [3, 2, 1] [6]
        cu_seq_lens   [0, 3, 5, 6, 12]
        max_length    6

    Likewise ``sup_index`` (int64): the positions of the micro-batch, counted over its flattened
    ``[B, T]``, whose next token is a supervised target, for the loss (trainer/loss.py) to gather the
    hidden states it needs without a ``nonzero`` on the GPU (a host sync per micro-batch). Labels
    ``[- a b | - - c]`` in blocks of 3: targets ``[a b - | - c -]``, ``sup_index`` ``[0, 1, 4]``.
    """
    batch = {key: torch.stack([item[key] for item in items]) for key in items[0] if key != "seq_lens"}
    segments = torch.cat([item["seq_lens"] for item in items])
    batch["cu_seq_lens"] = torch.nn.functional.pad(segments.cumsum(0, dtype=torch.int32), (1, 0))
    batch["max_length"] = torch.tensor(len(items[0]["position_ids"]))
    if "labels" in batch:
        targets = torch.nn.functional.pad(batch["labels"][:, 1:], (0, 1), value=IGNORE_INDEX)
        batch["sup_index"] = (targets.flatten() != IGNORE_INDEX).nonzero().squeeze(1)
    return batch


def to_device(batch: dict[str, torch.Tensor], device: torch.device,
              attention=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, dict]:
    """What the forward of a collated batch needs on ``device`` (copied without blocking, so no host sync):
    input ids, position ids, labels, the supervised positions (``sup_index``: :func:`collate`; None for a
    batch without it), and the model's attention keyword arguments for ``attention`` (the run's
    :class:`packtrain.trainer.model.attention.AttentionChoice`; see :func:`packtrain.trainer.model.attention.attention_inputs`)."""
    sup_index = batch.get("sup_index")
    return (batch["input_ids"].to(device, non_blocking=True), batch["position_ids"].to(device, non_blocking=True),
            batch["labels"].to(device, non_blocking=True),
            sup_index.to(device, non_blocking=True) if sup_index is not None else None,
            attention_inputs(batch, device, attention))


def make_loader(dataset: Dataset, sampler: Sampler | None, batch_size: int, train_config,
                device: torch.device, drop_last: bool, seed: int, num_workers: int | None = None) -> DataLoader:
    """DataLoader with the configured workers, prefetching, pinning (CUDA only) and persistence.

    ``sampler`` None reads in order (validation). ``num_workers`` overrides the configured count.
    """
    workers = train_config.dataloader_num_workers if num_workers is None else num_workers
    cpus = affinity_cpus()
    if workers > cpus:
        log.info("dataloader_num_workers %d > %d CPUs on this machine: using %d workers", workers, cpus, cpus)
        workers = cpus
    return Loader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=collate,
        drop_last=drop_last,
        num_workers=workers,
        prefetch_factor=train_config.dataloader_prefetch_factor if workers > 0 else None,
        persistent_workers=train_config.dataloader_persistent_workers and workers > 0,
        pin_memory=train_config.dataloader_pin_memory and device.type == "cuda",
        # A private generator: creating an iterator must not draw from the global torch RNG, or a
        # resumed run (which creates its iterator at a different step) would diverge.
        generator=torch.Generator().manual_seed(seed),
        worker_init_fn=leave_signals_to_the_trainer if workers > 0 else None,
    )


def leave_signals_to_the_trainer(worker_id: int) -> None:
    """In each data worker: ignore SIGINT and SIGTERM. Ctrl-C reaches the whole process group and a scheduler's
    SIGTERM often every process of the job; the training process answers them (a checkpoint at the end of the
    step: trainer/run/interrupts.py), and may still read a batch or evaluate before it stops: a worker that died of
    the signal would fail that. Workers still end with the training process (torch's watchdog)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class Loader(DataLoader):
    """A DataLoader whose worker processes :func:`stop_workers` ends wherever its iterators are held, and whose
    workers' errors reach the trainer as raised.

    torch ends an iterator's workers when the iterator is collected. One a failed run still holds (the failure's
    traceback holds the frames that hold it: an epoch's iterator in the train stream, an evaluation's) lived on to
    the interpreter's exit, where multiprocessing terminates and joins its workers, which ignore SIGTERM
    (:func:`leave_signals_to_the_trainer`): a run whose build was removed under it failed, then hung for ever.
    And a worker's packtrain error or OSError (a shard gone) came back as torch's ``Caught ContractError in
    DataLoader worker process 0. Original Traceback ...``: a traceback on the console; it is now raised again
    with its own one-line message."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.live: weakref.WeakSet = weakref.WeakSet()  # every iterator with worker processes not yet collected

    def _get_iterator(self):
        if self.num_workers == 0:
            return super()._get_iterator()
        self.check_worker_number_rationality()
        iterator = _WorkersIterator(self)
        self.live.add(iterator)
        return iterator


class _WorkersIterator(_MultiProcessingDataLoaderIter):
    """torch's iterator over worker processes; a worker's :class:`PacktrainError` or ``OSError`` raised again
    with the message it was raised with (:func:`raised_message`)."""

    def _process_data(self, data, worker_idx):
        try:
            return super()._process_data(data, worker_idx)
        except (PacktrainError, OSError) as e:
            message = raised_message(getattr(data, "exc_msg", ""), type(e))
            if message is None:
                raise
            raise type(e)(message) from None


def raised_message(traceback_text: str, kind: type) -> str | None:
    """The message of the ``kind`` exception whose formatted traceback (``traceback.format_exception``'s
    text, as a DataLoader worker sends it) is ``traceback_text``; None where its last line is not one.

    >>> raised_message("Traceback (most recent call last):\\n  File ...\\nOSError: [Errno 2] no such file\\n", OSError)
    '[Errno 2] no such file'
    """
    head = f"{kind.__qualname__}: " if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}: "
    at = traceback_text.rfind("\n" + head)
    return traceback_text[at + 1 + len(head):].rstrip("\n") if at >= 0 else None


def stop_workers(loaders: list) -> None:
    """End the worker processes of ``loaders`` now: every iterator's (:class:`Loader`), held anywhere, the
    persistent one included. torch ends them when an iterator is collected, which a failure's traceback or a
    reference cycle can put off past the interpreter's exit; there multiprocessing terminates and joins them,
    and a worker ignores SIGTERM (:func:`leave_signals_to_the_trainer`): a finished run hung for ever after its
    last line (seen 2026-12-06, a 5-step CPU run of the sql expert), and so did a run that failed reading a
    shard (2026-12-06, attack 52)."""
    for loader in loaders:
        for iterator in list(getattr(loader, "live", ())):
            iterator._shutdown_workers()
        iterator = getattr(loader, "_iterator", None)  # where a persistent-workers loader keeps its workers
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
            loader._iterator = None


def eval_slice(val_set: BlockDataset, train, world: World, pad: bool = False) -> Dataset:
    """This rank's val blocks: of the first ``max_eval_batches x per_device_eval_batch_size`` blocks (all
    of them when unset), every W-th from ``rank``; the ranks together evaluate exactly what one process
    evaluates, and packtrain.trainer.run.distributed.reduce_eval sums their losses and token counts.

    ``pad`` (FSDP, where every forward is a collective): every rank gets as many blocks as rank 0, the
    largest slice, so all run the same number of forwards; the padding repeats block 0 with no
    supervised target (it adds nothing to the loss or the token count)."""
    n = len(val_set)
    if train.max_eval_batches is not None:
        n = min(n, train.max_eval_batches * train.per_device_eval_batch_size)
    indices = range(world.rank, n, world.world_size)
    if not pad or not world.enabled:
        return Subset(val_set, indices)
    return _PaddedSlice(val_set, list(indices), len(range(0, n, world.world_size)))


class _PaddedSlice(Dataset):
    """``indices`` of ``data``, then copies of block 0 without supervised targets up to ``length`` items."""

    def __init__(self, data: Dataset, indices: list[int], length: int):
        self.data, self.indices, self.length = data, indices, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict:
        if i < len(self.indices):
            return self.data[self.indices[i]]
        return padding_item(self.data)


class PaddedBlocks(Dataset):
    """``data`` whose index :data:`packtrain.trainer.data.epochs.PAD` is :func:`padding_item`: what the train
    loader reads, the sampler filling an epoch's last micro-batch with PAD (trainer/data/epochs.py)."""

    def __init__(self, data: Dataset):
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        return padding_item(self.data) if i == PAD else self.data[i]


def padding_item(data: Dataset) -> dict[str, torch.Tensor]:
    """A sequence that trains nothing: item 0's tokens and segments (one shape, one attention layout),
    no supervised target and no token, attention pair counted (no loss, no gradient, no throughput)."""
    item = dict(data[0])
    item["labels"] = torch.full_like(item["labels"], IGNORE_INDEX)
    for key in ("n_sup", "n_tokens", "attn_pairs"):
        item[key] = torch.zeros_like(item[key])
    return item
