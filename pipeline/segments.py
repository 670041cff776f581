"""Exact memoized tokenization of repeated lines (schemas, templates) for byte-level BPE tokenizers.

Text-to-SQL and text-to-Cypher prompts repeat the same schema lines across thousands of rows. For
the byte-level BPE tokenizers of the GPT-2, GPT-4 / Llama-3 and Qwen families, the position right
after a newline that is followed by a printable, non-space ASCII character is always a
pre-tokenizer boundary:

    every alternative of their split regex that can match "\\n" either ends at a newline
    (``\\s*[\\r\\n]+``, `` ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*``) or matches whitespace only (``\\s+(?!\\S)``,
    ``\\s+``), and the letter alternative's optional prefix excludes "\\n"; NFC never composes
    with "\\n"; BPE merges never cross a pre-token boundary.

So the tokens of a text are the concatenation of the tokens of its lines cut there, and each
distinct line needs encoding once. Whether a tokenizer qualifies is decided from its
tokenizer.json (:func:`line_split_is_exact`); when it does not, or when a document's prompt does
not end at such a boundary, the whole document is encoded as one string. The tokens are the same
either way (tested against whole-text encoding); only the time differs.
"""

from __future__ import annotations

import re

# Split regexes of tokenizer.json pre-tokenizers for which the property above holds.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CL100K_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
KNOWN_SPLITS = {QWEN2_SPLIT, CL100K_SPLIT}

LINE_START = re.compile(r"(?<=\n)(?=[!-~])")
MAX_ENTRIES = 200_000


def line_split_is_exact(spec: dict) -> tuple[bool, str]:
    """Whether cutting at line starts leaves this tokenizer's output unchanged, and why."""
    model, normalizer, pre = spec.get("model") or {}, spec.get("normalizer"), spec.get("pre_tokenizer")
    if model.get("type") != "BPE":
        return False, f"model is {model.get('type')}, not byte-level BPE"
    if normalizer not in (None, {"type": "NFC"}):
        return False, f"normalizer {normalizer.get('type')} is not NFC"
    for token in spec.get("added_tokens") or []:
        if "\n" in token["content"] or token.get("lstrip") or token.get("rstrip"):
            return False, f"added token {token['content']!r} can absorb or hold a newline"

    def byte_level(p, use_regex: bool) -> bool:
        return (p.get("type") == "ByteLevel" and not p.get("add_prefix_space", False)
                and p.get("use_regex", True) == use_regex)

    if pre and byte_level(pre, use_regex=True):
        return True, "GPT-2 byte-level pre-tokenizer"
    if pre and pre.get("type") == "Sequence" and len(pre["pretokenizers"]) == 2:
        split, level = pre["pretokenizers"]
        if (split.get("type") == "Split" and split.get("pattern", {}).get("Regex") in KNOWN_SPLITS
                and split.get("behavior") == "Isolated" and not split.get("invert") and byte_level(level, False)):
            return True, "GPT-4 / Llama-3 / Qwen split regex + byte-level"
    return False, "pre-tokenizer is not one whose line starts are known boundaries"


class LineCache:
    """Tokens of distinct lines, encoded in batches; bounded (cleared when it reaches MAX_ENTRIES)."""

    def __init__(self, encode_ids, max_entries: int = MAX_ENTRIES):
        """``encode_ids``: texts -> their ids without special tokens added (the HF tokenizer's, or
        the tiktoken encoder's where that is exact)."""
        self.encode_ids = encode_ids
        self.max_entries = max_entries
        self.lines: dict[str, list[int]] = {}

    def encode(self, prompts: list[str], answers: list[str]) -> list[tuple[list[int], int] | None]:
        """(ids, prompt token count) per document, or None where the prompt/answer boundary is not a
        line start (those documents are encoded whole by the caller)."""
        split: list[tuple[list[str], list[str]] | None] = []
        for prompt, answer in zip(prompts, answers):
            if prompt and not LINE_START.match(prompt + answer[:1], len(prompt)):
                split.append(None)
            else:
                split.append((LINE_START.split(prompt) if prompt else [], LINE_START.split(answer)))
        if len(self.lines) > self.max_entries:
            self.lines.clear()
        missing = list(dict.fromkeys(line for parts in split if parts for half in parts for line in half
                                     if line not in self.lines))
        for line, ids in zip(missing, self.encode_ids(missing)):
            self.lines[line] = ids
        out: list[tuple[list[int], int] | None] = []
        for parts in split:
            if parts is None:
                out.append(None)
                continue
            ids = [t for line in parts[0] for t in self.lines[line]]
            prompt_tokens = len(ids)
            ids.extend(t for line in parts[1] for t in self.lines[line])
            out.append((ids, prompt_tokens))
        return out
