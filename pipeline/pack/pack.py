"""Packing: which pieces of which documents go into which block. Pure functions on lengths.

A *piece* is a slice ``(doc, start, stop)`` of one tokenized document; a *block* is a list of
pieces whose lengths sum to at most ``block_size``. The rest of a block is padding. Nothing here
touches tokens: ``assemble_block`` turns a block into arrays once the plan is made.

The one entry point is :func:`pack` (lengths in, blocks out); two strategies (``pack.strategy``).
Each document is a prompt (``p``, never a target) and an answer (``a``, supervised: loss_mask 1)::

    documents   A = p a a    B = p p a a a a    C = p p a a        block_size = 8

    bfd   best-fit decreasing: longest first, each into the fullest block it still fits in;
          documents are never split
          block 0    B B B B B B _ _      doc_lens [6]
          loss_mask  0 0 1 1 1 1 0 0
          block 1    C C C C A A A _      doc_lens [4, 3]
          loss_mask  0 0 1 1 0 1 1 0

    wrap  concatenate in order and cut every block_size tokens; documents may span blocks
          block 0    A A A B B B B B      doc_lens [3, 5]
          loss_mask  0 1 1 0 0 1 1 1
          block 1    B C C C C _ _ _      doc_lens [1, 4]
          loss_mask  0 0 0 1 1 0 0 0      (B's last token starts the block: nothing to predict it from)

Documents longer than block_size (``pack.overlong``, bfd only; wrap always splits):

    E=19, block_size=8
    split     -> E[0:8], E[8:16], E[16:19]   three pieces, packed like documents
    truncate  -> E[0:8]                      the rest is lost
    drop      -> nothing

The first token of every piece is never a target: nothing before it in the block belongs to the
same document, so there is nothing to predict it from (the trainer's labels are shifted by one).
A piece with no supervised token left teaches nothing and is dropped, and counted.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from itertools import islice
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

Piece = tuple[int, int, int]
"""(document index, start, stop): tokens ``doc[start:stop]``."""


@dataclass
class PieceCounts:
    """What happened to documents on their way to pieces; all of it goes into the report."""

    documents: int = 0
    overlong: int = 0
    split: int = 0
    truncated: int = 0
    dropped_overlong: int = 0
    dropped_unsupervised: int = 0
    tokens_lost: int = 0
    examples: dict[str, list[int]] = field(default_factory=dict)


def pack(lengths: Sequence[int], prompt_lengths: Sequence[int], block_size: int, strategy: str = "bfd",
         overlong: str = "split", masks: Mapping[int, np.ndarray] | None = None,
         ) -> tuple[list[list[Piece]], PieceCounts | None]:
    """The blocks of one split, by ``strategy``: bfd (:func:`plan_pieces` by ``overlong``, then
    :func:`pack_bfd`) or wrap (:func:`pack_wrap`). Also what happened to the documents on the way
    (bfd; wrap cuts and drops nothing: None). ``masks``: the loss masks of documents whose
    supervised tokens are not simply those after the prompt (multi-turn; see plan_pieces). The
    example of this module's header:

    >>> pack([3, 6, 4], [1, 2, 2], 8, "bfd")[0]
    [[(1, 0, 6)], [(2, 0, 4), (0, 0, 3)]]
    >>> pack([3, 6, 4], [1, 2, 2], 8, "wrap")[0]
    [[(0, 0, 3), (1, 0, 5)], [(1, 5, 6), (2, 0, 4)]]
    """
    pieces, per_block, counts = pack_flat(lengths, prompt_lengths, block_size, strategy, overlong, masks)
    return unflatten(pieces, per_block), counts


def pack_flat(lengths: Sequence[int], prompt_lengths: Sequence[int], block_size: int, strategy: str = "bfd",
              overlong: str = "split", masks: Mapping[int, np.ndarray] | Turns | None = None,
              ) -> tuple[np.ndarray, np.ndarray, PieceCounts | None]:
    """:func:`pack` as arrays, with no Python object per piece: every block's pieces one after the
    other (``[pieces, 3]`` int64 rows ``(doc, start, stop)``) and the number of pieces in each block.

    >>> pieces, per_block, _ = pack_flat([3, 6, 4], [1, 2, 2], 8, "bfd")
    >>> pieces.tolist(), per_block.tolist()
    ([[1, 0, 6], [2, 0, 4], [0, 0, 3]], [1, 2])
    """
    if strategy == "bfd":
        pieces, counts = plan_piece_array(lengths, prompt_lengths, block_size, overlong, masks)
        order, per_block = bfd_order(pieces[:, 2] - pieces[:, 1], block_size)
        return pieces[order], per_block, counts
    if strategy == "wrap":
        blocks = pack_wrap(np.asarray(lengths, np.int64).reshape(-1).tolist(), block_size)  # Python ints: fast
        return (np.asarray([piece for block in blocks for piece in block], np.int64).reshape(-1, 3),
                np.asarray([len(block) for block in blocks], np.int64), None)
    raise ValueError(f"strategy must be bfd or wrap, got {strategy!r}")


def pack_groups(lengths: Sequence[int], prompt_lengths: Sequence[int], block_size: int, strategy: str,
                overlong: str, masks: Mapping[int, np.ndarray] | Turns | None, first_docs: Sequence[int],
                ) -> tuple[np.ndarray, np.ndarray, PieceCounts | None, list[int]]:
    """:func:`pack_flat` where no block holds documents of two groups (the val split's eval sources,
    each reported on its own): group ``g`` is documents ``first_docs[g]`` to ``first_docs[g + 1] - 1``
    (the last to the end), its blocks after group ``g - 1``'s; also the blocks of each group. One
    group (``first_docs == [0]``) gives :func:`pack_flat`'s blocks.

    >>> pieces, per_block, _, blocks = pack_groups([3, 6, 4], [1, 2, 2], 8, "bfd", "split", None, [0, 2])
    >>> pieces.tolist(), per_block.tolist(), blocks
    ([[1, 0, 6], [0, 0, 3], [2, 0, 4]], [1, 1, 1], [2, 1])
    """
    if len(first_docs) == 1:
        pieces, per_block, counts = pack_flat(lengths, prompt_lengths, block_size, strategy, overlong, masks)
        return pieces, per_block, counts, [len(per_block)]
    bounds = [*first_docs, len(lengths)]
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    counts = None
    if strategy == "bfd":
        pieces, counts = plan_piece_array(lengths, prompt_lengths, block_size, overlong, masks)
        group = np.searchsorted(np.asarray(first_docs, np.int64), pieces[:, 0], side="right") - 1
        for g in range(len(first_docs)):
            mine = np.flatnonzero(group == g)  # in document order, as pack_flat takes them
            order, per_block = bfd_order(pieces[mine, 2] - pieces[mine, 1], block_size)
            parts.append((pieces[mine[order]], per_block))
    elif strategy == "wrap":
        for a, b in zip(bounds[:-1], bounds[1:]):
            blocks = pack_wrap(np.asarray(lengths[a:b], np.int64).reshape(-1).tolist(), block_size)
            parts.append((np.asarray([(d + a, x, y) for block in blocks for d, x, y in block], np.int64).reshape(-1, 3),
                          np.asarray([len(block) for block in blocks], np.int64)))
    else:
        raise ValueError(f"strategy must be bfd or wrap, got {strategy!r}")
    return (np.concatenate([p for p, _ in parts]), np.concatenate([n for _, n in parts]).astype(np.int64), counts,
            [len(n) for _, n in parts])


def unflatten(pieces: np.ndarray, per_block: np.ndarray) -> list[list[Piece]]:
    """:func:`pack_flat`'s arrays as :func:`pack`'s lists of blocks."""
    every = iter(list(map(tuple, pieces.tolist())))
    return [list(islice(every, n)) for n in per_block.tolist()]


def plan_pieces(
    lengths: Sequence[int],
    prompt_lengths: Sequence[int],
    block_size: int,
    overlong: str = "split",
    masks: Mapping[int, np.ndarray] | None = None,
) -> tuple[list[Piece], PieceCounts]:
    """Cut documents into pieces that fit a block, following ``overlong`` for the long ones.

    Tokens at positions >= prompt_length are supervised (answer and eos), except in the documents
    of ``masks`` (a conversation: several supervised spans), whose loss mask says which are.

    >>> plan_pieces([5, 19], [2, 4], 8, "split")[0]
    [(0, 0, 5), (1, 0, 8), (1, 8, 16), (1, 16, 19)]
    >>> plan_pieces([5, 19], [2, 10], 8, "truncate")[0]   # E[0:8] is all prompt: dropped
    [(0, 0, 5)]
    >>> turns = np.array([0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1])   # no loss in the middle piece
    >>> plan_pieces([12], [1], 4, "split", masks={0: turns})[0]
    [(0, 0, 4), (0, 8, 12)]
    """
    pieces, counts = plan_piece_array(lengths, prompt_lengths, block_size, overlong, masks)
    return list(map(tuple, pieces.tolist())), counts


@dataclass(frozen=True)
class Turns:
    """The documents whose supervised tokens are not simply those after the prompt (conversations of
    several turns), as :func:`plan_piece_array` needs them: ``docs`` (sorted), ``later`` (for each, whether
    a token after its first is supervised: all a document that fits a block needs) and ``mask_of(doc)``, the
    loss mask, asked only for a document longer than a block (pipeline/pack/shards.py gives the first two
    from the spill's counts, with no mask read per document)."""

    docs: np.ndarray
    later: np.ndarray
    mask_of: Callable[[int], np.ndarray]

    @staticmethod
    def of(masks: Mapping[int, np.ndarray]) -> "Turns":
        """The turns of documents given by their masks.

        >>> Turns.of({4: np.array([1, 0, 0]), 2: np.array([0, 1, 0, 1])}).later.tolist()
        [True, False]
        """
        docs = np.asarray(sorted(masks), np.int64)
        return Turns(docs, np.asarray([bool(masks[doc][1:].any()) for doc in docs.tolist()], bool), masks.__getitem__)


def plan_piece_array(lengths: Sequence[int], prompt_lengths: Sequence[int], block_size: int, overlong: str = "split",
                     masks: Mapping[int, np.ndarray] | Turns | None = None) -> tuple[np.ndarray, PieceCounts]:
    """:func:`plan_pieces`' pieces as one ``[pieces, 3]`` int64 array (by document, then start); ``masks``
    may be given as :class:`Turns`."""
    if overlong not in ("split", "truncate", "drop"):
        raise ValueError(f"overlong must be split, truncate or drop, got {overlong!r}")
    counts = PieceCounts(documents=len(lengths))
    lengths_a = np.asarray(lengths, np.int64).reshape(-1)
    prompts_a = np.asarray(prompt_lengths, np.int64).reshape(-1)
    turns = masks if isinstance(masks, Turns) else Turns.of(masks or {})
    # a document that fits a block is one piece, decided at once: whole where a token after its first is
    # supervised (after the prompt; a conversation's by its turns), else dropped; the longer ones one at a time
    fits = lengths_a <= block_size
    inside = turns.docs < len(fits)
    docs, later = turns.docs[inside], turns.later[inside]
    supervised = lengths_a > np.maximum(prompts_a, 1)
    supervised[docs] = later
    whole = fits & supervised
    unsupervised = np.flatnonzero(fits & ~supervised)
    counts.dropped_unsupervised += len(unsupervised)
    counts.tokens_lost += int(lengths_a[unsupervised].sum())
    pieces: list[Piece] = []  # of the documents longer than a block
    irregular = set(docs[~fits[docs]].tolist())
    for doc in np.flatnonzero(~fits).tolist():
        length, prompt = int(lengths_a[doc]), int(prompts_a[doc])
        counts.overlong += 1
        if overlong == "drop":
            counts.dropped_overlong += 1
            counts.tokens_lost += length
            _example(counts, "dropped_overlong", doc)
            continue
        if overlong == "truncate":
            counts.truncated += 1
            counts.tokens_lost += length - block_size
            _example(counts, "truncated", doc)
            candidates = [(doc, 0, block_size)]
        else:
            counts.split += 1
            _example(counts, "split", doc)
            candidates = [(doc, s, min(s + block_size, length)) for s in range(0, length, block_size)]
        for piece in candidates:
            if (turns.mask_of(doc)[piece[1] + 1 : piece[2]].any() if doc in irregular
                    else piece[2] > max(prompt, piece[1] + 1)):  # a supervised token after the piece's first
                pieces.append(piece)
            else:
                counts.dropped_unsupervised += 1
                counts.tokens_lost += piece[2] - piece[1]
                _example(counts, "dropped_unsupervised", doc)
    dropped = sorted({*unsupervised[:20].tolist(), *counts.examples.get("dropped_unsupervised", [])})[:20]
    if dropped:
        counts.examples["dropped_unsupervised"] = dropped
    docs = np.flatnonzero(whole)
    everything = np.concatenate([np.stack([docs, np.zeros_like(docs), lengths_a[docs]], axis=1),
                                 np.asarray(pieces, np.int64).reshape(-1, 3)])
    return everything[np.lexsort((everything[:, 1], everything[:, 0]))], counts  # by document, then start


def _example(counts: PieceCounts, kind: str, doc: int, keep: int = 20) -> None:
    examples = counts.examples.setdefault(kind, [])
    if len(examples) < keep and doc not in examples:
        examples.append(doc)


def pack_bfd(pieces: Sequence[Piece], block_size: int) -> list[list[Piece]]:
    """Best-fit decreasing: place pieces longest first, each into the block with the least free
    space that still holds it (a new block when none does). Ties keep input order, so the result
    is deterministic (:func:`bfd_order` places them, as TRL's bfd packing does).

    >>> pack_bfd([(0, 0, 5), (1, 0, 3), (2, 0, 4), (3, 0, 2)], 8)
    [[(0, 0, 5), (1, 0, 3)], [(2, 0, 4), (3, 0, 2)]]
    """
    order, per_block = bfd_order(np.asarray([stop - start for _, start, stop in pieces], np.int64), block_size)
    return unflatten(np.asarray(pieces, np.int64).reshape(-1, 3)[order], per_block)


def bfd_order(sizes: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Best-fit decreasing of pieces of ``sizes`` tokens: (the pieces' indices, block after block,
    each block's in the order they were placed; the number of pieces in each block). Each piece,
    longest first (ties in input order), goes into the block with the least free space that still
    holds it, of those the one that has had that free space longest; a new block when none does.
    These are the blocks TRL's ``pack_dataset(strategy="bfd")`` makes of the same lengths
    (tests/test_pack.py checks them against it). O(n log n) plus O(block_size) per new free-space value.

    >>> order, per_block = bfd_order(np.array([5, 3, 4, 2]), 8)
    >>> order.tolist(), per_block.tolist()
    ([0, 1, 2, 3], [2, 2])
    """
    if len(sizes) and (sizes.max() > block_size or sizes.min() <= 0):
        raise ValueError(f"every piece must have 1..{block_size} tokens; plan_pieces first")
    order = np.argsort(-sizes, kind="stable")  # longest first, ties in input order
    placed: list[int] = []  # the block of each piece, in placing order
    free_values: list[int] = []  # sorted free-space values that some open block has
    by_free: list[deque[int] | None] = [None] * (block_size + 1)  # free space -> its open blocks, first come first
    blocks = 0
    for size in sizes[order].tolist():
        i = bisect_left(free_values, size)
        if i < len(free_values):
            free = free_values[i]
            bucket = by_free[free]
            block = bucket.popleft()  # the block that has had this free space longest (TRL's choice)
            if not bucket:
                by_free[free] = None
                del free_values[i]
        else:
            block, free = blocks, block_size
            blocks += 1
        placed.append(block)
        left = free - size
        if left > 0:
            bucket = by_free[left]
            if bucket is None:
                by_free[left] = deque([block])
                insort(free_values, left)
            else:
                bucket.append(block)
    placed_a = np.asarray(placed, np.int64)
    return order[np.argsort(placed_a, kind="stable")], np.bincount(placed_a, minlength=blocks)


def pack_wrap(lengths: Sequence[int], block_size: int) -> list[list[Piece]]:
    """Concatenate documents in order and cut every ``block_size`` tokens; the last block is
    partial (padded later), never lost.

    >>> pack_wrap([5, 3, 4, 2], 8)
    [[(0, 0, 5), (1, 0, 3)], [(2, 0, 4), (3, 0, 2)]]
    >>> pack_wrap([6, 5], 4)
    [[(0, 0, 4)], [(0, 4, 6), (1, 0, 2)], [(1, 2, 5)]]
    """
    blocks: list[list[Piece]] = []
    current: list[Piece] = []
    free = block_size
    for doc, length in enumerate(lengths):
        start = 0
        while start < length:
            take = min(free, length - start)
            current.append((doc, start, start + take))
            start += take
            free -= take
            if free == 0:
                blocks.append(current)
                current, free = [], block_size
    if current:
        blocks.append(current)
    return blocks


def assemble_block(
    pieces: Sequence[Piece],
    tokens: Sequence[np.ndarray],
    masks: Sequence[np.ndarray],
    block_size: int,
    pad_id: int,
    dtype: np.dtype = np.dtype(np.uint32),
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Materialize one block: (input_ids, loss_mask, doc_lens).

    ``tokens[doc]`` is the document's token array and ``masks[doc]`` its loss mask; the block's
    mask is that, except each piece's first token (never a target). Padding is ``pad_id`` with mask 0.

    >>> ids, mask, lens = assemble_block([(0, 0, 3), (1, 1, 4)], [np.array([7, 8, 9]),
    ...     np.array([4, 5, 6, 3])], [np.array([0, 1, 1]), np.array([1, 1, 1, 1])], 7, pad_id=0)
    >>> ids.tolist(), mask.tolist(), lens
    ([7, 8, 9, 5, 6, 3, 0], [0, 1, 1, 0, 1, 1, 0], [3, 3])
    """
    ids = np.full(block_size, pad_id, dtype=dtype)
    mask = np.zeros(block_size, dtype=np.uint8)
    lens = []
    at = 0
    for doc, start, stop in pieces:
        n = stop - start
        ids[at : at + n] = tokens[doc][start:stop]
        mask[at + 1 : at + n] = masks[doc][start + 1 : stop]
        lens.append(n)
        at += n
    assert at <= block_size, f"pieces hold {at} tokens, more than block_size {block_size}"
    return ids, mask, lens
