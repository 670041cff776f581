"""A worker's batch: formatted rows -> token arrays and loss masks (run in the pool, pipeline/encode/pool.py).

Each worker loads the HF tokenizer (the reference) once, and the fast encoder the build decided on
(fastokens or tiktoken, pipeline/encode/encoder_decision.py) or the line cache
(pipeline/encode/line_cache.py). A sample of what a shortcut makes is re-encoded with the HF
tokenizer in the same worker and compared (pipeline/encode/exactness.py); the batch carries any
difference back to the build, which then drops that shortcut.

Per document the worker returns ``[bos?] + tokens(text) + [eos]`` and its loss mask: 1 on the
tokens of every supervised span (the answer; each assistant turn of a conversation), and on the
EOS when the last span runs to the end of the text. A span must start on a token boundary of the
whole text (so the prompt's tokens are a prefix of the full text's): the HF tokenizer's character
offsets say so, or a fast encoder's token byte lengths (pipeline/encode/byte_spans.py); a row
where it does not is rejected.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

import numpy as np

from packtrain.pipeline import mix
from packtrain.pipeline.encode import exactness, tokenizer_facts
from packtrain.pipeline.encode.encoders import NotExact, fast_encoder, hf_tokenizer, line_cache
from packtrain.pipeline.errors import TokenizerError
from packtrain.pipeline.format import BadRow, Formatted, RowFormatter


@dataclass(frozen=True)
class EncodeTask:
    """Everything a worker needs; small and picklable."""

    tokenizer_file: str
    tokenizer_sha256: str
    """The sha256 of tokenizer_file the build hashed (the worker's tokenizers are cached by it)."""
    formatter: RowFormatter
    eos_id: int
    head: tuple[int, ...]
    """Special tokens before every document: the tokenizer's prefix in template style, none in chat
    style (the chat template renders its own BOS, as ``apply_chat_template`` does)."""
    val_fraction: float
    token_dtype: str
    """The build's token dtype (contract.token_dtype): the batch's tokens come back in it, and the
    document keys hash them in it."""
    line_cache: bool = False
    """Memoize repeated lines (only set where TokenizerInfo.line_split says the tokenizer has a cut)."""
    fast_encoder: str | None = None
    """The fast encoder to encode with, fastokens or tiktoken (only set where the build's decision,
    pipeline/encode/encoder_decision.py, found it exact); None: the HF tokenizer."""
    check_all: bool = True
    """Check every document a shortcut makes against the reference (the first ``build.check_documents``
    rows of a source), else a seeded sample (pipeline/encode/exactness.py)."""
    facts: str | None = None
    """The tokenizer facts planning used (TokenizerInfo.facts as JSON: eos/pad/bos ids, the prefix, the
    vocabulary size), remembered in the cache; checked against the HF tokenizer where ``check_facts``."""
    check_facts: bool = False
    """Check ``facts`` (set on each source's first batch): a remembered note cannot change a byte."""


@dataclass
class EncodedBatch:
    tokens: np.ndarray  # uint32, every document's tokens concatenated
    masks: np.ndarray  # uint8 per token: 1 where the loss is (the answers), aligned with tokens
    lengths: np.ndarray  # int64 per document
    prompt_lengths: np.ndarray  # int64 per document: tokens before its first supervised one
    is_val: np.ndarray  # bool per document
    keys: np.ndarray  # uint8 [documents, 16]: each document's key (mix.document_keys)
    bad_rows: list[tuple[int, str]]  # (row index within the batch, reason)
    by_shortcut: int = 0  # documents a shortcut (a fast encoder, the line cache, one render) made
    checked: int = 0  # of those, how many were re-encoded with the reference and found identical
    mismatches: list = dataclasses.field(default_factory=list)  # exactness.Mismatch of those that differ
    no_system: int = 0  # chat documents without a system message (pipeline/system_prompt.py)


def is_validation(text: str, val_fraction: float) -> bool:
    """Hold out a document by a hash of its content: appending data never moves old documents."""
    if val_fraction <= 0:
        return False
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < val_fraction * 2**64


PROMPT_BOUNDARY = ("the prompt does not end on a token boundary of prompt + answer, so its tokens are not a prefix; "
                   "end format.prompt with a newline")


def token_spans(encoding, doc: Formatted) -> list[tuple[int, int]]:
    """The supervised character spans of ``doc`` as token ranges. A span must start on a token
    boundary (else the prompt's tokens would not be a prefix: :class:`BadRow`); it covers every
    token that starts before its end."""
    out = []
    for number, (start, stop) in enumerate(doc.spans):
        first = encoding.char_to_token(start) if start < len(doc.text) else None
        if first is None or encoding.token_to_chars(first)[0] != start:
            raise BadRow(PROMPT_BOUNDARY if doc.is_suffix else
                         f"assistant turn {number} does not start on a token boundary of the conversation, so its "
                         "tokens would not be the tokens the model generates; use another chat template")
        last = encoding.char_to_token(stop) if stop < len(doc.text) else len(encoding.ids)
        if last is None:
            raise BadRow(f"supervised span {number} ends at character {stop}, which no token covers")
        if last < len(encoding.ids) and encoding.token_to_chars(last)[0] < stop:
            last += 1  # the span ends inside a token: the token is supervised
        out.append((first, last))
    return out


def encode_rows(task: EncodeTask, columns: dict[str, list]) -> EncodedBatch:
    """Format and tokenize one batch of rows given column-wise (as read from Arrow)."""
    key = (task.tokenizer_file, task.tokenizer_sha256)
    if task.check_facts and task.facts is not None:
        check_facts(hf_tokenizer(key), json.loads(task.facts), task.tokenizer_file)
    if task.fast_encoder:
        try:
            fast = fast_encoder(key, task.fast_encoder)
        except NotExact as e:  # a remembered decision said it was; the build drops it and tokenizes again
            return refused_batch(exactness.Mismatch(exactness.fast_encoder_label(task.fast_encoder), 0, str(e), ""))
    else:
        fast = None
    docs, kept, bad = format_rows(task.formatter, columns)
    encoded: list = [None] * len(docs)  # (ids as a uint32 array, supervised token ranges) per document
    made_by: list[str | None] = [None] * len(docs)  # the shortcut that made each document, if one did
    if fast:  # every document, conversations too (the HF tokenizer makes those it leaves: None)
        for k, m in enumerate(fast.encode_documents(docs)):
            if m is not None:
                encoded[k], made_by[k] = m, exactness.fast_encoder_label(fast.name)
    elif task.line_cache:
        simple = [k for k, d in enumerate(docs) if d.is_suffix]  # prompt + answer: the answer to the end
        for k, m in zip(simple, line_cache(key).encode(
                [docs[k].text[:docs[k].prompt_chars] for k in simple], [docs[k].text[docs[k].prompt_chars:] for k in simple])):
            if m is not None:
                encoded[k] = (np.asarray(m[0], np.uint32), [(m[1], len(m[0]))])
                made_by[k] = exactness.LINE_CACHE
    whole = [k for k, m in enumerate(encoded) if m is None]
    for k, encoding in zip(whole, hf_tokenizer(key).encode_batch(
            [docs[k].text for k in whole], add_special_tokens=False) if whole else []):
        try:
            encoded[k] = (np.asarray(encoding.ids, np.uint32), token_spans(encoding, docs[k]))
        except BadRow as e:
            bad.append((kept[k], str(e)))
    by_shortcut = [k for k, m in enumerate(made_by) if m is not None or docs[k].rendered_once]
    checks = [k for k in by_shortcut if task.check_all or exactness.sampled(docs[k].text)]
    mismatches = check_renders(task.formatter, columns, docs, kept, [k for k in checks if docs[k].rendered_once])
    encoded_checks = [k for k in checks if made_by[k] is not None and encoded[k] is not None]
    mismatches += check_documents(hf_tokenizer(key) if encoded_checks else None, docs, encoded, made_by, kept,
                                  encoded_checks)
    good = [k for k, m in enumerate(encoded) if m is not None]
    bad.sort()
    batch = assemble_documents([encoded[k] for k in good], [docs[k].spans[-1][1] == len(docs[k].text) for k in good],
                               task.head, task.eos_id)
    batch["tokens"] = batch["tokens"].astype(task.token_dtype, copy=False)
    return EncodedBatch(**batch, is_val=np.fromiter((is_validation(docs[k].text, task.val_fraction) for k in good),
                                                   bool, len(good)),
                        keys=mix.document_keys(batch["tokens"], batch["masks"], batch["lengths"]), bad_rows=bad,
                        by_shortcut=len(by_shortcut), checked=len(checks) - len(mismatches), mismatches=mismatches,
                        no_system=sum(docs[k].no_system for k in good))


def check_facts(reference, planned: dict, tokenizer_file: str) -> None:
    """Refuse to tokenize with tokenizer facts (remembered in the cache by an earlier build) that are
    not the HF tokenizer's: they would put other special-token ids into every document."""
    actual = tokenizer_facts.facts_of(reference, sorted(planned["ids"]))
    if actual != planned:
        differ = ", ".join(f"{name} {planned[name]} (the tokenizer: {actual[name]})" for name in sorted(actual)
                           if actual[name] != planned.get(name))
        raise TokenizerError(f"the tokenizer facts this build was planned with are not {tokenizer_file}'s: {differ}; "
                             f"a note remembered in the cache (.sources/{tokenizer_facts.FACTS_DIR}/) was changed by "
                             f"hand: delete that directory and build again")


def refused_batch(mismatch: exactness.Mismatch) -> EncodedBatch:
    """A batch that holds nothing but ``mismatch``: the build drops the shortcut and tokenizes again."""
    empty = np.zeros(0, np.int64)
    return EncodedBatch(tokens=np.zeros(0, np.uint32), masks=np.zeros(0, np.uint8), lengths=empty, prompt_lengths=empty,
                        is_val=np.zeros(0, bool), keys=np.zeros((0, 16), np.uint8), bad_rows=[], mismatches=[mismatch])


def check_documents(reference, docs: list[Formatted], encoded: list, made_by: list[str | None],
                    kept: list[int], checks: list[int]) -> list[exactness.Mismatch]:
    """Re-encode the documents ``checks`` (made by a shortcut) with the reference, the HF tokenizer on
    the whole text, and return where the ids or the supervised tokens differ (pipeline/encode/exactness.py)."""
    mismatches = []
    for k, encoding in zip(checks, reference.encode_batch(
            [docs[k].text for k in checks], add_special_tokens=False) if checks else []):
        try:
            spans = token_spans(encoding, docs[k])
        except BadRow as e:
            detail = f"the shortcut kept a row the reference refuses ({e})"
        else:
            detail = exactness.first_difference(encoded[k][0], encoded[k][1], encoding.ids, spans)
        if detail is not None:
            mismatches.append(exactness.Mismatch(made_by[k], kept[k], detail, docs[k].text[:200]))
    return mismatches


def check_renders(formatter: RowFormatter, columns: dict[str, list], docs: list[Formatted], kept: list[int],
                  checks: list[int]) -> list[exactness.Mismatch]:
    """Render the conversations ``checks`` (made by one render, pipeline/chat_once.py) the exact way
    too and return where the text or the spans differ."""
    exact = dataclasses.replace(formatter, render_once=False)
    mismatches = []
    for k in checks:
        try:
            want = exact({name: values[kept[k]] for name, values in columns.items()})
        except (BadRow, KeyError, ValueError, IndexError) as e:
            detail = f"the shortcut kept a row the exact rendering refuses ({e})"
        else:
            detail = exactness.render_difference(docs[k], want)
        if detail is not None:
            mismatches.append(exactness.Mismatch(exactness.RENDER_ONCE, kept[k], detail, docs[k].text[:200]))
    return mismatches


def format_rows(formatter: RowFormatter, columns: dict[str, list]) -> tuple[list[Formatted], list[int], list]:
    """(documents, the row index of each, (row index, reason) of each bad row)."""
    names = list(columns)
    docs: list[Formatted] = []
    kept, bad = [], []
    for i, values in enumerate(zip(*columns.values())):
        try:
            docs.append(formatter(dict(zip(names, values))))
        except BadRow as e:
            bad.append((i, str(e)))
            continue
        except (KeyError, ValueError, IndexError) as e:  # a template that does not fit the row
            bad.append((i, f"template error: {e}"))
            continue
        kept.append(i)
    return docs, kept, bad


def assemble_documents(encoded: list[tuple[np.ndarray, list[tuple[int, int]]]], to_end: list[bool],
                       head: tuple[int, ...], eos_id: int) -> dict[str, np.ndarray]:
    """Every document as ``head + ids + [eos]`` (no second EOS when the ids end with one), and its
    loss mask from its supervised token ranges; the last range reaches onto an added EOS when the
    document's last span runs to the end of its text (``to_end``). Concatenated, no per-token Python.

    >>> batch = assemble_documents([(np.array([5, 6, 7], np.uint32), [(1, 3)]),
    ...                             (np.array([8, 2], np.uint32), [(0, 1)])], [True, False], (1,), eos_id=2)
    >>> batch["tokens"].tolist(), batch["masks"].tolist()
    ([1, 5, 6, 7, 2, 1, 8, 2], [0, 0, 1, 1, 1, 0, 1, 0])
    >>> batch["lengths"].tolist(), batch["prompt_lengths"].tolist()
    ([5, 3], [2, 1])
    """
    head_ids = np.asarray(head, np.uint32)
    eos = np.asarray([eos_id], np.uint32)
    pieces, lengths, prompt_lengths, starts, stops = [], [], [], [], []
    at = 0
    for (ids, spans), reaches_end in zip(encoded, to_end):
        add_eos = not len(ids) or int(ids[-1]) != eos_id
        if add_eos and reaches_end:  # the answer runs to the end: so does the loss, onto EOS
            spans = spans[:-1] + [(spans[-1][0], len(ids) + 1)]
        pieces += [head_ids, ids, eos] if add_eos else [head_ids, ids]
        length = len(head) + len(ids) + add_eos
        starts += [at + len(head) + a for a, _ in spans]
        stops += [at + len(head) + b for _, b in spans]
        lengths.append(length)
        prompt_lengths.append(len(head) + spans[0][0])
        at += length
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, np.uint32)
    # +1 where a supervised range starts, -1 where it stops: the running sum is the mask
    edges = (np.bincount(np.asarray(starts, np.int64), minlength=at + 1)
             - np.bincount(np.asarray(stops, np.int64), minlength=at + 1))
    return {
        "tokens": tokens,
        "masks": (np.cumsum(edges[:at]) > 0).astype(np.uint8),
        "lengths": np.asarray(lengths, np.int64),
        "prompt_lengths": np.asarray(prompt_lengths, np.int64),
    }
