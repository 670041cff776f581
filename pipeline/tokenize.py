"""Tokenization: formatted rows -> token arrays, with ``num_proc`` processes and bounded memory.

Each task is one fixed-size batch of rows (``build.batch_rows``), so the output never depends on
``num_proc``: the main process submits at most ``2 * num_proc`` batches ahead and takes results
back in submission order. Each worker loads the fast tokenizer once and calls ``encode_batch``, or
a shortcut: tiktoken (pipeline/bpe_fast.py) or the line cache (pipeline/segments.py). A sample of
what a shortcut makes is re-encoded with the HF tokenizer in the same worker and compared
(pipeline/exactness.py); the batch carries any difference back to the build, which then drops it.

Per document the worker returns ``[bos?] + tokens(text) + [eos]`` and its loss mask: 1 on the
tokens of every supervised span (the answer; each assistant turn of a conversation), and on the
EOS when the last span runs to the end of the text. The prompt's tokens are a prefix of the full
text's tokens when the prompt ends on a token boundary of the full text; the worker checks that
with the tokenizer's character offsets (no second encoding) and rejects the row otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import multiprocessing
import os
import signal
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packtrain.core.contract import tokenizer_fingerprint
from packtrain.pipeline.format import BadRow, Formatted, RowFormatter
from packtrain.core.inputs import check_input, read_input, read_json
from packtrain.pipeline import exactness, mix, tokenizer_facts
from packtrain.pipeline.errors import TokenizerError
from packtrain.pipeline.segments import line_cut
from packtrain.pipeline.worker_encoders import fast_encoder, hf_tokenizer, line_cache

@dataclass(frozen=True)
class TokenizerInfo:
    """What the build needs to know about a tokenizer, read from its files."""

    directory: Path
    vocab_size: int
    eos_id: int
    eos_token: str
    pad_id: int
    pad_token: str
    bos_id: int | None
    bos_token: str | None
    prefix_ids: tuple[int, ...]
    """What the tokenizer puts before a text when it adds special tokens (its post-processor, e.g.
    Llama's BOS; or ``add_bos_token`` in tokenizer_config.json); empty for Qwen and GPT-2."""
    chat_template: str | None
    fingerprint: dict

    def line_split(self) -> tuple[bool, str]:
        """Whether repeated lines can be memoized (packtrain.pipeline.segments), and why; read from
        tokenizer.json when asked (only a build that tokenizes with HF tokenizers asks)."""
        spec = read_json(self.directory / "tokenizer.json", "build again", "a tokenizers file")
        cut, why = line_cut(spec)
        return cut is not None, why

    def manifest_entry(self, source: str) -> dict:
        return {
            "source": source,
            "hash": self.fingerprint["hash"],
            "files": self.fingerprint["files"],
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "bos_id": self.bos_id,
            "prefix_ids": list(self.prefix_ids),
        }


def load_tokenizer_info(directory: str | os.PathLike, sha256=None, facts_dir: Path | None = None) -> TokenizerInfo:
    """``sha256``: a cached hasher (packtrain.pipeline.hashcache.StatCache.sha256). The files are hashed before
    they are read, so a change in between shows when the build checks them again. ``facts_dir``: where
    the facts only the loaded HF tokenizer knows are remembered (pipeline/tokenizer_facts.py)."""
    directory = Path(directory)
    fingerprint = tokenizer_fingerprint(directory, sha256) if sha256 else tokenizer_fingerprint(directory)
    fix = (f"the tokenizer in {directory} is damaged: copy it again (or save it with "
           "`AutoTokenizer.from_pretrained(...).save_pretrained(dir)`), or set model.tokenizer to another directory")
    config_path = directory / "tokenizer_config.json"
    config = read_json(config_path, fix, "a tokenizer config") if config_path.is_file() else {}
    template = config.get("chat_template")
    if (directory / "chat_template.jinja").is_file():
        template = read_input(directory / "chat_template.jinja", lambda p: p.read_text(encoding="utf-8"), fix, "text")
    check_input(template is None or isinstance(template, (str, list)), config_path,
                f"chat_template is {type(template).__name__}, expected text", fix)
    if isinstance(template, list):  # named templates: take the default one
        check_input(all(isinstance(t, dict) and isinstance(t.get("template"), str) for t in template), config_path,
                    "chat_template is a list but not of {\"name\": ..., \"template\": ...}", fix)
        template = next((t["template"] for t in template if t.get("name") == "default"), None)

    def special_text(key: str) -> str | None:
        token = config.get(key)
        if isinstance(token, dict):
            token = token.get("content")
        if not token:
            return None
        check_input(isinstance(token, str), config_path, f"{key} is {token!r}, expected a token's text", fix)
        return token

    texts = {key: special_text(key) for key in ("eos_token", "pad_token", "bos_token")}
    facts = tokenizer_facts.remembered(directory / "tokenizer.json", fingerprint["hash"],
                                       sorted({t for t in texts.values() if t is not None}), fix, facts_dir)

    def special(key: str) -> tuple[str | None, int | None]:
        token = texts[key]
        if token is None:
            return None, None
        token_id = facts["ids"][token]
        if token_id is None:
            raise TokenizerError(f"{config_path}: {key} {token!r} is not in the tokenizer's vocabulary")
        return token, token_id

    eos_token, eos_id = special("eos_token")
    if eos_id is None:
        raise TokenizerError(
            f"{config_path}: no eos_token; packtrain ends every document with EOS. Set eos_token "
            "in tokenizer_config.json (for Qwen: <|endoftext|>)"
        )
    pad_token, pad_id = special("pad_token")
    bos_token, bos_id = special("bos_token")
    prefix = tuple(facts["prefix"])
    if not prefix and config.get("add_bos_token") and bos_id is not None:
        prefix = (bos_id,)
    return TokenizerInfo(
        directory=directory,
        vocab_size=facts["vocab_size"],
        eos_id=eos_id,
        eos_token=eos_token,
        pad_id=pad_id if pad_id is not None else eos_id,
        pad_token=pad_token if pad_token is not None else eos_token,
        bos_id=bos_id,
        bos_token=bos_token,
        prefix_ids=prefix,
        chat_template=template,
        fingerprint=fingerprint,
    )


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
    fast_encoder: bool = False
    """Encode with tiktoken (only set where packtrain.pipeline.bpe_fast.decide proved it exact)."""
    check_all: bool = True
    """Check every document a shortcut makes against the reference (the first ``build.check_documents``
    rows of a source), else a seeded sample (pipeline/exactness.py)."""


@dataclass
class EncodedBatch:
    tokens: np.ndarray  # uint32, every document's tokens concatenated
    masks: np.ndarray  # uint8 per token: 1 where the loss is (the answers), aligned with tokens
    lengths: np.ndarray  # int64 per document
    prompt_lengths: np.ndarray  # int64 per document: tokens before its first supervised one
    is_val: np.ndarray  # bool per document
    keys: np.ndarray  # uint8 [documents, 16]: each document's key (mix.document_keys)
    bad_rows: list[tuple[int, str]]  # (row index within the batch, reason)
    by_shortcut: int = 0  # documents a shortcut (tiktoken, the line cache) made
    checked: int = 0  # of those, how many were re-encoded with the reference and found identical
    mismatches: list = dataclasses.field(default_factory=list)  # exactness.Mismatch of those that differ


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
    docs, kept, bad = format_rows(task.formatter, columns)
    key = (task.tokenizer_file, task.tokenizer_sha256)
    fast = fast_encoder(key) if task.fast_encoder else None
    encoded: list = [None] * len(docs)  # (ids as a uint32 array, supervised token ranges) per document
    made_by: list[str | None] = [None] * len(docs)  # the shortcut that made each document, if one did
    simple = [k for k, d in enumerate(docs) if d.is_suffix]  # prompt + answer: one boundary, the answer to the end
    if fast:
        settled = fast.encode_splits([docs[k].text for k in simple], [docs[k].prompt_chars for k in simple])
        for k, m in zip(simple, settled):
            if m is not None:
                encoded[k], made_by[k] = (m[0], [(m[1], len(m[0]))]), exactness.FAST_ENCODER
    elif task.line_cache:
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
    by_shortcut = [k for k, m in enumerate(made_by) if m is not None]
    checks = [k for k in by_shortcut if task.check_all or exactness.sampled(docs[k].text)]
    mismatches = check_documents(hf_tokenizer(key) if checks else None, docs, encoded, made_by, kept, checks)
    good = [k for k, m in enumerate(encoded) if m is not None]
    bad.sort()
    batch = assemble_documents([encoded[k] for k in good], [docs[k].spans[-1][1] == len(docs[k].text) for k in good],
                               task.head, task.eos_id)
    batch["tokens"] = batch["tokens"].astype(task.token_dtype, copy=False)
    return EncodedBatch(**batch, is_val=np.fromiter((is_validation(docs[k].text, task.val_fraction) for k in good),
                                                   bool, len(good)),
                        keys=mix.document_keys(batch["tokens"], batch["masks"], batch["lengths"]), bad_rows=bad,
                        by_shortcut=len(by_shortcut), checked=len(checks) - len(mismatches), mismatches=mismatches)


def check_documents(reference, docs: list[Formatted], encoded: list, made_by: list[str | None],
                    kept: list[int], checks: list[int]) -> list[exactness.Mismatch]:
    """Re-encode the documents ``checks`` (made by a shortcut) with the reference, the HF tokenizer on
    the whole text, and return where the ids or the supervised tokens differ (pipeline/exactness.py)."""
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


def _init_worker() -> None:
    # one process per core: keep the Rust tokenizer from starting its own thread pool in each
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's business


@contextlib.contextmanager
def children_ignore_ctrl_c():
    """Start child processes (the workers, the encoder decision) with SIGINT ignored from their first
    instruction (an ignored signal stays ignored across exec), so a Ctrl-C, which the terminal sends
    to every process of the group, interrupts only the main process: it stops the children and
    cleans up, and no child prints a traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def encode_stream(tasks: Iterable[tuple[EncodeTask, dict[str, list]]], num_proc: int,
                  log=print) -> Iterator[EncodedBatch]:
    """Encode (task, batch) pairs in order with ``num_proc`` processes, at most ``2 * num_proc``
    batches in flight, so memory stays bounded whatever the corpus size. Never more processes than
    batches: each costs a tokenizer's memory, so a small source gets fewer (and it is said)."""
    tasks = iter(tasks)
    first = list(itertools.islice(tasks, num_proc))
    if len(first) < num_proc:
        if first:
            log(f"num_proc {num_proc} capped at {len(first)}: only {len(first)} batch"
                f"{'es' * (len(first) != 1)} of rows (build.batch_rows each) to tokenize")
        num_proc = len(first)
    tasks = itertools.chain(first, tasks)
    if num_proc <= 1:
        for task, columns in tasks:
            yield encode_rows(task, columns)
        return
    context = multiprocessing.get_context("spawn")
    with children_ignore_ctrl_c():
        pool = context.Pool(num_proc, initializer=_init_worker)
    with pool:
        pending: deque = deque()
        for task, columns in tasks:
            pending.append(pool.apply_async(encode_rows, (task, columns)))
            if len(pending) >= 2 * num_proc:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
