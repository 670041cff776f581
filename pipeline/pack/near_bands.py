"""Near dedup's band keys (pipeline/pack/near_dup.py), made where the tokens are made: an encode worker
hashes each batch's documents as it tokenizes them (pipeline/encode/worker.py), and the spill keeps their
keys beside their tokens (``<split>.bands``, pipeline/pack/spill.py). The build's process then reads a
uint64 per document and band to bucket them, and hashes again only the documents that share a bucket
(their exact check), not every document's words after tokenizing.

The keys are those :func:`near_dup.bands_of` makes from the spill's words (:class:`near_words.SpillWords`),
the reference, made by one compiled pass (pipeline/pack/near_kernel.py): a document's keys depend on its
tokens and loss mask only, not on the batch it came in (tests/test_near_bands.py, tests/test_near_kernel.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np

from packtrain.core.errors import ContractError
from packtrain.pipeline.pack import near_dup, near_tables, near_words


@functools.lru_cache(maxsize=2)
def units(tokenizer_file: str, content_hash: str, vocab_size: int) -> near_words.Units:
    """The token units of the tokenizer.json ``tokenizer_file`` (sha256 ``content_hash``), from the
    machine's table store (pipeline/pack/near_tables.py; made and kept there where it is not), once a
    process and build: an encode worker's (or the build's process, where it encodes) are used again
    by the build's exact checks, and forgotten after them (``units.cache_clear()``, shards.find_near)."""
    return near_words.table_units(near_tables.token_table(Path(tokenizer_file), content_hash, vocab_size))


def batch_bands(token_units: near_words.Units, tokens: np.ndarray, masks: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The band keys, uint64 [documents, BANDS], of the documents whose ``tokens`` and loss ``masks``
    are concatenated, ``lengths`` tokens each (a batch as a worker assembles it): compiled
    (pipeline/pack/near_kernel.py, imported here only: the build's own process, which buckets the
    keys, never loads numba where its workers encode)."""
    from packtrain.pipeline.pack import near_kernel

    return near_kernel.batch_bands(token_units, tokens, masks, lengths)


def spilled(spills: dict) -> Callable[[str, int, np.ndarray], np.ndarray]:
    """``bands`` for :func:`near_dup.find` from a build's spills (per split, per source: a
    pipeline/pack/spill.py ``SourceSpill``), which the workers wrote with their documents' band keys."""
    for split, sources in spills.items():
        for s, spill in enumerate(sources):
            if len(spill.lengths) and not spill.has_bands():  # its source key says it has them: a damaged cache
                raise ContractError(f"source {s}'s {split} tokens were cached without near dedup's band keys: "
                                    "remove the cache's .sources directory and build again")

    def bands(split: str, source: int, indices: np.ndarray) -> np.ndarray:
        return spills[split][source].bands[indices]

    return bands


class SpillParts:
    """``parts`` for :func:`near_dup.find` from a build's spills: :class:`near_words.SpillWords`, its token
    units (:func:`units`) read at the first documents asked for (none where no two share a bucket)."""

    def __init__(self, spills: dict, tokenizer):
        self.spills, self.tokenizer, self.words = spills, tokenizer, None

    def __call__(self, split: str, source: int, indices: np.ndarray):
        if self.words is None:
            info = self.tokenizer
            self.words = near_words.SpillWords(self.spills, units(
                str(info.directory / "tokenizer.json"), info.fingerprint["files"]["tokenizer.json"], info.vocab_size))
        return self.words(split, source, indices)
