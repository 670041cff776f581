"""Memoized tokenization of repeated lines (schemas, templates) for byte-level BPE tokenizers.

Text-to-SQL and text-to-Cypher prompts repeat the same schema lines across thousands of rows, so
each distinct line is encoded once and a document's tokens are its lines' tokens joined. That is
only right where the cut between two lines is a pre-tokenizer boundary that no token crosses, and
where is such a cut depends on the tokenizer's split regex:

- Qwen2/2.5/3, GPT-4 (cl100k), Llama-3 (``\\s*[\\r\\n]+`` ends every whitespace run at its last
  newline): after any newline followed by a printable, non-space ASCII character;
- GPT-2 and every ByteLevel(use_regex=True) tokenizer, e.g. SmolLM2 (``\\s+(?!\\S)|\\s+``): a run of
  whitespace before a non-space character gives its last character a token of its own
  (``a\\n\\nb`` is ``a`` ``Ċ`` ``Ċ`` ``b`` while the line ``a\\n\\n`` ends in ``ĊĊ``), so only a newline
  that is a whitespace run of its own (a non-space before it, a printable non-space ASCII after it).

That is the reasoning for where the cache cuts (:func:`line_cut`); it is not what makes the cache
trusted. Every build re-encodes a sample of the documents the cache made with the HF tokenizer
and compares (pipeline/encode/fast/exactness.py); a mismatch drops the cache for that tokenizer, remembered,
and the build is redone without it. tests/test_exactness.py runs the same comparison on a hostile
corpus with each real tokenizer the project installs.
"""

from __future__ import annotations

import re

from packtrain.pipeline.encode.tokenizer_shape import normalizer_form, normalizer_name, pre_tokenizer_steps

# Split regexes of tokenizer.json pre-tokenizers whose every newline run ends a pre-token.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CL100K_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
KNOWN_SPLITS = {QWEN2_SPLIT, CL100K_SPLIT}

# Where a text is cut into lines: after a newline, before a printable non-space ASCII character ...
NEWLINE_RUN_CUT = re.compile(r"(?<=\n)(?=[!-~])")
# ... and, for the GPT-2 regex, only where that newline has a non-whitespace character before it.
LONE_NEWLINE_CUT = re.compile(r"(?<=\S\n)(?=[!-~])")
MAX_ENTRIES = 200_000
CUT_VERSION = 2  # raise when a cut rule changes: remembered refusals (pipeline/encode/fast/exactness.py) are made again


def line_cut(spec: dict) -> tuple[re.Pattern | None, str]:
    """Where this tokenizer's texts can be cut into lines (None where nowhere), and why."""
    model, pre = spec.get("model") or {}, pre_tokenizer_steps(spec)  # Sequences judged step by step
    if model.get("type") != "BPE":
        return None, f"model is {model.get('type')}, not byte-level BPE"
    if normalizer_form(spec) is None:
        return None, f"normalizer {normalizer_name(spec)} is not NFC"
    for token in spec.get("added_tokens") or []:
        if "\n" in token["content"] or token.get("lstrip") or token.get("rstrip"):
            return None, f"added token {token['content']!r} can absorb or hold a newline"

    def byte_level(p, use_regex: bool) -> bool:
        return (p.get("type") == "ByteLevel" and not p.get("add_prefix_space", False)
                and p.get("use_regex", True) == use_regex)

    if len(pre) == 1 and byte_level(pre[0], use_regex=True):
        return LONE_NEWLINE_CUT, "GPT-2 byte-level pre-tokenizer: cut only at lone newlines"
    if len(pre) == 2:
        split, level = pre
        if (split.get("type") == "Split" and split.get("pattern", {}).get("Regex") in KNOWN_SPLITS
                and split.get("behavior") == "Isolated" and not split.get("invert") and byte_level(level, False)):
            return NEWLINE_RUN_CUT, "GPT-4 / Llama-3 / Qwen split regex + byte-level"
    return None, "pre-tokenizer is not one whose line starts are known boundaries"


class LineCache:
    """Tokens of distinct lines, encoded in batches; bounded (cleared when it reaches MAX_ENTRIES)."""

    def __init__(self, encode_ids, cut: re.Pattern = NEWLINE_RUN_CUT, max_entries: int = MAX_ENTRIES):
        """``encode_ids``: texts -> their ids without special tokens added (the HF tokenizer's).
        ``cut``: where texts are cut into lines (:func:`line_cut` of the tokenizer)."""
        self.encode_ids = encode_ids
        self.cut = cut
        self.max_entries = max_entries
        self.lines: dict[str, list[int]] = {}

    def encode(self, prompts: list[str], answers: list[str]) -> list[tuple[list[int], int] | None]:
        """(ids, prompt token count) per document, or None where the prompt/answer boundary is not a
        cut (those documents are encoded whole by the caller)."""
        split: list[tuple[list[str], list[str]] | None] = []
        for prompt, answer in zip(prompts, answers):
            if prompt and not self.cut.match(prompt + answer[:1], len(prompt)):
                split.append(None)
            else:
                split.append((self.cut.split(prompt) if prompt else [], self.cut.split(answer)))
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
