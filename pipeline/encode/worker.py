"""A worker's batch: formatted rows -> token arrays and loss masks (run in the pool, pipeline/encode/pool.py).

Each worker loads the HF tokenizer (the reference) once, and the fast encoder the build decided on
(fastokens or tiktoken, pipeline/encode/fast/encoder_decision.py) or the line cache
(pipeline/encode/fast/line_cache.py). A sample of what a shortcut makes is re-encoded with the HF
tokenizer in the same worker and compared (pipeline/encode/fast/exactness.py); the batch carries any
difference back to the build, which then drops that shortcut.

Prompt/answer rows whose template is plain ``{field}`` placeholders over text columns are formatted
column-wise (pipeline/format/format_columns.py) and, with fastokens, encoded, placed and assembled for the
whole batch at once (:func:`encode_suffix_rows`): no Python object per row; the same documents,
bad rows and checks as the per-row path, which takes every other batch.

Per document the worker returns ``[bos?] + tokens(text) + [eos]`` and its loss mask: 1 on the
tokens of every supervised span (the answer; each assistant turn of a conversation), and on the
EOS when the last span runs to the end of the text. A span must start on a token boundary of the
whole text (so the prompt's tokens are a prefix of the full text's): the HF tokenizer's character
offsets say so, or a fast encoder's token byte lengths (pipeline/encode/fast/byte_spans.py); a row
where it does not is rejected.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import json
from dataclasses import dataclass

import numpy as np

from packtrain.core.config_sources import RowCondition
from packtrain.pipeline.pack import mix
from packtrain.pipeline.read.arrow_columns import num_rows
from packtrain.pipeline.format.chat_template import rendered_on
from packtrain.pipeline.encode.fast import exactness, fastokens_encoder
from packtrain.pipeline.encode import tokenizer_facts
from packtrain.core.config_build import BuildConfig
from packtrain.pipeline.encode.document_bound import DocumentTooLong, check_lengths, document_limit
from packtrain.pipeline.encode.assemble import FlatDocuments, assemble_documents, assemble_flat, assemble_suffixes
from packtrain.pipeline.encode.encoders import NotExact, fast_encoder, hf_tokenizer, line_cache
from packtrain.pipeline.encode.shortcut_encode import encode_by_shortcut
from packtrain.pipeline.encode.splits import split_of, text_digests, validation_mask
from packtrain.pipeline.errors import TokenizerError
from packtrain.pipeline.format.chat_columns import format_conversations
from packtrain.pipeline.format.format import BadRow, Formatted, RowFormatter, not_unicode
from packtrain.pipeline.format.format_columns import SuffixBatch, format_columns
from packtrain.pipeline.read.row_filter import kept_rows
from packtrain.pipeline.format.special_text import SpecialText, SpecialTextRefused, reference_encodings, specials_of


@functools.lru_cache(maxsize=8)
def special_tokens(key: tuple[str, str]) -> tuple[str, ...]:
    """The texts of the special tokens of the worker's HF tokenizer ``key`` (pipeline/format/special_text.py)."""
    return specials_of(hf_tokenizer(key))


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
    pipeline/encode/fast/encoder_decision.py, found it exact); None: the HF tokenizer."""
    check_rows: int = 1 << 62
    """Check every document a shortcut makes from the batch's first ``check_rows`` rows against the
    reference (the rows among the first ``build.check_documents`` of a source), and a seeded sample of
    the rest (pipeline/encode/fast/exactness.py)."""
    facts: str | None = None
    """The tokenizer facts planning used (TokenizerInfo.facts as JSON: eos/pad/bos ids, the prefix, the
    vocabulary size), remembered in the cache; checked against the HF tokenizer where ``check_facts``."""
    check_facts: bool = False
    """Check ``facts`` (set on each source's first batch): a remembered note cannot change a byte."""
    where: tuple[RowCondition, ...] = ()
    """The source's row filter (``sources[].where``): only the rows where every condition holds are formatted."""
    chat_date: str | None = None
    """The day the chat template renders (the build's planned ``chat_date``; None: it renders no date)."""
    special_tokens_in_text: str = "text"
    """``build.special_tokens_in_text``: what the data's special-token text becomes (pipeline/format/special_text.py)."""
    batch_files: str | None = None
    """Where a worker process writes the batch's token arrays (the spill's incoming files,
    pipeline/pack/spill_batches.py ``write_batch_files``) instead of returning them; None: they come back."""
    near_vocab_size: int | None = None
    """Where set (the build asks for near dedup), the batch's band keys are made too (pipeline/pack/near_bands.py),
    from the token table of the tokenizer and this vocabulary size."""
    document_limit: int = document_limit(BuildConfig.read_memory_mb)
    """The longest document's text encoded, in UTF-8 bytes (build.read_memory_mb: pipeline/encode/document_bound.py)."""


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
    no_system: int = 0  # chat documents without a system message (pipeline/format/system_prompt.py)
    rows: int | None = None  # rows of the batch as read (None: one document or bad row each)
    special_text: list = dataclasses.field(default_factory=list)  # (row index, where) of rows whose data holds
    # special-token text (pipeline/format/special_text.py), refused or not
    filtered: int = 0  # rows the source's ``where`` dropped
    files: str | None = None  # where tokens, masks, keys and bands went (EncodeTask.batch_files): those fields are empty
    bands: np.ndarray | None = None  # uint64 [documents, BANDS]: near dedup's band keys, where the task asks for them


PROMPT_BOUNDARY = ("the prompt does not end on a token boundary of prompt + answer, so its tokens are not a prefix; "
                   "end format.prompt with a newline")


def token_spans(encoding, doc: Formatted, chat: bool = False) -> list[tuple[int, int]]:
    """The supervised character spans of ``doc`` as token ranges. A span must start on a token
    boundary (else the prompt's tokens would not be a prefix: :class:`BadRow`, saying why in the terms
    of the format: ``chat``, a chat template's assistant turn); it covers every token that starts
    before its end."""
    out = []
    for number, (start, stop) in enumerate(doc.spans):
        first = encoding.char_to_token(start) if start < len(doc.text) else None
        if first is None or encoding.token_to_chars(first)[0] != start:
            if chat:
                raise BadRow(turn_inside_a_token(doc.text, start, None if first is None else encoding.token_to_chars(first)))
            raise BadRow(PROMPT_BOUNDARY if doc.is_suffix else
                         f"supervised span {number} does not start on a token boundary of the text, so its tokens "
                         "would not be the tokens the model generates")
        last = encoding.char_to_token(stop) if stop < len(doc.text) else len(encoding.ids)
        if last is None:
            raise BadRow(f"supervised span {number} ends at character {stop}, which no token covers")
        if last < len(encoding.ids) and encoding.token_to_chars(last)[0] < stop:
            last += 1  # the span ends inside a token: the token is supervised
        out.append((first, last))
    return out


def turn_inside_a_token(text: str, start: int, token: tuple[int, int] | None) -> str:
    """Why the assistant turn starting at character ``start`` of a chat document is a bad row: the
    token whose characters are ``token`` (None: no token covers the start) holds both the end of the
    template's text before the turn and the turn's first characters, as after ChatML's
    ``<|im_start|>assistant\n`` a turn opening with newlines does (Qwen's tokenizers make one token of
    ``\n\n``; SmolLM2's of ``\n\n`` before a newline, and of ``\n`` and a space before a space).

    >>> print(turn_inside_a_token("<|im_start|>assistant\\n\\nSELECT 1<|im_end|>", 22, (21, 23)))
    the assistant turn starting '\\nSELECT 1<|im_end|>' starts inside a token: the tokenizer encodes '\\n' (the end of the chat template's text before the turn) and '\\n' (the turn's first characters) as one token, so its tokens would not be the ones the model generates after its prompt; remove the whitespace at the start of the turn's content in the data
    """
    turn = text[start: start + 40] + ("..." if len(text) > start + 40 else "")
    if token is None:
        joined = "no token of the conversation covers its first character"
    else:
        joined = (f"the tokenizer encodes {text[token[0]:start]!r} (the end of the chat template's text before the "
                  f"turn) and {text[start:token[1]]!r} (the turn's first characters) as one token")
    fix = ("remove the whitespace at the start of the turn's content in the data" if text[start: start + 1].isspace()
           else "change the start of the turn's content in the data")
    return (f"the assistant turn starting {turn!r} starts inside a token: {joined}, so its tokens would not be "
            f"the ones the model generates after its prompt; {fix}")


def encode_rows(task: EncodeTask, columns: dict[str, list]) -> EncodedBatch:
    """Format and tokenize one batch of rows given column-wise (as read from Arrow): those the source's
    ``where`` keeps; bad rows and mismatches name the rows as read."""
    with rendered_on(task.chat_date):
        batch = encode_filtered_rows(task, columns)
    if task.near_vocab_size is None:
        return batch
    from packtrain.pipeline.pack import near_bands  # only where asked: no other build's worker imports it

    units = near_bands.units(task.tokenizer_file, task.tokenizer_sha256, task.near_vocab_size)
    return dataclasses.replace(batch, bands=near_bands.batch_bands(units, batch.tokens, batch.masks, batch.lengths))


def encode_filtered_rows(task: EncodeTask, columns: dict[str, list]) -> EncodedBatch:
    """:func:`encode_rows` on the build's day."""
    rows = num_rows(columns)
    if not task.where:
        return dataclasses.replace(encode_kept_rows(task, columns), rows=rows)
    keep = kept_rows(task.where, columns)
    if not keep:
        return dataclasses.replace(refused_batch(None), rows=rows, filtered=rows)
    checked = dataclasses.replace(task, check_rows=bisect.bisect_left(keep, task.check_rows))  # of the kept rows
    try:
        batch = encode_kept_rows(checked, {name: [values[i] for i in keep] for name, values in columns.items()}
                                 if len(keep) < rows else columns)
    except DocumentTooLong as e:  # named by the row as read
        raise DocumentTooLong(keep[e.row], e.size, e.limit) from None
    return dataclasses.replace(batch, rows=rows, filtered=rows - len(keep),
                               bad_rows=[(keep[i], why) for i, why in batch.bad_rows],
                               mismatches=[dataclasses.replace(m, row=keep[m.row]) for m in batch.mismatches])


def encode_kept_rows(task: EncodeTask, columns: dict[str, list]) -> EncodedBatch:
    """Format and tokenize the rows ``columns``."""
    key = (task.tokenizer_file, task.tokenizer_sha256)
    task = dataclasses.replace(task, formatter=dataclasses.replace(
        task.formatter, special=SpecialText(task.special_tokens_in_text, special_tokens(key))))
    if task.check_facts and task.facts is not None:
        check_facts(hf_tokenizer(key), json.loads(task.facts), task.tokenizer_file)
    if task.fast_encoder:
        try:
            fast = fast_encoder(key, task.fast_encoder)
        except NotExact as e:  # a remembered decision said it was; the build drops it and tokenizes again
            return refused_batch(exactness.Mismatch(exactness.fast_encoder_label(task.fast_encoder), 0, str(e), ""))
    else:
        fast = None
    columnar = format_columns(task.formatter, columns)
    if columnar is not None:
        columnar = columnar.without(not_unicode(columnar.texts))
        check_lengths(columnar.texts, columnar.kept, task.document_limit)
    if columnar is not None and fast is not None and fast.name == fastokens_encoder.NAME:
        return encode_suffix_rows(task, fast, columnar)
    if columnar is not None:
        docs = [Formatted(text, ((start, len(text)),)) for text, start in zip(columnar.texts, columnar.prompt_chars.tolist())]
        kept, bad = columnar.kept, list(columnar.bad)
    else:
        special: list = []
        docs, kept, bad = format_rows(task.formatter, columns, special)
        check_lengths([doc.text for doc in docs], kept, task.document_limit)
        if refused := not_unicode([doc.text for doc in docs]):  # their rows are bad (a row gives none then)
            bad += [(kept[k], why) for k, why in refused]
            drop = {k for k, _ in refused}
            docs, kept = [d for k, d in enumerate(docs) if k not in drop], [r for k, r in enumerate(kept) if k not in drop]
    # (ids as a uint32 array, supervised token ranges) per document, and the shortcut that made it, if one did
    encoded, made_by = encode_by_shortcut(docs, fast, (lambda: line_cache(key)) if task.line_cache else None)
    flat = encoded if isinstance(encoded, FlatDocuments) else None  # fastokens made every one: no None
    whole = [] if flat is not None else [k for k, m in enumerate(encoded) if m is None]
    chat = task.formatter.fmt.style == "chat"  # a bad row says why in the terms of its format
    for k, encoding in zip(whole, reference_encodings(hf_tokenizer(key), [docs[k] for k in whole])):
        try:
            encoded[k] = (np.asarray(encoding.ids, np.uint32), token_spans(encoding, docs[k], chat))
        except BadRow as e:
            bad.append((kept[k], str(e)))
    by_shortcut = [k for k, m in enumerate(made_by) if m is not None or docs[k].rendered_once]
    digests = text_digests([doc.text.encode("utf-8") for doc in docs])  # the sample's, and most splits'
    sampled = exactness.sampled_mask(digests)
    checks = [k for k in by_shortcut if kept[k] < task.check_rows or sampled[k]]
    mismatches = check_renders(task.formatter, columns, docs, kept, [k for k in checks if docs[k].rendered_once])
    encoded_checks = [k for k in checks if made_by[k] is not None and encoded[k] is not None]
    mismatches += check_documents(hf_tokenizer(key) if encoded_checks else None, docs, encoded, made_by, kept,
                                  encoded_checks)
    if columnar is None:
        special += [(kept[k], docs[k].special_text_at) for k in range(len(docs)) if docs[k].special_text_at]
    first: dict[int, str] = {}
    for row, why in bad:  # a row once, with its first reason (a row may give several documents)
        first.setdefault(row, why)
    bad = sorted(first.items())
    failed = {row for row, _ in bad}  # a row one of whose documents is bad gives none
    good = [k for k in range(len(docs)) if kept[k] not in failed and (flat is not None or encoded[k] is not None)]
    to_end = [docs[k].spans[-1][1] == len(docs[k].text) for k in good]
    batch = assemble_flat(flat, np.asarray(to_end, bool), task.head, task.eos_id) if flat is not None and \
        len(good) == len(docs) else assemble_documents([encoded[k] for k in good], to_end, task.head, task.eos_id)
    batch["tokens"] = batch["tokens"].astype(task.token_dtype, copy=False)
    return EncodedBatch(**batch, is_val=split_of(docs, good, digests, task.val_fraction),
                        keys=mix.document_keys(batch["tokens"], batch["masks"], batch["lengths"]), bad_rows=bad,
                        by_shortcut=len(by_shortcut), checked=len(checks) - len(mismatches), mismatches=mismatches,
                        no_system=sum(docs[k].no_system for k in good),
                        special_text=sorted(dict(reversed(special)).items()) if columnar is None else [])


def encode_suffix_rows(task: EncodeTask, fast, batch: SuffixBatch) -> EncodedBatch:
    """:func:`encode_rows` for prompt + answer rows formatted column-wise (pipeline/format/format_columns.py),
    with fastokens: the same documents, bad rows and checks, with no Python object per document
    where fastokens places the span (the HF tokenizer makes the rest, as in :func:`encode_rows`)."""
    key = (task.tokenizer_file, task.tokenizer_sha256)
    ids, offsets, firsts = fast.encode_suffixes(batch.texts, batch.prompt_chars)
    label = exactness.fast_encoder_label(fast.name)
    made = np.flatnonzero(firsts >= 0)
    docs = {}  # Formatted, only of the documents a check or the HF tokenizer needs

    def doc(k: int) -> Formatted:
        if k not in docs:
            docs[k] = Formatted(batch.texts[k], ((int(batch.prompt_chars[k]), len(batch.texts[k])),))
        return docs[k]

    encoded = {}  # (ids, supervised token ranges) of the documents the HF tokenizer makes
    bad = list(batch.bad)
    rest = np.flatnonzero(firsts < 0).tolist()
    for k, encoding in zip(rest, hf_tokenizer(key).encode_batch(
            [batch.texts[k] for k in rest], add_special_tokens=False) if rest else []):
        try:
            encoded[k] = (np.asarray(encoding.ids, np.uint32), token_spans(encoding, doc(k)))
        except BadRow as e:
            bad.append((batch.kept[k], str(e)))
    digests = text_digests([text.encode("utf-8") for text in batch.texts])  # the split's and the sample's
    whole = np.asarray(batch.kept, np.int64) < task.check_rows
    checks = made.tolist() if whole.all() else \
        np.flatnonzero((firsts >= 0) & (whole | exactness.sampled_mask(digests))).tolist()
    def made_by_fast(k: int):  # (ids, supervised token range) of a document fastokens made
        return ids[offsets[k]:offsets[k + 1]], [(int(firsts[k]), int(offsets[k + 1] - offsets[k]))]

    fast_made = {k: made_by_fast(k) for k in checks}
    mismatches = check_documents(hf_tokenizer(key) if checks else None, {k: doc(k) for k in checks}, fast_made,
                                 {k: label for k in checks}, batch.kept, checks)
    bad.sort()
    if rest:  # the documents in order, some made by each: assembled one by one
        good = [k for k in range(len(firsts)) if firsts[k] >= 0 or k in encoded]
        assembled = assemble_documents(
            [encoded[k] if k in encoded else made_by_fast(k) for k in good], [True] * len(good), task.head, task.eos_id)
    else:
        good = range(len(firsts))
        assembled = assemble_suffixes(ids, offsets, firsts, task.head, task.eos_id)
    tokens = assembled.pop("tokens").astype(task.token_dtype, copy=False)
    return EncodedBatch(tokens=tokens, **assembled,
                        is_val=validation_mask(digests, task.val_fraction)[np.asarray(good, np.int64)],
                        keys=mix.document_keys(tokens, assembled["masks"], assembled["lengths"]), bad_rows=bad,
                        by_shortcut=len(made), checked=len(checks) - len(mismatches), mismatches=mismatches)


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


def refused_batch(mismatch: exactness.Mismatch | None) -> EncodedBatch:
    """A batch that holds nothing but ``mismatch``: the build drops the shortcut and tokenizes again (None:
    no document at all)."""
    empty = np.zeros(0, np.int64)
    return EncodedBatch(tokens=np.zeros(0, np.uint32), masks=np.zeros(0, np.uint8), lengths=empty, prompt_lengths=empty,
                        is_val=np.zeros(0, bool), keys=np.zeros((0, 16), np.uint8), bad_rows=[],
                        mismatches=[mismatch] if mismatch else [])


def check_documents(reference, docs, encoded, made_by, kept: list[int], checks: list[int]) -> list[exactness.Mismatch]:
    """Re-encode the documents ``checks`` (made by a shortcut) with the reference, the HF tokenizer on
    the whole text, and return where the ids or the supervised tokens differ (pipeline/encode/fast/exactness.py).
    ``docs`` (Formatted), ``encoded`` ((ids, token ranges)) and ``made_by`` (the shortcut's label) are
    indexed by document (lists, or dicts holding ``checks``), ``kept`` gives each document's row."""
    mismatches = []
    for k, encoding in zip(checks, reference_encodings(reference, [docs[k] for k in checks]) if checks else []):
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
    """Render the conversations ``checks`` (made by one render, pipeline/format/chat_once.py) the exact way
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


def format_rows(formatter: RowFormatter, columns: dict[str, list], special: list | None = None
                ) -> tuple[list[Formatted], list[int], list]:
    """(documents, the row index of each, (row index, reason) of each bad row); a row may give several
    documents (format.each_assistant_turn). ``special`` gets (row index, where) of each row refused for
    holding special-token text (``build.special_tokens_in_text: refuse``)."""
    names = list(columns)
    docs: list[Formatted] = []
    kept, bad = [], []
    at_once = format_conversations(formatter, columns)  # plain conversations, the batch at once (chat_columns.py)
    if at_once is not None and None not in at_once:
        return at_once, list(range(len(at_once))), []
    for i, values in enumerate(zip(*columns.values())):
        if at_once is not None and at_once[i] is not None:
            docs.append(at_once[i])
            kept.append(i)
            continue
        try:
            made = formatter.documents(dict(zip(names, values)))
        except BadRow as e:
            bad.append((i, str(e)))
            if isinstance(e, SpecialTextRefused) and special is not None:
                special.append((i, e.where))
            continue
        except (KeyError, ValueError, IndexError) as e:  # a template that does not fit the row
            bad.append((i, f"template error: {e}"))
            continue
        docs += made
        kept += [i] * len(made)
    return docs, kept, bad
