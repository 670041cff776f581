"""A tiktoken encoder that gives exactly the HF tokenizer's ids, used where that is proven.

tiktoken (OpenAI's BPE) encodes several times faster than ``tokenizers`` on one thread. It runs
rank BPE: split the text on the special tokens, split each piece with one regex, and in each
pre-token merge the adjacent pair whose concatenation has the lowest rank (its id) until none is in
the vocabulary. ``tokenizers`` runs merges BPE: merge the adjacent pair listed first in ``merges``.
:func:`decide` reads ``tokenizer.json`` and says yes only where both give the same ids for every
text, which holds when

- the model is BPE over the 256 byte-level symbols (all present), without dropout, unknown token,
  byte fallback, subword prefix or word suffix; the normalizer is none or NFC (a text that NFC
  would change is encoded by the HF tokenizer: see :class:`FastEncoder`; a Sequence is judged by its
  steps, nested ones flattened: pipeline/encode/tokenizer_shape.py);
- the pre-tokenizer is byte-level without a prefix space, splitting with the GPT-2 regex or a
  GPT-4 / Llama-3 / Qwen split regex (``Isolated``, not inverted). Those regexes match every
  character, so tiktoken, which keeps only matches, drops nothing (a regex outside that list is
  refused, whatever it looks like);
- merges and ranks agree (:func:`merges_match_ranks`): each merge makes a vocabulary token, the
  tokens merges make rise in id with the merge's position, each multi-byte token is made by exactly
  one merge, and that merge is the last step of rank BPE on the token's bytes with the ranks below
  its own. Then every merge rank BPE makes on any text is the listed merge of its result, and the
  lowest-ranked pair is also the first-listed merge, so both make the same merge at every step
  (ties: the leftmost, in both). It also makes ``ignore_merges`` moot: merges BPE of a token's own
  bytes ends in that token, which is what tiktoken's whole-piece lookup returns;
- added tokens are matched as HF matches them: none strips, is single-word, or contains another
  (leftmost-longest and tiktoken's leftmost-first alternation then find the same ones).

Last, :func:`decide` encodes a probe text (every character class the regexes name, in the contexts
they look at) with both and refuses on any difference, so a change in either library's regex
engine or Unicode tables shows up as "off" rather than as different tokens.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

from packtrain.pipeline.encode.fast.byte_level import token_byte_lengths, token_bytes, trims_offsets
from packtrain.pipeline.encode.fast.byte_spans import SpanPlacer
from packtrain.pipeline.encode.fast.probe import probe_difference
from packtrain.pipeline.encode.tokenizer_shape import normalizer_form, normalizer_name, steps

# The pre-tokenizer regexes known to match every character (each ends in ``\s+`` after
# alternatives for letters, numbers and everything else), hence safe for tiktoken's find-all.
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CL100K_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TOTAL_SPLITS = {QWEN2_SPLIT, CL100K_SPLIT}
NAME = "tiktoken"
DECISION_VERSION = 1  # raise when decide() changes, so remembered decisions are made again



def rank_bpe(piece: bytes, ranks: dict[bytes, int], limit: int) -> list[bytes]:
    """tiktoken's algorithm on one pre-token, with only the ranks below ``limit``."""
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, at = limit, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best:
                best, at = rank, i
        if at < 0:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return parts


def merges_match_ranks(ranks: dict[bytes, int], merges: list[tuple[bytes, bytes]]) -> str | None:
    """None when rank BPE and merges BPE agree on every input (see the module docstring), else why not."""
    made: dict[bytes, tuple[bytes, bytes]] = {}
    previous = -1
    for index, (a, b) in enumerate(merges):
        token = a + b
        rank = ranks.get(token)
        if a not in ranks or b not in ranks or rank is None:
            return f"merge {index} ({a!r}, {b!r}) makes no vocabulary token"
        if rank <= previous:
            return f"merge {index} makes id {rank}, not above the previous merge's {previous} (merge order is not rank order)"
        previous = rank
        made[token] = (a, b)
    for token, rank in ranks.items():
        if len(token) == 1:
            continue
        if token not in made:
            return f"token {token!r} (id {rank}) is made by no merge"
        if rank_bpe(token, ranks, rank) != list(made[token]):
            return f"token {token!r} (id {rank}): rank BPE of its bytes does not end in its merge {made[token]!r}"
    return None


def parse_merges(raw: list) -> list[tuple[str, str]] | None:
    out = []
    for merge in raw:
        pair = merge.split(" ") if isinstance(merge, str) else merge
        if len(pair) != 2:
            return None
        out.append((pair[0], pair[1]))
    return out


def split_regex(pre: dict | None) -> tuple[str | None, str]:
    """The pre-tokenizer's regex when it is one tiktoken can run exactly, else (None, why)."""

    def byte_level(p: dict, use_regex: bool) -> bool:
        return (p.get("type") == "ByteLevel" and not p.get("add_prefix_space", False)
                and p.get("use_regex", True) == use_regex)

    found = steps(pre, "pretokenizers")  # a Sequence judged step by step, nested ones flattened
    if len(found) == 1 and byte_level(found[0], use_regex=True):
        return GPT2_SPLIT, "GPT-2 byte-level"
    if len(found) == 2:
        split, level = found
        pattern = (split.get("pattern") or {}).get("Regex")
        if (split.get("type") == "Split" and pattern in TOTAL_SPLITS and split.get("behavior") == "Isolated"
                and not split.get("invert") and byte_level(level, use_regex=False)):
            return pattern, "GPT-4 / Llama-3 / Qwen split regex + byte-level"
    return None, "the pre-tokenizer is not a byte-level one with a known split regex"


def decide(tokenizer_file: str | Path, on_checks=None, text: str | None = None,
           spec: dict | None = None) -> tuple[bool, str]:
    """Whether the tiktoken encoder gives exactly this tokenizer's ids, and why (one line).
    ``on_checks(problem)`` is called once the quick structural checks are done (a fraction of a
    second; ``problem`` is None when they pass), before the seconds of the merges check and the probe.
    ``text``: the file's content, read once by the caller (both tokenizers are built from it);
    ``spec``: it parsed, where the caller has it."""
    if text is None:
        text = Path(tokenizer_file).read_text(encoding="utf-8")
    spec = json.loads(text) if spec is None else spec
    problem, ranks, merges = checked(spec)
    if on_checks is not None:
        on_checks(problem)
    if problem is None:
        problem = merges_match_ranks(ranks, merges)
    if problem is not None:
        return False, problem
    from tokenizers import Tokenizer

    hf = Tokenizer.from_str(text)
    encoder = FastEncoder(spec, lambda: hf, ranks)
    problem = probe_difference(lambda _, piece: encoder.tiktoken_ids(piece), hf, encoder.nfc)
    if problem is not None:
        return False, f"tiktoken: {problem}"
    return True, f"rank BPE equals its merges ({split_regex(spec.get('pre_tokenizer'))[1]}), probe text identical"


def checked(spec: dict) -> tuple[str | None, dict[bytes, int] | None, list[tuple[bytes, bytes]] | None]:
    """:func:`decide`'s quick structural checks: :func:`structure`, and tiktoken installed."""
    problem, ranks, merges = structure(spec)
    if problem is None:
        try:
            import tiktoken  # noqa: F401
        except ImportError:
            problem = "tiktoken is not installed (pip install tiktoken)"
    return problem, ranks, merges


def structure(spec: dict) -> tuple[str | None, dict[bytes, int] | None, list[tuple[bytes, bytes]] | None]:
    """(why the tokenizer.json is not one rank BPE can reproduce, or None; and where there is none,
    the vocabulary's ranks and the merges BPE can apply, as bytes). Everything but whether the
    merges agree with the ranks (:func:`merges_match_ranks`)."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return f"the model is {model.get('type')}, not BPE", None, None
    if model.get("dropout") or model.get("byte_fallback") or model.get("continuing_subword_prefix") \
            or model.get("end_of_word_suffix"):
        return "the BPE model uses dropout, byte fallback, a subword prefix or a word suffix", None, None
    if normalizer_form(spec) is None:
        return f"the normalizer {normalizer_name(spec)} is neither none nor NFC", None, None
    pattern, why = split_regex(spec.get("pre_tokenizer"))
    if pattern is None:
        return why, None, None
    added = spec.get("added_tokens") or []
    contents = [t["content"] for t in added]
    for token in added:
        if token.get("lstrip") or token.get("rstrip") or token.get("single_word") or not token["content"]:
            return f"the added token {token['content']!r} strips, is single-word or is empty", None, None
        if any(token["content"] in other for other in contents if other != token["content"]):
            return f"the added token {token['content']!r} is inside another added token", None, None
    ranks = vocabulary_ranks(spec)
    if ranks is None:
        return "a vocabulary token is not in the byte-level alphabet", None, None
    if sum(len(t) == 1 for t in ranks) != 256:
        return "the vocabulary lacks some of the 256 byte tokens", None, None
    merges = parse_merges(model.get("merges") or [])
    if merges is None:
        return "a merge is not a pair", None, None
    decoded = [(token_bytes(a), token_bytes(b)) for a, b in merges]
    if any(a is None or b is None for a, b in decoded):
        return "a merge is not in the byte-level alphabet", None, None
    # a merge making an added token never applies: its text is split off before BPE
    return None, ranks, [(a, b) for a, b in decoded if (a + b).decode("utf-8", "replace") not in contents]


def vocabulary_ranks(spec: dict) -> dict[bytes, int] | None:
    """The model's vocabulary as tiktoken ranks, bytes -> id, without the added tokens (split off
    before BPE, so BPE never makes them); None if a token is not in the byte-level alphabet."""
    added = {t["id"] for t in spec.get("added_tokens") or []}
    ranks = {}
    for token, rank in (spec["model"].get("vocab") or {}).items():
        if rank in added:
            continue
        raw = token_bytes(token)
        if raw is None or raw in ranks:
            return None
        ranks[raw] = rank
    return ranks


class FastEncoder:
    """tiktoken for the documents it encodes exactly as the HF tokenizer does (the HF tokenizer makes
    the rest: texts NFC would change where the tokenizer normalizes with NFC, spans it cannot place).
    Build it only where :func:`decide` said yes. ``load_hf``: returns the HF tokenizer; called the
    first time a text needs it, so a worker whose texts never do skips loading it. ``ranks``:
    :func:`vocabulary_ranks` of ``spec``, where the caller has it already."""

    name = "tiktoken"

    def __init__(self, spec: dict, load_hf, ranks: dict[bytes, int] | None = None):
        import tiktoken

        self.load_hf = load_hf
        self._hf = None
        added = {t["content"]: t["id"] for t in spec.get("added_tokens") or []}
        ranks = ranks or vocabulary_ranks(spec)
        self.nfc = normalizer_form(spec) == "NFC"
        self.encoding = tiktoken.Encoding("packtrain", pat_str=split_regex(spec.get("pre_tokenizer"))[0],
                                          mergeable_ranks=ranks, special_tokens=added)
        self.placer = SpanPlacer(token_byte_lengths(spec), self.nfc,
                                 trims=trims_offsets(spec))

    @property
    def hf(self):
        if self._hf is None:
            self._hf = self.load_hf()
        return self._hf

    def tiktoken_ids(self, text: str) -> list[int]:
        return self.encoding.encode(text, allowed_special="all", disallowed_special=())

    def exact(self, text: str) -> bool:
        return not self.nfc or unicodedata.is_normalized("NFC", text)

    def encode_ids(self, texts: list[str]) -> list[list[int]]:
        """The HF tokenizer's ids (no special tokens added) of each text."""
        out: list = [self.tiktoken_ids(t) if self.exact(t) else None for t in texts]
        rest = [k for k, ids in enumerate(out) if ids is None]
        for k, encoding in zip(rest, self.hf.encode_batch([texts[k] for k in rest], add_special_tokens=False)):
            out[k] = encoding.ids
        return out

    def encode_documents(self, docs) -> list:
        """Per document (a ``Formatted``: text and supervised character spans), its ids as a uint32
        array and its spans as token ranges, or None where the HF tokenizer must make it
        (pipeline/encode/fast/byte_spans.py)."""
        import numpy as np

        out: list = [None] * len(docs)
        todo = [k for k, doc in enumerate(docs) if self.placer.placeable(doc.text, doc.spans)]
        if not todo:
            return out
        arrays = [self.encoding.encode_to_numpy(docs[k].text, allowed_special="all", disallowed_special=())
                  for k in todo]
        counts = np.fromiter(map(len, arrays), np.int64, len(arrays))
        placed = self.placer.place([docs[k].text for k in todo], [docs[k].spans for k in todo],
                                   np.concatenate(arrays).astype(np.int64), counts)
        for k, ids, spans in zip(todo, arrays, placed):
            if spans is not None:
                out[k] = (ids.astype(np.uint32, copy=False), spans)
        return out

    def encode_split(self, text: str, boundary: int) -> tuple[list[int], int] | None:
        """(ids, index of the first token at character ``boundary``) of a prompt + answer text, or None
        where the HF tokenizer decides (see :meth:`encode_documents`)."""
        from packtrain.pipeline.format.format import Formatted

        got = self.encode_documents([Formatted(text, ((boundary, len(text)),))])[0]
        return None if got is None else (got[0].tolist(), got[1][0][0])
