"""The line cache cuts where each split regex allows, and only tokenizers with such a cut qualify.
Its exactness against the HF tokenizer on hostile text and real data: tests/test_exactness.py."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer

from build_fixtures import make_tokenizer
from packtrain.core.contract import BUNDLED_MODEL_DIR
from packtrain.pipeline.encode.fast.line_cache import LONE_NEWLINE_CUT, NEWLINE_RUN_CUT, LineCache, line_cut

ALPHABET = ["a", "b", "Z", "é", "\u0301", "中", "7", "42", " ", "  ", "\t", "\n", "\n\n", "\r\n", ".", ")", "#",
            "'s", "'", "<|im_start|>", "<|endoftext|>", "SELECT", " FROM", "x_y", "\u00a0", "🙂"]


def random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


def cache_mismatches(tokenizer: Tokenizer, cut, prompts: list[str], answers: list[str]) -> tuple[int, int]:
    """(documents the line cache made, how many of them differ from whole-text encoding)."""
    cache = LineCache(lambda texts: [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)], cut)
    made = differ = 0
    for (prompt, answer), got in zip(zip(prompts, answers), cache.encode(prompts, answers)):
        if got is None:
            continue
        made += 1
        ids, n_prompt = got
        differ += (ids != tokenizer.encode(prompt + answer, add_special_tokens=False).ids
                   or n_prompt != len(tokenizer.encode(prompt, add_special_tokens=False).ids))
    return made, differ


def test_each_split_regex_gets_its_own_cut(tmp_path):
    bundled = json.loads((BUNDLED_MODEL_DIR / "tokenizer.json").read_text())
    assert line_cut(bundled) == (NEWLINE_RUN_CUT, "GPT-4 / Llama-3 / Qwen split regex + byte-level")
    fixture = json.loads((make_tokenizer(tmp_path / "t") / "tokenizer.json").read_text())
    assert line_cut(fixture) == (LONE_NEWLINE_CUT, "GPT-2 byte-level pre-tokenizer: cut only at lone newlines")


def test_the_cuts_literally():
    assert NEWLINE_RUN_CUT.split("t (x)\n\n### Q\nwhy\n x\n") == ["t (x)\n\n", "### Q\n", "why\n x\n"]
    # GPT-2: "\n\n###" is Ċ Ċ ### whole, but a line "...\n\n" would end in ĊĊ: no cut there
    assert LONE_NEWLINE_CUT.split("t (x)\n\n### Q\nwhy\n x\n") == ["t (x)\n\n### Q\n", "why\n x\n"]
    assert LONE_NEWLINE_CUT.split("a\r\nb\t\nc\nd") == ["a\r\nb\t\nc\n", "d"]


def test_other_tokenizers_do_not_qualify():
    spec = json.loads((BUNDLED_MODEL_DIR / "tokenizer.json").read_text())
    assert line_cut({**spec, "normalizer": {"type": "Lowercase"}})[0] is None
    assert line_cut({**spec, "model": {"type": "WordPiece"}})[0] is None
    lstrip = [*spec["added_tokens"], {"id": 9999, "content": "<mask>", "lstrip": True}]
    assert line_cut({**spec, "added_tokens": lstrip}) == (None, "added token '<mask>' can absorb or hold a newline")
    prefix = json.loads(json.dumps(spec))
    prefix["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True
    assert line_cut(prefix)[0] is None


def test_smollm2_with_the_newline_run_cut_differs_and_with_its_own_does_not(real_tokenizer):
    """The bug this cut fixes: GPT-2's regex gives a whitespace run's last newline a token of its own,
    and SmolLM2's vocabulary has ĊĊ (a tiny trained tokenizer without it cannot show the difference)."""
    tokenizer = Tokenizer.from_file(str(real_tokenizer("smollm2") / "tokenizer.json"))
    assert tokenizer.encode("t (x)\n\n### Q", add_special_tokens=False).tokens == ["t", "Ġ(", "x", ")", "Ċ", "Ċ",
                                                                                   "###", "ĠQ"]
    assert tokenizer.encode("t (x)\n\n", add_special_tokens=False).tokens[-1] == "ĊĊ"
    prompts, answers = ["t (x)\n\n### Q\n", "a\n \nb\n", "x\ny\n"], ["SELECT 1", "c", "z"]
    assert cache_mismatches(tokenizer, NEWLINE_RUN_CUT, prompts, answers) == (3, 2)
    assert cache_mismatches(tokenizer, LONE_NEWLINE_CUT, prompts, answers) == (3, 0)


@pytest.mark.parametrize("seed", range(3))
def test_random_text_is_exact_with_the_bundled_and_a_gpt2_tokenizer(seed, tmp_path):
    rng = random.Random(seed)
    prompts = [random_text(rng, rng.randint(0, 40)) + rng.choice(["\n", "\n\n", ":\n", " \n", ""]) for _ in range(400)]
    answers = [random_text(rng, rng.randint(1, 30)) for _ in range(400)]
    for path in (BUNDLED_MODEL_DIR / "tokenizer.json", make_tokenizer(tmp_path / "t") / "tokenizer.json"):
        made, differ = cache_mismatches(Tokenizer.from_file(str(path)), line_cut(json.loads(path.read_text()))[0],
                                        prompts, answers)
        assert made > 50 and differ == 0  # many documents do take the cache
