"""A document's words for near dedup (pipeline/pack/near_dup.py, where the measure is defined): each
token id's text as it reads inside a document, normalized (:func:`token_table`, :func:`tokenizer_table`;
kept per machine: pipeline/pack/near_tables.py), cut into :class:`Pieces` and made :class:`Units` (a
word fragment each, with the spaces around it), and the words of a batch of spilled documents' prompts
and answers (:class:`SpillWords`) hashed from their tokens' units, not their bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

P = np.uint64(0x100000001B3)
"""The words' polynomial base (FNV-1's 64-bit prime); near_dup.band_keys mixes with it too."""
MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
""":func:`mix64`'s two multipliers (splitmix64's)."""
_POW = np.cumprod(np.full(64, P, dtype=np.uint64))  # P ** (i + 1), wrapping mod 2**64 as meant
_SHIFT = np.concatenate([[np.uint64(1)], _POW[:-1]])  # P ** i


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every bit of each uint64 spread over the whole word.

    >>> mix64(np.array([0, 1], np.uint64)).tolist()
    [0, 6238072747940578789]
    """
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * MIX[0]
        x = x ^ (x >> np.uint64(27))
        x = x * MIX[1]
        return x ^ (x >> np.uint64(31))


def token_table(pieces: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The bytes each token id stands for in the measure (``pieces[id]``: its text as it reads inside
    a document, a leading space included; a special token's ``""``), lowercased with every run of
    whitespace one space: a flat uint8 array and each id's offsets into it.

    >>> data, offsets = token_table(["Select", " FROM", "\\n\\n ", ""])
    >>> bytes(data).decode(), offsets.tolist()
    ('select from ', [0, 6, 11, 12, 12])
    """
    texts = [" ".join(piece.lower().split(None)) if piece.strip() else (" " if piece else "") for piece in pieces]
    texts = [(" " if piece[:1].isspace() and text != " " else "") + text
             + (" " if piece[-1:].isspace() and text != " " else "") for piece, text in zip(pieces, texts)]
    encoded = [text.encode("utf-8", "surrogatepass") for text in texts]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return np.frombuffer(b"".join(encoded), np.uint8), offsets


@dataclass
class Pieces:
    """The bytes of :func:`token_table` cut at token ends and at spaces, each piece a word fragment or
    a run of spaces, with what a fragment adds to its word's hash: token ``t``'s pieces are
    ``first[t] .. first[t] + count[t] - 1``. A document's words then come from its tokens' pieces,
    not its bytes (a token is one or two pieces, a word of it several bytes)."""
    first: np.ndarray
    count: np.ndarray
    hash: np.ndarray
    """Per piece: sum of (byte + 1) * P ** (i + 1) over its bytes, i the byte's place in the piece."""
    length: np.ndarray
    space: np.ndarray
    start: np.ndarray
    """Per piece: where its bytes begin in ``data``."""
    data: np.ndarray

    @classmethod
    def of(cls, data: np.ndarray, owner: np.ndarray, tokens: int) -> "Pieces":
        """The pieces of ``data``, the bytes of ``tokens`` tokens (the token of each byte in ``owner``)."""
        space = data == 32
        starts = np.flatnonzero(np.concatenate([[True], (owner[1:] != owner[:-1]) | (space[1:] != space[:-1])])
                                if len(data) else np.zeros(0, bool))
        length = np.diff(np.append(starts, len(data))).astype(np.int32)
        pos = np.arange(len(data), dtype=np.int32) - np.repeat(starts.astype(np.int32), length)
        with np.errstate(over="ignore"):
            values = (data.astype(np.uint64) + np.uint64(1)) * _POW[pos & 63]
        count = np.bincount(owner[starts], minlength=tokens).astype(np.int32)
        return cls(np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64), count,
                   np.add.reduceat(values, starts) if len(starts) else np.zeros(0, np.uint64), length,
                   space[starts], starts, data)

    def words(self, pieces: np.ndarray, doc: np.ndarray, documents: int) -> tuple[np.ndarray, np.ndarray]:
        """:func:`word_hashes` of the bytes of ``pieces`` (of ``documents`` documents, the document of
        each piece in ``doc``, in order): a fragment at place s of its word adds P ** (s % 64) times its
        hash; one that crosses a multiple of 64 (only in words of more than 64 bytes) is hashed by byte."""
        space, length = self.space[pieces], self.length[pieces]
        new_doc = np.concatenate([[True], doc[1:] != doc[:-1]])
        starts = np.flatnonzero(~space & (new_doc | np.concatenate([[True], space[:-1]])))
        if not len(starts):
            return np.zeros(0, np.uint64), np.zeros(documents, np.int64)
        marker = np.zeros(len(pieces), np.int32)
        marker[starts] = 1
        word = np.cumsum(marker) - 1
        at = np.cumsum(length, dtype=np.int64) - length
        place = at - at[starts[np.maximum(word, 0)]]
        outside = space | (word < 0)
        with np.errstate(over="ignore"):
            values = self.hash[pieces] * _SHIFT[place & 63]
        values[outside] = 0
        crossing = np.flatnonzero(~outside & ((place & 63) + length > 64))
        if len(crossing):
            values[crossing] = self.by_byte(pieces[crossing], place[crossing])
        return mix64(np.add.reduceat(values, starts)), np.bincount(doc[starts], minlength=documents)

    def by_byte(self, pieces: np.ndarray, place: np.ndarray) -> np.ndarray:
        """What each of ``pieces`` adds to its word's hash at byte ``place`` of the word."""
        length = self.length[pieces]
        within = ranges(np.zeros(len(pieces), np.int64), length)
        with np.errstate(over="ignore"):
            values = ((self.data[ranges(self.start[pieces], length)].astype(np.uint64) + np.uint64(1))
                      * _POW[(np.repeat(place, length) + within) & 63])
        return np.add.reduceat(values, np.concatenate([[0], np.cumsum(length)[:-1]]))


def word_hashes(data: np.ndarray, doc_of_byte: np.ndarray, documents: int) -> tuple[np.ndarray, np.ndarray]:
    """A uint64 hash per space-separated word of ``data`` (bytes of ``documents`` documents, the
    document of each byte in ``doc_of_byte``, in order), in order, and the number of words per
    document: mix64 of the sum of (byte + 1) * P ** (i % 64 + 1), i the byte's place in its word.

    >>> data = np.frombuffer(b"a b" + b"b  a a", np.uint8)
    >>> h, n = word_hashes(data, np.array([0, 0, 0, 2, 2, 2, 2, 2, 2]), 3)
    >>> n.tolist(), bool(h[0] == h[3]), bool(h[1] == h[2]), bool(h[0] == h[1])
    ([2, 0, 3], True, True, False)
    """
    every = np.arange(len(data))
    return Pieces.of(data, every, len(data)).words(every, np.asarray(doc_of_byte), documents)


FRAGMENT, BEFORE, TRAIL, EMPTY = 1, 2, 4, 8


@dataclass
class Units:
    """Each token's :class:`Pieces` as units of at most one word fragment each, with whether a space
    comes before the fragment (or the unit is all space) and after it: every token is one unit but a
    token holding two fragments or more (``"a b"``). A document's words then come from one unit per
    token, most of the time: no piece ranges. Unit ``t`` is token ``t``'s first; a token of several
    units lists them in ``listed[first[t] : first[t] + count[t]]`` (its others from ``len(first)`` on)."""
    pieces: Pieces
    length: np.ndarray
    """Per unit: its fragment's length in bytes (0 without one)."""
    flags: np.ndarray
    """Per unit: :data:`FRAGMENT` (it has one), :data:`BEFORE` (a space before it), :data:`TRAIL` (a space
    after it, or the unit is all space), :data:`EMPTY` (no byte at all: a special token)."""
    hash: np.ndarray
    """Per unit: its fragment's :attr:`Pieces.hash` (0 without one)."""
    piece: np.ndarray
    """Per unit: its fragment's piece (-1 without one)."""
    first: np.ndarray
    count: np.ndarray
    listed: np.ndarray
    single: bool
    """Every token is one unit (Qwen's, GPT-2's: no token holds two words)."""

    @classmethod
    def of(cls, pieces: Pieces) -> "Units":
        tokens, n = len(pieces.first), len(pieces.hash)
        owner = np.repeat(np.arange(tokens), pieces.count)
        same = owner[1:] == owner[:-1]
        before, after = np.zeros(n, bool), np.zeros(n, bool)
        before[1:] = pieces.space[:-1] & same  # pieces alternate: a space, a fragment, ...
        last = np.zeros(n, bool)
        last[(pieces.first + pieces.count - 1)[pieces.count > 0]] = True
        after[:-1] = pieces.space[1:] & same & last[1:]
        fragments = np.flatnonzero(~pieces.space)
        per_token = np.bincount(owner[fragments], minlength=tokens)
        count = np.maximum(per_token, 1)
        rank = np.arange(len(fragments)) - (np.cumsum(per_token) - per_token)[owner[fragments]]
        extra = np.cumsum(count - 1) - (count - 1) + tokens  # where a token's second unit goes
        unit = np.where(rank == 0, owner[fragments], extra[owner[fragments]] + rank - 1)
        units = tokens + int((count - 1).sum())
        length, flags = np.zeros(units, np.int32), np.zeros(units, np.uint8)
        hashes, piece = np.zeros(units, np.uint64), np.full(units, -1, np.int64)
        flags[:tokens] = np.where(pieces.count > 0, TRAIL, EMPTY)  # a token without a fragment: all space, or nothing
        length[unit], hashes[unit], piece[unit] = pieces.length[fragments], pieces.hash[fragments], fragments
        flags[unit] = FRAGMENT | before[fragments] * BEFORE | after[fragments] * TRAIL
        listed = np.zeros(int(count.sum()), np.int64)
        first = np.cumsum(count) - count
        listed[first] = np.arange(tokens)
        several = np.flatnonzero(count > 1)
        if len(several):
            at = ranges(first[several] + 1, count[several] - 1)
            listed[at] = ranges(extra[several], count[several] - 1)
        return cls(pieces, length, flags, hashes, piece, first, count, listed, bool((count == 1).all()))

    def of_tokens(self, ids: np.ndarray, doc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The units of the tokens ``ids`` (of the documents ``doc``), in order, and each one's document."""
        if self.single:
            return ids, doc
        count = self.count[ids]
        if (count == 1).all():
            return ids, doc
        return self.listed[ranges(self.first[ids], count)], np.repeat(doc, count)

    def words(self, units: np.ndarray, doc: np.ndarray, documents: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`Pieces.words` of the pieces of ``units`` (the same hashes and counts): a word starts at
        a fragment with a space since the previous fragment, or the first of its document. Every unit
        stays in place (one without a fragment adds nothing to a word: no hash, no bytes), so no array
        is compressed to the fragments."""
        flags = self.flags[units]
        fragment = flags & FRAGMENT
        if not len(units) or not fragment.any():
            return np.zeros(0, np.uint64), np.zeros(documents, np.int64)
        trail = flags & TRAIL
        begun = np.flatnonzero(np.concatenate([[True], doc[1:] != doc[:-1]]))  # each document's first unit
        trail[begun[fragment[begun] == 0]] = TRAIL  # a document begun without a fragment: as after a space
        empty = np.flatnonzero(flags[1:] & EMPTY) + 1  # a special token: the space before it goes on past it
        while len(moved := empty[(trail[empty] == 0) & (trail[empty - 1] != 0)]):  # a run of them: one a round
            trail[moved] = TRAIL
        spaced = flags & BEFORE
        spaced[1:] |= trail[:-1] >> 1  # a space between a fragment and the unit before it
        spaced[begun] = BEFORE  # a document's first fragment begins a word
        starting = (spaced >> 1) & fragment
        starts = np.flatnonzero(starting)
        # the places in int32 where the units' bytes cannot reach 2**31 (always, but for gigabytes of text at once)
        wide = np.int32 if len(units) * int(self.length.max(initial=0)) < 2**31 else np.int64
        length = self.length[units].astype(wide, copy=False)
        at = np.cumsum(length, dtype=wide)
        at -= length
        word = np.cumsum(starting, dtype=wide)
        word -= 1  # -1 before the first word: units without a fragment, which add nothing
        place = at - at[starts][word]
        with np.errstate(over="ignore"):
            values = self.hash[units] * _SHIFT[place & 63]
        if (place + length).max() > 64:  # a word of more than 64 bytes
            crossing = np.flatnonzero((place & 63) + length > 64)
            if len(crossing):
                values[crossing] = self.pieces.by_byte(self.piece[units[crossing]], place[crossing])
        return mix64(np.add.reduceat(values, starts)), np.bincount(doc[starts], minlength=documents)


class SpillWords:
    """``parts`` for near_dup.find over a build's spills (pipeline/pack/spill.py ``SourceSpill``, per split
    and source): each document's prompt and answer words (:func:`word_hashes` of the bytes its tokens
    stand for, from their :class:`Units`: :func:`table_units` of a :func:`token_table`)."""

    def __init__(self, spills: dict, units: Units):
        self.spills = spills
        self.units = units

    def __call__(self, split: str, source: int, indices: np.ndarray):
        spill = self.spills[split][source]
        lengths = spill.lengths[indices]
        a = int(spill.offsets[indices[0]]) if len(indices) else 0
        if len(indices) and (np.diff(indices) == 1).all():  # consecutive documents: one slice, no gather
            tokens, mask = spill.tokens[a : a + int(lengths.sum())], spill.masks[a : a + int(lengths.sum())]
        else:
            at = ranges(spill.offsets[indices], lengths)
            tokens, mask = spill.tokens[at], spill.masks[at]
        return document_words(self.units, tokens, mask, lengths)


def table_units(table: tuple[np.ndarray, np.ndarray]) -> Units:
    """The :class:`Units` of every token of ``table`` (:func:`token_table`)."""
    data, offsets = table
    return Units.of(Pieces.of(data, np.repeat(np.arange(len(offsets) - 1), np.diff(offsets)), len(offsets) - 1))


def document_words(units: Units, tokens: np.ndarray, mask: np.ndarray, lengths: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The prompt's word hashes and counts, then the answer's, of the documents whose ``tokens`` (and
    loss ``mask``) are concatenated, ``lengths`` tokens each: :func:`text_words` parted."""
    words, counts = text_words(units, tokens, mask, lengths)
    answer = np.repeat(np.arange(len(counts)) & 1 == 1, counts)
    return words[~answer], counts[0::2], words[answer], counts[1::2]


def text_words(units: Units, tokens: np.ndarray, mask: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The word hashes of the documents whose ``tokens`` (and loss ``mask``) are concatenated, ``lengths``
    tokens each, as texts: document i's prompt (its tokens the loss is not on) is text 2i, its answer
    2i + 1; and the number of words of each text. One pass over a batch of the spill's (:class:`SpillWords`;
    the encode workers' band keys come from pipeline/pack/near_kernel.py, which makes the same words): a
    prompt/answer row's tokens are in their texts' order already; a conversation's turns are put in it (a
    stable sort keeps each text's tokens in order).

    >>> table = table_units(token_table(["SELECT", " a", "b", " x"]))  # the second document: a conversation
    >>> w, n = text_words(table, np.array([0, 1, 3, 1, 3, 2]), np.array([0, 0, 1, 0, 1, 0]), np.array([3, 3]))
    >>> n.tolist(), bool(w[2] == w[4]), bool(w[1] == w[3])  # "select a", "x"; "ab", "x"
    ([2, 1, 1, 1], True, False)
    """
    text = np.repeat(np.arange(0, 2 * len(lengths), 2, dtype=np.int32), lengths)
    text += mask != 0
    if len(text) > 1 and (text[1:] < text[:-1]).any():  # a conversation: a prompt after an answer
        order = np.argsort(text, kind="stable")
        tokens, text = tokens[order], text[order]
    return units.words(*units.of_tokens(tokens, text), 2 * len(lengths))


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices ``starts[i] .. starts[i] + lengths[i] - 1`` of every range, in order.

    >>> ranges(np.array([5, 0]), np.array([2, 3])).tolist()
    [5, 6, 0, 1, 2]
    """
    before = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return np.repeat(np.asarray(starts, np.int64) - before, lengths) + np.arange(int(np.sum(lengths)), dtype=np.int64)


def tokenizer_table(content: str, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`token_table` of every id of the tokenizer whose tokenizer.json holds ``content``: a
    token's text as it reads inside a document is what decoding it after another token adds (alone,
    a SentencePiece decoder drops its leading space). Kept per machine: pipeline/pack/near_tables.py."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(content)
    size = max(vocab_size, tokenizer.get_vocab_size(with_added_tokens=True))
    anchor = tokenizer.encode("a", add_special_tokens=False).ids[:1] or [0]
    head = tokenizer.decode(anchor, skip_special_tokens=True)
    both = tokenizer.decode_batch([anchor + [i] for i in range(size)], skip_special_tokens=True)
    return token_table([text[len(head):] if text.startswith(head) else text for text in both])
