"""Near dedup's compiled band keys (pipeline/pack/near_kernel.py) against the NumPy reference that defines
the measure (near_dup.bands_of over near_words.SpillWords), bit for bit: on hostile token tables, on the
real tokenizers' texts, whatever dtypes a batch comes in; and numba is imported only where a build asks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hostile_text import hostile_pairs, hostile_texts
from packtrain.pipeline.pack import near_dup, near_kernel, near_words
from real_tokenizers import REAL_TOKENIZERS, hf_tokenizer
from test_near_dup import spill_of

# special tokens (""), all-space tokens, tokens spaced on either side or both, words of two and three
# fragments in one token, words past 64 bytes (a fragment across the 64th byte: hashed byte by byte), non-ASCII
PIECES = ["", "", " ", "  \n", "a", " b", "c ", " d e ", "x" * 70, " " + "y" * 63, "zz", "\u00c9t\u00e9", "q r s",
          "SELECT", "(*)", " 12", "w" * 40, "\t", "z" * 61, " " + "v" * 129]


def reference(units: near_words.Units, docs: list[tuple[list[int], list[int]]]) -> np.ndarray:
    spill = spill_of(docs)
    return near_dup.bands_of(near_words.SpillWords({"train": [spill]}, units))("train", 0, np.arange(len(docs)))


def hostile_docs(seed: int, pieces: int, n: int = 400) -> list[tuple[list[int], list[int]]]:
    """Documents of random tokens, conversations (masks at random) and prompt/answer rows (0s then 1s), some
    empty, some all one part, some opening and closing with runs of special tokens (ids 0 and 1)."""
    rng = np.random.default_rng(seed)
    docs = []
    for k in rng.integers(0, 40, n):
        ids = rng.integers(0, pieces, k).tolist()
        kind = rng.integers(0, 4)
        mask = (rng.integers(0, 2, k) if kind == 0 else np.arange(k) >= rng.integers(0, k + 1) if kind == 1
                else np.full(k, kind == 2)).astype(int).tolist()
        if rng.integers(0, 3) == 0:
            ids, mask = [0, 1, 0] + ids + [1, 1], [0, 0, 1] + mask + [1, 0]
        docs.append((ids, mask))
    return docs


@pytest.mark.parametrize("two_words", [True, False])
def test_the_kernel_makes_the_reference_keys_on_hostile_tokens(two_words):
    pieces = PIECES if two_words else [p if p.strip().count(" ") == 0 else "v" for p in PIECES]
    units = near_words.table_units(near_words.token_table(pieces))
    assert units.single is not two_words
    docs = hostile_docs(51, len(pieces))
    expected = reference(units, docs)
    spill = spill_of(docs)
    got = near_kernel.batch_bands(units, spill.tokens, spill.masks, spill.lengths)
    assert got.dtype == np.uint64 and got.shape == (len(docs), near_dup.BANDS)
    assert got.tolist() == expected.tolist()
    assert len({tuple(row) for row in expected.tolist()}) > 300  # not one key for all
    # the dtypes a batch may come in: uint16 tokens (a small vocabulary's spill), a boolean mask, int32 lengths
    small = near_kernel.batch_bands(units, spill.tokens.astype(np.uint16), spill.masks.astype(bool),
                                    spill.lengths.astype(np.int32))
    assert small.tolist() == expected.tolist()


def test_no_documents_and_empty_documents():
    units = near_words.table_units(near_words.token_table(PIECES))
    empty = np.zeros(0, np.uint32)
    assert near_kernel.batch_bands(units, empty, empty.astype(np.uint8), np.zeros(0, np.int64)).shape == (0, 12)
    docs = [([], []), ([0, 1], [0, 1]), ([2], [1])]  # no token; only special tokens; only a space
    keys = near_kernel.batch_bands(units, *(lambda s: (s.tokens, s.masks, s.lengths))(spill_of(docs)))
    assert keys.tolist() == reference(units, docs).tolist()
    assert keys[0].tolist() == keys[1].tolist() == keys[2].tolist()  # no word in either part: the same keys


@pytest.mark.parametrize("name", REAL_TOKENIZERS)
def test_the_kernel_makes_the_reference_keys_on_a_real_tokenizers_hostile_texts(real_tokenizer, name):
    directory = real_tokenizer(name)
    tokenizer = hf_tokenizer(directory)
    units = near_words.table_units(near_words.tokenizer_table((directory / "tokenizer.json").read_text(),
                                                              tokenizer.get_vocab_size()))
    pairs = hostile_pairs(52, 150) + [(a, b) for a, b in zip(hostile_texts(53, 50, 60), hostile_texts(54, 50, 60))]
    docs = []
    for prompt, answer in pairs:
        p = tokenizer.encode(prompt, add_special_tokens=False).ids
        a = tokenizer.encode(answer, add_special_tokens=False).ids
        docs.append((p + a, [0] * len(p) + [1] * len(a)))
    spill = spill_of(docs)
    got = near_kernel.batch_bands(units, spill.tokens, spill.masks, spill.lengths)
    assert got.tolist() == reference(units, docs).tolist()


def imports_numba(spec: dict | None) -> bool:
    """Whether the fork server's preload (pipeline/encode/fork_server.py) imports numba, given its spec."""
    environment = {k: v for k, v in os.environ.items() if k != "PACKTRAIN_WORKER_ENCODERS"}
    if spec is not None:
        environment["PACKTRAIN_WORKER_ENCODERS"] = json.dumps(spec)
    code = ("import sys\nfrom packtrain.pipeline.encode import fork_server\n"
            "fork_server._preload_from_environment()\nprint('numba' in sys.modules, flush=True)\n")
    out = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, check=True)
    return out.stdout.split() == ["True"]


def test_the_fork_server_imports_numba_only_for_a_build_that_asks_for_near_dedup(tmp_path):
    spec = {"tokenizer_file": str(tmp_path / "tokenizer.json"), "tokenizer_sha256": "0" * 64, "fast_encoders": [],
            "line_cache": False}
    assert imports_numba({**spec, "near": True})
    assert not imports_numba({**spec, "near": False}) and not imports_numba(spec) and not imports_numba(None)


def test_the_kernel_compiles_where_numba_can_keep_no_cache():
    """Where numba finds no directory to keep the compiled kernel in (a read-only install run by a user
    without a home; here: no cache locator that applies), each process compiles it: the same keys."""
    code = ("import numpy as np\nfrom packtrain.pipeline.pack import near_kernel, near_words\n"
            "units = near_words.table_units(near_words.token_table(['a', ' b', '']))\n"
            "keys = near_kernel.batch_bands(units, np.array([0, 1, 2, 1], np.uint32), np.array([0, 0, 1, 1], np.uint8), "
            "np.array([3, 1]))\n"
            "print(type(near_kernel._bands._cache).__name__, keys[:, 0].tolist())\n")
    runs = [subprocess.run([sys.executable, "-c", code], env={**os.environ, **extra}, capture_output=True, text=True,
                           check=True).stdout.split(" ", 1) for extra in ({"NUMBA_CACHE_LOCATOR_CLASSES": "ZipCacheLocator"}, {})]
    assert [run[0] for run in runs] == ["NullCache", "FunctionCache"] and runs[0][1] == runs[1][1]


def test_a_cache_numba_cannot_read_back_is_compiled_again_and_written_over(tmp_path):
    """numba's cache files cut short (a copy or a disk that failed): importing the kernel raised numba's
    UnpicklingError in every worker of every near build, a traceback; now it compiles again, the same keys,
    and keeps a whole cache that the next process loads."""
    code = ("import numpy as np\nfrom packtrain.pipeline.pack import near_kernel, near_words\n"
            "units = near_words.table_units(near_words.token_table(['a', ' b', '']))\n"
            "keys = near_kernel.batch_bands(units, np.array([0, 1, 2, 1], np.uint32), np.array([0, 0, 1, 1], np.uint8), "
            "np.array([3, 1]))\n"
            "print(sum(near_kernel._bands.stats.cache_hits.values()), keys[:, 0].tolist())\n")
    environment = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}

    def run() -> list[str]:
        return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True,
                              check=True).stdout.split(" ", 1)

    compiled = run()
    kept = sorted(tmp_path.rglob("near_kernel._bands-*.nb*"))
    assert compiled[0] == "0" and [p.suffix for p in kept] == [".nbc", ".nbi"]
    for path in kept:
        path.write_bytes(path.read_bytes()[:100])
    again = run()
    assert again == compiled and run() == ["1", compiled[1]]  # compiled again; then loaded from the cache it wrote
