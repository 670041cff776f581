"""A batch's documents as the spill takes them: ``head + ids + [eos]`` per document, its loss mask,
length and prompt length, concatenated with no per-token Python (run in the workers,
pipeline/encode/worker.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def assemble_documents(encoded: list[tuple[np.ndarray, list[tuple[int, int]]]], to_end: list[bool],
                       head: tuple[int, ...], eos_id: int) -> dict[str, np.ndarray]:
    """Every document as ``head + ids + [eos]`` (no second EOS when the ids end with one), and its
    loss mask from its supervised token ranges; the last range reaches onto an added EOS when the
    document's last span runs to the end of its text (``to_end``). Concatenated, no per-token Python.

    >>> batch = assemble_documents([(np.array([5, 6, 7], np.uint32), [(1, 3)]),
    ...                             (np.array([8, 2], np.uint32), [(0, 1)])], [True, False], (1,), eos_id=2)
    >>> batch["tokens"].tolist(), batch["masks"].tolist()
    ([1, 5, 6, 7, 2, 1, 8, 2], [0, 0, 1, 1, 1, 0, 1, 0])
    >>> batch["lengths"].tolist(), batch["prompt_lengths"].tolist()
    ([5, 3], [2, 1])
    """
    head_ids = np.asarray(head, np.uint32)
    eos = np.asarray([eos_id], np.uint32)
    pieces, lengths, prompt_lengths, starts, stops = [], [], [], [], []
    at = 0
    for (ids, spans), reaches_end in zip(encoded, to_end):
        add_eos = not len(ids) or int(ids[-1]) != eos_id
        if add_eos and reaches_end:  # the answer runs to the end: so does the loss, onto EOS
            spans = spans[:-1] + [(spans[-1][0], len(ids) + 1)]
        pieces += [head_ids, ids, eos] if add_eos else [head_ids, ids]
        length = len(head) + len(ids) + add_eos
        starts += [at + len(head) + a for a, _ in spans]
        stops += [at + len(head) + b for _, b in spans]
        lengths.append(length)
        prompt_lengths.append(len(head) + spans[0][0])
        at += length
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, np.uint32)
    # +1 where a supervised range starts, -1 where it stops: the running sum is the mask
    edges = (np.bincount(np.asarray(starts, np.int64), minlength=at + 1)
             - np.bincount(np.asarray(stops, np.int64), minlength=at + 1))
    return {
        "tokens": tokens,
        "masks": (np.cumsum(edges[:at]) > 0).astype(np.uint8),
        "lengths": np.asarray(lengths, np.int64),
        "prompt_lengths": np.asarray(prompt_lengths, np.int64),
    }


def laid_out(ids: np.ndarray, offsets: np.ndarray, head: tuple[int, ...], eos_id: int) -> tuple[np.ndarray, ...]:
    """The tokens of documents given column-wise (``ids``, document d at ``offsets[d]:offsets[d + 1]``), each
    after ``head`` and before an EOS (unless it ends with one): (the tokens, each document's id count, whether
    an EOS was added, its length, its start and stop in the tokens), with no per-document Python."""
    counts = np.diff(offsets)
    last = np.maximum(offsets[1:] - 1, 0)
    add_eos = (counts == 0) | (ids[last] != eos_id) if len(ids) else np.ones(len(counts), bool)
    lengths = len(head) + counts + add_eos
    stops = np.cumsum(lengths)
    starts = stops - lengths
    tokens = np.empty(int(stops[-1]) if len(stops) else 0, np.uint32)
    for j, token in enumerate(head):
        tokens[starts + j] = token
    doc = np.repeat(np.arange(len(counts)), counts)
    tokens[np.arange(len(ids)) + (starts - offsets[:-1] + len(head))[doc]] = ids
    tokens[(starts + len(head) + counts)[add_eos]] = eos_id
    return tokens, counts, add_eos, lengths, starts, stops


def assemble_suffixes(ids: np.ndarray, offsets: np.ndarray, firsts: np.ndarray, head: tuple[int, ...],
                      eos_id: int) -> dict[str, np.ndarray]:
    """:func:`assemble_documents` of prompt + answer documents given column-wise: every document's ids
    concatenated (``ids``, document d at ``offsets[d]:offsets[d + 1]``) and its one supervised range,
    from its token ``firsts[d]`` to its end (and onto the EOS added after it), with no per-document Python.

    >>> batch = assemble_suffixes(np.array([5, 6, 7, 8, 2], np.uint32), np.array([0, 3, 5]), np.array([1, 0]),
    ...                           (1,), eos_id=2)
    >>> batch["tokens"].tolist(), batch["masks"].tolist()
    ([1, 5, 6, 7, 2, 1, 8, 2], [0, 0, 1, 1, 1, 0, 1, 1])
    >>> batch["lengths"].tolist(), batch["prompt_lengths"].tolist()
    ([5, 3], [2, 1])
    """
    tokens, counts, add_eos, lengths, starts, stops = laid_out(ids, offsets, head, eos_id)
    supervised = starts + len(head) + firsts
    edges = (np.bincount(supervised, minlength=len(tokens) + 1) - np.bincount(stops, minlength=len(tokens) + 1))
    return {"tokens": tokens, "masks": (np.cumsum(edges[:len(tokens)]) > 0).astype(np.uint8),
            "lengths": lengths.astype(np.int64), "prompt_lengths": (len(head) + firsts).astype(np.int64)}


@dataclass(frozen=True)
class FlatDocuments:
    """Documents a fast encoder made and placed as arrays (pipeline/encode/fast/fastokens_encoder.py
    ``encode_documents_flat``): every document's ids concatenated (``ids``, uint32; document d at
    ``offsets[d]:offsets[d + 1]``), its number of supervised spans (``numbers``), every span's token range
    (``edges``: start, stop, start, ...; counted from its document's first token) and whether a span of the
    document starts inside a token (``inside``: its ranges mean nothing, the reference makes it). ``flat[d]``
    is document d as ``encode_documents`` gives it: (its ids, its ranges), None where ``inside``."""

    ids: np.ndarray
    offsets: np.ndarray
    numbers: np.ndarray
    edges: np.ndarray
    inside: np.ndarray

    def __len__(self) -> int:
        return len(self.numbers)

    def __getitem__(self, d: int) -> tuple[np.ndarray, list[tuple[int, int]]] | None:
        if self.inside[d]:
            return None
        first = 2 * int(self.numbers[:d].sum())
        edges = self.edges[first : first + 2 * int(self.numbers[d])].tolist()
        return self.ids[int(self.offsets[d]) : int(self.offsets[d + 1])], list(zip(edges[0::2], edges[1::2]))


def assemble_flat(flat: FlatDocuments, to_end: np.ndarray, head: tuple[int, ...], eos_id: int) -> dict[str, np.ndarray]:
    """:func:`assemble_documents` of documents given as :class:`FlatDocuments` (each with a span, none
    ``inside``), with no per-document Python: the same arrays.

    >>> flat = FlatDocuments(np.array([5, 6, 7, 8, 2], np.uint32), np.array([0, 3, 5]), np.array([1, 1]),
    ...                      np.array([1, 3, 0, 1]), np.zeros(2, bool))
    >>> batch = assemble_flat(flat, np.array([True, False]), (1,), eos_id=2)
    >>> batch["tokens"].tolist(), batch["masks"].tolist()
    ([1, 5, 6, 7, 2, 1, 8, 2], [0, 0, 1, 1, 1, 0, 1, 0])
    >>> batch["lengths"].tolist(), batch["prompt_lengths"].tolist()
    ([5, 3], [2, 1])
    """
    numbers = flat.numbers
    tokens, counts, add_eos, lengths, starts, stops = laid_out(flat.ids, flat.offsets, head, eos_id)
    at = (starts + len(head))[np.repeat(np.arange(len(counts)), numbers)]  # each span's document's first id
    begin, end = at + flat.edges[0::2], at + flat.edges[1::2]
    reach = add_eos & to_end  # the answer runs to the end: so does the loss, onto EOS
    end[(np.cumsum(numbers) - 1)[reach]] = (starts + len(head) + counts + 1)[reach]
    edges = np.bincount(begin, minlength=len(tokens) + 1) - np.bincount(end, minlength=len(tokens) + 1)
    return {"tokens": tokens, "masks": (np.cumsum(edges[: len(tokens)]) > 0).astype(np.uint8),
            "lengths": lengths.astype(np.int64),
            "prompt_lengths": (len(head) + flat.edges[0::2][np.cumsum(numbers) - numbers]).astype(np.int64)}
