"""Near-duplicate documents (``build.dedup: near``) and the overlap of training with validation
(contamination: ``build.decontaminate``). Pure functions on texts and arrays, and :func:`find`.

The measure. A document is cut in two by its loss mask: the prompt (the tokens the loss is not on)
and the answer (the tokens it is on). Each part's text is what its tokens read as
(special tokens left out), lowercased, every run of whitespace one space (pipeline/pack/near_words.py), and
the part is the set of its word :data:`NGRAM`-grams (a part of fewer words: one gram of all of them). Two documents are near-duplicates when the Jaccard similarity of
their prompts AND of their answers is at least ``build.dedup_threshold`` (two empty parts are equal).
Both, because a shared long context (a database schema, a system prompt) does not make two different
questions duplicates, and the same short answer to another question is not one either. Case changes
(of ASCII letters and of the letters str.lower() knows) and whitespace changes leave the grams as they were.

The search. Each part gets a MinHash signature of :data:`NUM_PERM` hashes (one multiply-shift hash
per permutation over 64-bit gram hashes, vectorised over a batch of documents); :data:`BANDS` LSH
bands, each of :data:`ROWS` hashes of both parts' signatures, put documents that may be
near-duplicates in a bucket. A pair that shares a bucket is a candidate, and a candidate is a
near-duplicate only by the exact Jaccard of its gram sets: no pair below the threshold is ever
dropped. A pair with both similarities at 0.8 shares a bucket with probability
1 - (1 - 0.8^6)^12 = 0.974 (0.9999 at 0.9, 0.17 at 0.5: a candidate the exact check turns down);
candidates whose signatures agree on fewer than :data:`LIKELY` of their hashes skip the exact check.

Documents are visited in a fixed order (validation first, then training; sources in config order;
documents in their source's order), whatever ``num_proc`` or the parts that tokenized them: a
training document is dropped when it is a near-duplicate of a training document kept before it, and
reported (dropped with ``decontaminate``) when it is one of a validation document.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from packtrain.pipeline.pack.near_words import P, mix64

METHOD = "minhash-lsh/word-3-grams/36x3x12"
"""The measure and search, named in the build id (a change to either is a new build)."""
NGRAM = 3
"""Words per gram (short SFT texts: 3; datatrove's web default is 5)."""
NUM_PERM = 36
"""MinHash hashes per part of a document."""
BANDS, ROWS = 12, 3
"""LSH bands (12), each of 3 hashes of each part: BANDS * ROWS == NUM_PERM."""
LIKELY = 0.55
"""A candidate pair is checked exactly only where its MinHash estimate of both similarities is at
least this (at a true 0.8 the estimate of 36 hashes falls below 0.55 with probability about 1e-4)."""
BATCH = 2048
"""Documents hashed at once (a batch's band keys do not depend on it)."""
GATHERED = 1 << 16
"""Documents whose band keys :func:`find` reads from a spill at once."""
EXAMPLES = 3
"""Pairs the build's summary prints per kind (near-duplicates, contamination)."""
LISTED = 1000
"""Pairs listed in report.json (``packtrain inspect --dropped``); the rest counted."""
SHOWN = 160
"""Characters of a listed document shown: the end of its prompt, the start of its answer."""

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
"""What :func:`grams` multiplies a gram by before it adds the next word (2**64 / the golden ratio)."""

_RNG = np.random.Generator(np.random.PCG64(20261206))
_A = _RNG.integers(1, 2**63, NUM_PERM, dtype=np.uint64) * np.uint64(2) + np.uint64(1)  # odd multipliers
_B = _RNG.integers(0, 2**63, NUM_PERM, dtype=np.uint64)


def asked(build) -> bool:
    """Whether the build settings ``build`` (the config's ``build``) ask for near dedup or the contamination check."""
    return build.dedup == "near" or build.decontaminate


def grams(words: np.ndarray, counts: np.ndarray, n: int = NGRAM) -> tuple[np.ndarray, np.ndarray]:
    """Each text's word ``n``-gram hashes (a text of fewer than ``n`` words: one gram of all of them;
    of none: no gram), in text order, and the number of grams per text.

    >>> w = np.array([1, 2, 3, 4, 5, 6], np.uint64)
    >>> g, c = grams(w, np.array([4, 0, 2]), n=3)
    >>> c.tolist(), len(g), bool(g[2] == grams(np.array([5, 6], np.uint64), np.array([2]), n=3)[0][0])
    ([2, 0, 1], 3, True)
    """
    per_text = np.where(counts >= n, counts - n + 1, np.minimum(counts, 1))
    out = np.zeros(int(per_text.sum()), np.uint64)
    if not len(out):
        return out, per_text
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    text_of_word = np.repeat(np.arange(len(counts)), counts)
    long_slot = np.repeat(counts >= n, per_text)
    g = words.copy()
    by_length = {1: g.copy()}
    for m in range(2, n + 1):
        with np.errstate(over="ignore"):
            g = mix64(g[:-1] * GOLDEN + words[m - 1:])
        by_length[m] = g
    if n > len(words):
        valid = np.zeros(0, bool)
    else:
        valid = text_of_word[: len(words) - n + 1] == text_of_word[n - 1:]
    out[long_slot] = by_length[n][valid] if len(valid) else []
    short = np.flatnonzero((counts > 0) & (counts < n))
    out[~long_slot] = [by_length[int(counts[t])][first[t]] for t in short]
    return out, per_text


def signatures(gram_hashes: np.ndarray, per_text: np.ndarray) -> np.ndarray:
    """The MinHash signature (NUM_PERM uint32 values as uint64) of each text's grams; a text without
    grams gets all ones (2**32 - 1), which only another gramless text shares. One permutation at a
    time over one reused buffer, the shift after the minimum (it keeps order): the same values."""
    out = np.full((len(per_text), NUM_PERM), 0xFFFFFFFF, np.uint64)
    has = per_text > 0
    if has.any():
        starts = np.concatenate([[0], np.cumsum(per_text[has])[:-1]])
        hashed = np.empty(len(gram_hashes), np.uint64)
        lowest = np.empty((NUM_PERM, len(starts)), np.uint64)
        with np.errstate(over="ignore"):
            for k in range(NUM_PERM):
                np.multiply(gram_hashes, _A[k], out=hashed)
                hashed += _B[k]
                lowest[k] = np.minimum.reduceat(hashed, starts)
        lowest >>= np.uint64(32)
        out[has] = lowest.T
    return out


def band_keys(prompt_sig: np.ndarray, answer_sig: np.ndarray) -> np.ndarray:
    """One uint64 bucket key per document and band, from ROWS hashes of each part's signature: band b's
    key mixes b, then hashes b * ROWS .. b * ROWS + ROWS - 1 of the prompt's, then of the answer's (every
    band at once: its r-th hash of a part is that part's column b * ROWS + r)."""
    keys = np.repeat(np.arange(BANDS, dtype=np.uint64)[None, :], len(prompt_sig), 0)
    for sig in (prompt_sig, answer_sig):
        for r in range(ROWS):
            with np.errstate(over="ignore"):
                keys = mix64(keys * P + sig[:, r::ROWS])
    return keys


def gram_sets(words: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    """Each text's sorted, distinct gram hashes (what :func:`jaccard` compares)."""
    g, per_text = grams(words, counts)
    bounds = np.concatenate([[0], np.cumsum(per_text)])
    return [np.unique(g[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity of two sorted distinct arrays; two empty ones are equal (1.0).

    >>> jaccard(np.array([1, 2, 3]), np.array([2, 3, 4])), jaccard(np.array([]), np.array([]))
    (0.5, 1.0)
    """
    if not len(a) and not len(b):
        return 1.0
    both = len(np.intersect1d(a, b, assume_unique=True))
    return both / (len(a) + len(b) - both)


@dataclass
class Doc:
    """Where a document is: its split, source and index in that source's spill."""
    split: str
    source: int
    index: int

    def to_dict(self) -> dict:
        return {"split": self.split, "source": self.source, "document": self.index}


class Visiting:
    """The documents ``kept`` (per split, per source: indices) in visiting order, as arrays (a
    million documents are 24 MB here, not a million objects); ``[p]`` is the ``p``-th as a :class:`Doc`."""

    SPLITS = ("val", "train")

    def __init__(self, kept: dict[str, list[np.ndarray]]):
        parts = [(k, s, np.asarray(indices, np.int64)) for k, split in enumerate(self.SPLITS)
                 for s, indices in enumerate(kept[split])]
        self.split = np.concatenate([np.full(len(i), k, np.int8) for k, _, i in parts] or [np.zeros(0, np.int8)])
        self.source = np.concatenate([np.full(len(i), s, np.int32) for _, s, i in parts] or [np.zeros(0, np.int32)])
        self.index = np.concatenate([i for _, _, i in parts] or [np.zeros(0, np.int64)])

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, p: int) -> Doc:
        return Doc(self.SPLITS[self.split[p]], int(self.source[p]), int(self.index[p]))


@dataclass
class Found:
    """What :func:`find` found (docs/BUILD.md, "Near-duplicates and contamination")."""
    dropped: dict[str, list[np.ndarray]]
    """Per split, per source: a boolean per document, True where it is not to be packed."""
    near: list[int]
    """Per source: training documents dropped as near-duplicates of an earlier training document."""
    overlap: list[int]
    """Per source: validation documents with a near-duplicate (not an exact copy) in training."""
    contaminated: list[int]
    """Per source: training documents that are near-duplicates of a validation document."""
    pairs: list[dict] = field(default_factory=list)
    """Every dropped or overlapping pair: kind, the document, the one it matches, both similarities."""
    clusters: list[int] = field(default_factory=list)
    """Sizes of the near-duplicate clusters (a kept document and those dropped for it), 2 and up."""


def find(parts, bands, kept: dict[str, list[np.ndarray]], sizes: dict[str, list[int]], threshold: float,
         decontaminate: bool, dedup: bool) -> Found:
    """Near-duplicates among the documents ``kept`` (per split, per source: the indices exact dedup
    kept, of ``sizes[split][source]`` documents). ``bands(split, source, indices)``: those documents'
    band keys, uint64 [documents, BANDS] (the encode workers made them: pipeline/pack/near_bands.py;
    :func:`bands_of` makes them from ``parts``); ``parts(split, source, indices) -> (prompt words,
    counts, answer words, counts)``: the words of the documents sharing a bucket, for the exact check.
    ``dedup``: drop training near-duplicates of kept training documents; ``decontaminate``: drop
    training near-duplicates of validation documents (always counted and paired)."""
    order = Visiting(kept)
    keys = np.zeros((len(order), BANDS), np.uint64)
    at = 0
    for split in Visiting.SPLITS:
        for s, indices in enumerate(kept[split]):
            for a in range(0, len(indices), GATHERED):  # a source's keys a slice at a time: no second copy of them
                chunk = indices[a : a + GATHERED]
                keys[at + a : at + a + len(chunk)] = bands(split, s, chunk)
            at += len(indices)
    candidates = colliding(keys)
    sources = len(kept["train"])
    found = Found({split: [np.zeros(n, bool) for n in sizes[split]] for split in ("val", "train")},
                  [0] * sources, [0] * sources, [0] * sources)
    if not len(candidates):
        return found
    greedy(order, keys, candidates, parts, threshold, decontaminate, dedup, found)
    return found


def words_bands(prompt_words: np.ndarray, prompt_counts: np.ndarray, answer_words: np.ndarray,
                answer_counts: np.ndarray) -> np.ndarray:
    """The band keys (:func:`band_keys`) of documents from their prompts' and answers' words (and word counts)."""
    return band_keys(signatures(*grams(prompt_words, prompt_counts)), signatures(*grams(answer_words, answer_counts)))


def bands_of(parts):
    """``bands`` for :func:`find` made from ``parts``, :data:`BATCH` documents at a time: the keys the
    encode workers spill (pipeline/pack/near_bands.py) for the same words."""
    def bands(split: str, source: int, indices: np.ndarray) -> np.ndarray:
        out = np.zeros((len(indices), BANDS), np.uint64)
        for a in range(0, len(indices), BATCH):
            out[a : a + BATCH] = words_bands(*parts(split, source, indices[a : a + BATCH]))
        return out

    return bands


def colliding(keys: np.ndarray, bits: int = 22) -> np.ndarray:
    """Positions (in visiting order) of the documents that share a bucket with another one in any band.
    A band's keys are mixed 64-bit hashes: only those whose top ``bits`` bits some other key has too
    (a count per value of them, O(n)) can be equal, and only these are sorted (a fifth of a million
    keys at 22 bits, instead of all of them: 0.4 s of CPU instead of 1.1 s for a million documents).

    >>> colliding(np.array([[5, 1 << 63], [6, 1 << 63], [5, 7]], np.uint64), bits=2).tolist()
    [0, 1, 2]
    """
    hit = np.zeros(len(keys), bool)
    for b in range(keys.shape[1]):
        top = (keys[:, b] >> np.uint64(64 - bits)).astype(np.intp)
        maybe = np.flatnonzero(np.bincount(top, minlength=1 << bits)[top] > 1)
        _, inverse, counts = np.unique(keys[maybe, b], return_inverse=True, return_counts=True)
        hit[maybe[counts[inverse] > 1]] = True
    return np.flatnonzero(hit)


def greedy(order: Visiting, keys: np.ndarray, candidates: np.ndarray, parts, threshold: float,
           decontaminate: bool, dedup: bool, found: Found) -> None:
    """Visit the colliding documents in order, each training one against the documents in its
    buckets visited before it: validation ones (contamination), then kept training ones (a near-duplicate)."""
    known = Candidates(order, candidates, parts)
    buckets: list[dict] = [{} for _ in range(BANDS)]
    cluster: dict[int, int] = {}
    for p in candidates.tolist():
        doc = order[p]
        if doc.split == "train":
            seen = np.array(sorted({q for b in range(BANDS) for q in buckets[b].get(int(keys[p, b]), ())}), np.int64)
            seen = known.likely(p, seen)
            is_val = order.split[seen] == 0
            val = known.first_match(p, seen[is_val], threshold)
            if val is not None:
                record(found, "contamination", doc, order[val[0]], val[1], decontaminate)
            train = known.first_match(p, seen[~is_val], threshold) if dedup else None
            if train is not None and not found.dropped["train"][doc.source][doc.index]:
                record(found, "near", doc, order[train[0]], train[1], True)
                cluster[train[0]] = cluster.get(train[0], 1) + 1
            if found.dropped["train"][doc.source][doc.index]:
                continue
        for b in range(BANDS):
            buckets[b].setdefault(int(keys[p, b]), []).append(p)
    found.clusters = sorted(cluster.values(), reverse=True)


class Candidates:
    """The colliding documents' signatures (both parts, one row each) and exact gram sets, made once."""

    def __init__(self, order: Visiting, candidates: np.ndarray, parts):
        self.row = {p: r for r, p in enumerate(candidates.tolist())}
        self.signature = np.zeros((len(candidates), 2, NUM_PERM), np.uint64)
        self.sets: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for k, s in {(int(order.split[p]), int(order.source[p])) for p in candidates.tolist()}:
            positions = candidates[(order.split[candidates] == k) & (order.source[candidates] == s)]
            for a in range(0, len(positions), BATCH):
                chunk = positions[a : a + BATCH]
                pw, pc, aw, ac = parts(Visiting.SPLITS[k], s, order.index[chunk])
                rows = [self.row[p] for p in chunk.tolist()]
                for part, (w, c) in enumerate(((pw, pc), (aw, ac))):
                    self.signature[rows, part] = signatures(*grams(w, c))
                for p, ps, ans in zip(chunk.tolist(), gram_sets(pw, pc), gram_sets(aw, ac)):
                    self.sets[p] = (ps, ans)

    def likely(self, p: int, earlier: np.ndarray) -> np.ndarray:
        """The ``earlier`` documents whose MinHash estimate of both similarities with ``p`` is at least
        :data:`LIKELY` (a pair at 0.8 estimates below it with probability 1e-4): the only ones worth
        the exact check."""
        if not len(earlier):
            return earlier
        rows = np.array([self.row[q] for q in earlier.tolist()])
        agree = (self.signature[rows] == self.signature[self.row[p]]).mean(axis=2).min(axis=1)
        return earlier[agree >= LIKELY]

    def first_match(self, p: int, earlier: np.ndarray, threshold: float) -> tuple[int, tuple[float, float]] | None:
        """The first of the ``earlier`` documents ``p`` is a near-duplicate of (exact Jaccard of both
        parts), with both similarities, or None."""
        for q in earlier.tolist():
            sims = (jaccard(self.sets[p][0], self.sets[q][0]), jaccard(self.sets[p][1], self.sets[q][1]))
            if min(sims) >= threshold:
                return q, sims
        return None


def record(found: Found, kind: str, doc: Doc, match: Doc, sims: tuple[float, float], drop: bool) -> None:
    if kind == "contamination":
        found.contaminated[doc.source] += 1
        found.overlap[match.source] += 1
    else:
        found.near[doc.source] += 1
    found.dropped["train"][doc.source][doc.index] |= drop
    found.pairs.append({"kind": kind, "dropped": bool(drop), "document": doc.to_dict(), "of": match.to_dict(),
                        "jaccard": {"prompt": round(sims[0], 3), "answer": round(sims[1], 3)}})
