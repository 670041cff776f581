"""Near dedup's band keys of a batch in one compiled pass (numba): for each document, its prompt's and
its answer's words (pipeline/pack/near_words.py), their grams, MinHash signatures and band keys
(pipeline/pack/near_dup.py), with no array the size of the batch in between.

The NumPy functions define the measure and stay its reference: this makes their keys bit for bit
(tests/test_near_kernel.py against ``near_dup.bands_of`` over ``near_words.SpillWords``), and the build
still uses them for the few documents that share a bucket (their exact check). They made a batch's keys
in about 15 passes over its tokens; this is one, about 2.8x fewer CPU seconds (docs/BUILD.md, "What it
costs").

Compiled once per machine and kept: numba writes the machine code beside this file (``__pycache__``; its
user cache directory where that cannot be written; nowhere where neither can: then each process compiles
it) the first time the module is imported (about 2 s; `make install` does it) and loads it after that
(0.15 s, and 0.15 s to import numba). A near build's fork server imports it before it forks the workers
(pipeline/encode/fork_server.py); no other build imports numba, nor the build's own process unless it
encodes itself (``num_proc`` 1).
"""

from __future__ import annotations

import numba
import numpy as np

from packtrain.pipeline.pack import near_dup, near_words

_M1, _M2 = near_words.MIX  # near_words.mix64's
_FNV, _GOLD = near_words.P, near_dup.GOLDEN  # near_dup.band_keys's, near_dup.grams's
_FRAGMENT, _BEFORE, _TRAIL, _EMPTY = near_words.FRAGMENT, near_words.BEFORE, near_words.TRAIL, near_words.EMPTY
_NONE = np.uint64(0xFFFFFFFF)  # near_dup.signatures's hash of a text without grams
_TOP = np.uint64(0xFFFFFFFFFFFFFFFF)


@numba.njit(inline="always")
def _mix64(x):
    """near_words.mix64 of one uint64."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


@numba.njit(inline="always")
def _text_words(tokens, masks, a, b, answer, table, words):
    """The word hashes of one text into ``words`` (the tokens ``a .. b - 1`` the loss is on where
    ``answer``, else those it is not on), their number returned: near_words.Units.words for one text
    (``table``: the tokenizer's units, :func:`_table`). A fragment after a space (its own, or a unit's
    before it, which an empty unit passes on) or first in its text begins a word; each word's hash is
    written at every unit and kept where the next begins."""
    single, first, count, listed, flags, length, hashes, piece, piece_start, data, power, shift = table
    n = 0
    acc = np.uint64(0)
    place = 0
    spaced = True  # the text's first fragment begins a word
    begun = 0  # a word has begun
    for i in range(a, b):
        if (masks[i] != 0) != answer:
            continue
        t = tokens[i]
        lo, hi = (t, t + 1) if single else (first[t], first[t] + count[t])
        for j in range(lo, hi):
            u = t if single else listed[j]
            f = flags[u]
            starts = (f & _FRAGMENT) != 0 and ((f & _BEFORE) != 0 or spaced)
            words[n] = _mix64(acc)
            n += starts and begun
            begun |= starts
            if starts:
                acc = np.uint64(0)
                place = 0
            size = length[u]  # 0 without a fragment (its hash is 0 too)
            if (place & 63) + size <= 64:
                acc += hashes[u] * shift[place & 63]
            else:  # a fragment across a multiple of 64 bytes of its word: byte by byte (Pieces.by_byte)
                s = piece_start[piece[u]]
                for k in range(size):
                    acc += (np.uint64(data[s + k]) + np.uint64(1)) * power[(place + k) & 63]
            place += size
            if (f & _EMPTY) == 0:  # a special token: the space before it goes on past it
                spaced = (f & _TRAIL) != 0
    words[n] = _mix64(acc)
    return n + begun


@numba.njit(inline="always")
def _signature(words, n, mult, add, lowest, out):
    """near_dup.signatures of one text's ``n`` words (their near_dup.grams: 3-grams, or one gram of a
    shorter text's words) into ``out``."""
    perms = mult.shape[0]
    if n == 0:
        for k in range(perms):
            out[k] = _NONE
        return
    for k in range(perms):
        lowest[k] = _TOP
    grams = n - 2 if n >= 3 else 1
    for w in range(grams):
        if n >= 3:
            g = _mix64(_mix64(words[w] * _GOLD + words[w + 1]) * _GOLD + words[w + 2])
        elif n == 2:
            g = _mix64(words[0] * _GOLD + words[1])
        else:
            g = words[0]
        for k in range(perms):
            lowest[k] = min(lowest[k], g * mult[k] + add[k])
    for k in range(perms):
        out[k] = lowest[k] >> np.uint64(32)


def _array(dtype, ndim: int = 1, readonly: bool = True):
    return numba.types.Array(dtype, ndim, "C", readonly=readonly)


_INT, _U64 = _array(numba.int64), _array(numba.uint64)
_SIGNATURE = numba.void(
    numba.types.Tuple((_array(numba.uint32), _array(numba.uint8), _INT)),  # tokens, masks, lengths
    numba.types.Tuple((numba.boolean, _INT, _INT, _INT, _array(numba.uint8), _array(numba.int32), _U64, _INT, _INT,
                       _array(numba.uint8), _U64, _U64)),  # :func:`_table`
    numba.types.Tuple((_U64, _U64, numba.int64)),  # the permutations' multipliers and addends, the band's rows
    _array(numba.uint64, 2, readonly=False))
"""Its one compiled signature (every input read-only, which writable arrays also pass as): compiled, or
loaded from numba's cache, as this module is imported."""


def _compiled(function):
    """``function`` compiled for :data:`_SIGNATURE`, kept in numba's cache; compiled in each process that
    imports this (2 s) where numba has no directory to write its cache to (neither this module's nor the
    user's cache directory: a read-only install run by a user without a home). A cache numba cannot read
    back (a file cut short or damaged: numba's unpickling error, on every import) is compiled again and
    written over, as a damaged token table is (pipeline/pack/near_tables.py)."""
    try:
        return numba.njit(_SIGNATURE, cache=True)(function)
    except RuntimeError:  # numba's "cannot cache function ...: no locator available"
        return numba.njit(_SIGNATURE)(function)
    except Exception:  # the cache's files do not read back: emptied, then compiled and kept anew
        numba.njit(cache=True)(function)._cache.flush()
        return numba.njit(_SIGNATURE, cache=True)(function)


@_compiled
def _bands(batch, table, permutations, out):
    tokens, masks, lengths = batch
    mult, add, rows = permutations
    count = table[2]
    most = 1
    for d in range(lengths.shape[0]):
        most = max(most, lengths[d])
    most_units = 1
    for t in range(count.shape[0]):
        most_units = max(most_units, count[t])
    words = np.empty(most * most_units + 1, np.uint64)
    signature = np.empty((2, mult.shape[0]), np.uint64)
    lowest = np.empty(mult.shape[0], np.uint64)
    a = 0
    for d in range(lengths.shape[0]):
        b = a + lengths[d]
        for part in range(2):
            n = _text_words(tokens, masks, a, b, part == 1, table, words)
            _signature(words, n, mult, add, lowest, signature[part])
        a = b
        for band in range(out.shape[1]):  # near_dup.band_keys
            key = np.uint64(band)
            for part in range(2):
                for r in range(rows):
                    key = _mix64(key * _FNV + signature[part, band * rows + r])
            out[d, band] = key


def _table(units: near_words.Units) -> tuple:
    """What the kernel reads of ``units`` (near_words.Units and its Pieces), in its dtypes: theirs, so a
    batch copies none of them."""
    pieces = units.pieces
    ints = [np.ascontiguousarray(a, np.int64) for a in (units.first, units.count, units.listed, units.piece, pieces.start)]
    return (units.single, *ints[:3], np.ascontiguousarray(units.flags, np.uint8),
            np.ascontiguousarray(units.length, np.int32), np.ascontiguousarray(units.hash, np.uint64), *ints[3:],
            np.ascontiguousarray(pieces.data, np.uint8), near_words._POW, near_words._SHIFT)


def batch_bands(units: near_words.Units, tokens: np.ndarray, masks: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The band keys, uint64 [documents, near_dup.BANDS], of the documents whose ``tokens`` and loss
    ``masks`` are concatenated, ``lengths`` tokens each (ids of the tokenizer ``units`` describes)."""
    out = np.zeros((len(lengths), near_dup.BANDS), np.uint64)
    if len(lengths):
        batch = (np.ascontiguousarray(tokens, np.uint32), np.ascontiguousarray(masks, np.uint8),
                 np.ascontiguousarray(lengths, np.int64))
        _bands(batch, _table(units), (near_dup._A, near_dup._B, near_dup.ROWS), out)
    return out
