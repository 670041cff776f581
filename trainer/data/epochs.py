"""Epochs and steps: which sequences every optimizer step trains, as Hugging Face's Trainer cuts them.

An epoch is one pass over all N sequences of the train split (its blocks, or their windows), in a
permutation drawn from (seed, build id, epoch), read in micro-batches of ``b`` sequences by each of W
ranks. Then, as HF ``Trainer._inner_training_loop`` (transformers 5)::

    micro-batches an epoch   M = ceil(N / (b x W))         (per rank; HF: len(train_dataloader))
    steps an epoch           S = ceil(M / a)               (a = gradient_accumulation_steps; at least 1)
    step k < S of an epoch   a micro-batches
    the epoch's last step    M - (S - 1) x a micro-batches: the leftovers, never the next epoch's

Each step's loss is the sum of its token losses over the supervised tokens it holds (the loop's,
HF's ``num_items_in_batch``), so a short last step weighs its tokens as a full one. With ``max_steps``
the epochs follow each other until it is reached; without, ``num_train_epochs x S`` steps. Since
``ceil(ceil(N / bW) / a) = ceil(N / abW)``, S depends on the global batch only, not on the micro-batch
``auto`` measures. Where b x W does not divide N, the last micro-batch (HF: a short one) is filled with
PAD, a sequence that trains nothing (no target, no token counted: data.padding_item), so every
micro-batch keeps its shape (torch.compile) and every rank runs as many forwards (DDP, FSDP).
N = 13, b = 2, a = 4, W = 1::

    epoch 0   [p0 p1][p2 p3][p4 p5][p6 p7] [p8 p9][p10 p11][p12 PAD]   step 1 (4) | step 2 (3)
    epoch 1   another permutation, cut alike                          step 3 (4) | step 4 (3)

Fewer sequences than one global micro-batch train as HF trains them, one short step an epoch: N = 3, b = 4,
W = 1 is ``[p0 p1 p2 PAD]``; with W = 2 and N = 1 rank 1 reads padding only (loss 0, its gradient 0 in DDP's
average, which the loop divides by the global supervised count). Only N = 0 is refused (trainer/run/train.py).
"""

from __future__ import annotations

import hashlib
import math
from typing import Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

PAD = -1
"""The sampler's index of a padding sequence (the dataset returns one that trains nothing)."""


def micro_batches_per_epoch(sequences: int, micro_batch: int, world_size: int = 1) -> int:
    """M: the micro-batches of one epoch, per rank (the last one filled with padding where needed).

    >>> micro_batches_per_epoch(12, 2), micro_batches_per_epoch(13, 2), micro_batches_per_epoch(14, 2, 2)
    (6, 7, 4)
    """
    return math.ceil(sequences / (micro_batch * world_size))


def steps_per_epoch(micro_batches: int, accumulation: int) -> int:
    """S = ceil(M / a), at least 1 (HF's ``num_update_steps_per_epoch``).

    >>> steps_per_epoch(6, 4), steps_per_epoch(8, 4), steps_per_epoch(3, 4)
    (2, 2, 1)
    """
    return max(math.ceil(micro_batches / accumulation), 1)


def epoch_shape(micro_batches: int, accumulation: int) -> str:
    """An epoch's steps, for the run's log line.

    >>> epoch_shape(6, 4)
    '6 micro-batches in 2 steps (1 of 4, then 1 of the 2 left)'
    >>> epoch_shape(8, 4), epoch_shape(3, 4), epoch_shape(1, 4)
    ('8 micro-batches in 2 steps of 4', '3 micro-batches in 1 step of 3', '1 micro-batch in 1 step of 1')
    """
    steps = steps_per_epoch(micro_batches, accumulation)
    last = micro_batches - (steps - 1) * accumulation
    if last == accumulation or steps == 1:
        batches = f"{micro_batches} micro-batch{'es' if micro_batches > 1 else ''}"
        return f"{batches} in {steps} step{'s' if steps > 1 else ''} of {last}"
    return f"{micro_batches} micro-batches in {steps} steps ({steps - 1} of {accumulation}, then 1 of the {last} left)"


def permutation_seed(seed: int, build_id: str, epoch: int) -> int:
    digest = hashlib.sha256(f"packtrain:{seed}:{build_id}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


class BlockSampler(Sampler[int]):
    """A deterministic shuffle of the blocks per (seed, build id, epoch), resumable at any position.

    Iterating yields ``order(epoch)[start:end(start)]`` where ``order`` is this rank's slice of the
    permutation, padded with :data:`PAD` to whole micro-batches of ``batch_size`` on every rank
    (M x batch_size entries per rank: the module docstring). Resuming sets ``start`` and jumps straight
    there (nothing is replayed); a start that is no multiple of the micro-batch (a checkpoint taken with
    another global batch) ends in a micro-batch filled with PAD all the same (:meth:`end`).

    ``rank``/``world_size`` slice the padded permutation for data parallel runs, strided: rank r takes
    positions r, r+W, r+2W, ... With W=2 and a per-rank batch of 2::

        permutation   p0 p1 p2 p3 | p4 p5 p6 p7 | ...
        rank 0        p0    p2    | p4    p6
        rank 1           p1    p3 |    p5    p7

    so the k-th micro-batches of all ranks together hold exactly the blocks of the k-th micro-batch
    of one process with a W times larger batch, and this rank's position ``i`` in its slice is the
    global position ``i x W`` (what a checkpoint stores). Fewer blocks than ``batch_size x W`` is one
    micro-batch an epoch, padded; a rank may then get padding only (it trains nothing, but runs its
    forward as the others do)::

        >>> [list(BlockSampler(1, 0, "b", rank=r, world_size=2, batch_size=2)) for r in range(2)]
        [[0, -1], [-1, -1]]
    """

    def __init__(self, num_blocks: int, seed: int, build_id: str, shuffle: bool = True,
                 rank: int = 0, world_size: int = 1, batch_size: int = 1):
        if num_blocks < 1:
            raise ValueError("no blocks to sample: an epoch needs at least one")
        self.num_blocks, self.seed, self.build_id, self.shuffle = num_blocks, seed, build_id, shuffle
        self.rank, self.world_size, self.batch_size = rank, world_size, batch_size
        self.micro_batches = micro_batches_per_epoch(num_blocks, batch_size, world_size)
        self.per_rank = self.micro_batches * batch_size  # entries of this rank's slice, padding included
        self.epoch, self.start = 0, 0

    def set_position(self, epoch: int, start: int) -> None:
        self.epoch, self.start = epoch, start

    def order(self, epoch: int) -> np.ndarray:
        if self.shuffle:
            perm = np.random.default_rng(permutation_seed(self.seed, self.build_id, epoch)).permutation(self.num_blocks)
        else:
            perm = np.arange(self.num_blocks)
        padded = np.full(self.per_rank * self.world_size, PAD, dtype=perm.dtype)
        padded[:self.num_blocks] = perm
        return padded[self.rank::self.world_size]

    def end(self, start: int) -> int:
        """Where this rank's epoch ends when read from entry ``start`` of its slice: after the whole micro-batches
        that hold the blocks left (``per_rank`` from a multiple of the micro-batch; from another start, past the
        slice, filled with PAD; ``start`` itself when only padding is left).

        >>> sampler = BlockSampler(12, 0, "b", batch_size=4)
        >>> sampler.end(0), sampler.end(4), sampler.end(2), sampler.end(12)
        (12, 12, 14, 12)
        """
        left = max(self.num_blocks - start * self.world_size, 0)
        return start + micro_batches_per_epoch(left, self.batch_size, self.world_size) * self.batch_size

    def __len__(self) -> int:
        return self.end(self.start) - self.start

    def __iter__(self) -> Iterator[int]:
        entries = self.order(self.epoch)[self.start:self.end(self.start)].tolist()
        return iter(entries + [PAD] * (len(self) - len(entries)))


class BatchStream:
    """The optimizer steps' micro-batches, epoch after epoch, cut at every epoch's end (:meth:`window`).

    ``epoch`` and ``position`` (entries of this epoch's padded permutation consumed by the trainer, not
    by prefetching workers, counted over ALL ranks) are what a checkpoint stores; a new stream built
    with them continues exactly there. After an epoch's last step the stream stands at the start of
    the next one (epoch + 1, position 0). A rank has consumed ``position / world_size`` entries of its
    own slice.
    """

    def __init__(self, loader: DataLoader, sampler: BlockSampler, epoch: int = 0, position: int = 0):
        if position % sampler.world_size:
            raise ValueError(f"global position {position} is not a multiple of the world size {sampler.world_size}")
        self.loader, self.sampler = loader, sampler
        self.epoch, self.local = epoch, position // sampler.world_size
        if sampler.end(self.local) == self.local:  # no block left: the end of an epoch (as checkpoints before
            self.epoch, self.local = epoch + 1, 0  # 2026-11-27 stored it)
        self._it = self._start()

    def _start(self):
        self.sampler.set_position(self.epoch, self.local)
        self.stop = self.sampler.end(self.local)  # this rank's entry where the epoch ends
        return iter(self.loader)

    @property
    def position(self) -> int:
        """Entries of this epoch's padded permutation consumed by all ranks together."""
        return self.local * self.sampler.world_size

    @property
    def epochs_done(self) -> float:
        """The epochs trained, with the fraction of the current one (HF's ``state.epoch``: epoch + micro-batches
        consumed / M)."""
        return self.epoch + self.local / self.sampler.per_rank

    def window(self, accumulation: int) -> list[dict[str, torch.Tensor]]:
        """The next optimizer step's micro-batches: ``accumulation`` of them, or the epoch's leftovers when
        fewer are left."""
        if self._it is None:
            self._it = self._start()
        left = (self.stop - self.local) // self.loader.batch_size
        batches = [next(self._it) for _ in range(min(accumulation, left))]
        self.local += sum(len(batch["input_ids"]) for batch in batches)
        if self.local == self.stop:
            if next(self._it, None) is not None:  # ends the iterator (and its workers, when not persistent)
                raise RuntimeError(f"the loader gave more than the epoch's {self.sampler.micro_batches} micro-batches")
            self.epoch, self.local, self._it = self.epoch + 1, 0, None  # the next epoch's starts when needed
        return batches
