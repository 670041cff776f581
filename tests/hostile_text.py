"""A hostile corpus for exactness checks: texts where tokenizer shortcuts go wrong.

Fragments that pre-tokenizer regexes, normalizers and added tokens treat specially, joined at
random (seeded), and (prompt, answer) pairs cut at the places the line cache and the prompt
boundary look at.
"""

from __future__ import annotations

import random

FRAGMENTS = [
    # whitespace runs before non-space and before space: GPT-2's \s+(?!\S) vs Qwen's \s*[\r\n]+
    "\n\n", "\n \n", "\n\n ", " \n", "\n\t", "\t\n", "   ", "  \n  ", "\n\n\n", "\t\t", " \t \n",
    "\r\n", "\r", "\r\n\r\n", "\n\r", "\x0b", "\x0c", "\x85",
    "\u00a0", "\u00a0\n", "\n\u00a0", "\u2028", "\u2029", "\u3000", "\ufeff", "\u200b",
    # combining marks in non-canonical order (NFC reorders them), decomposed and precomposed letters
    "e\u0327\u0301", "e\u0301\u0327", "a\u0301", "\u00e1", "\u1e69", "s\u0323\u0307", "s\u0307\u0323", "\u0301",
    "\u2126", "\ufb01", "\u212b",
    # CJK, emoji with ZWJ and modifiers, flags, scripts without spaces
    "中文", "日本語のテキスト", "한국어", "👩\u200d👩\u200d👧", "👍🏽", "🇫🇷", "🙂", "\U0001f9d1\u200d\U0001f4bb",
    "ไทย", "العربية", "עברית", "Ελληνικά", "русский",
    # digits, apostrophes, punctuation runs
    "1234567", "3.14159", "'s", "'S", "'LL", "n't", "''", "...", ")\n", "###", "```python\n", "```",
    "<>", "{}", "()", "x_y", "__init__", "--", "//", ";",
    # special-token strings the tokenizers know, and near misses
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>assistant\n", "<|im_end", "<|endoftext",
    # ordinary words, so the fragments meet letters on both sides
    "SELECT", " FROM", " WHERE", "a", "Z", " the", "word", "é",
]


def hostile_text(rng: random.Random, pieces: int) -> str:
    return "".join(rng.choice(FRAGMENTS) for _ in range(pieces))


def hostile_texts(seed: int, count: int, max_pieces: int = 30) -> list[str]:
    rng = random.Random(seed)
    return [hostile_text(rng, rng.randint(1, max_pieces)) for _ in range(count)]


PROMPT_ENDINGS = ["\n", "\n\n", ":\n", " \n", "\n \n", "\r\n", ")\n", "\n\t", "", " ", "\u00a0\n", "###\n"]
ANSWER_STARTS = ["S", "#", " x", "\n", "'s", "é", "中", "1", "(", "<|im_end|>", "\u0301", "\t"]


def hostile_pairs(seed: int, count: int) -> list[tuple[str, str]]:
    """(prompt, answer) pairs whose boundary sits where shortcuts cut: after newlines, before spaces,
    combining marks and special tokens."""
    rng = random.Random(seed)
    return [(hostile_text(rng, rng.randint(0, 20)) + rng.choice(PROMPT_ENDINGS),
             rng.choice(ANSWER_STARTS) + hostile_text(rng, rng.randint(0, 20))) for _ in range(count)]
