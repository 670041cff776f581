"""The build's config sections: ``sources`` (what to read), ``format`` (how a row becomes prompt and
answer text), ``pack`` (blocks and shards) and ``build`` (how the build runs). Every field's default
is here; packtrain/core/config.py puts the sections together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from packtrain.core.config_fields import num


@dataclass
class SourceConfig:
    """One dataset feeding the expert."""

    name: str
    """``bundled`` (the sample shipped with packtrain), an HF dataset id (``b-mc2/sql-create-context``)
    found in the local HF caches, or a local path (jsonl/json/csv/parquet file or directory, or a
    ``save_to_disk`` directory)."""
    split: str = "train"
    """Which split of the dataset to read (``train``, ``validation``, ...), as in ``load_dataset(name, split=...)``;
    the build makes its own validation split from it (``pack.val_fraction``). Change it when the rows you
    want are in another split."""
    revision: str | None = None
    """Hub cache only: a branch/tag name or a commit hash; default: the ``main`` ref, or the only snapshot."""
    columns: dict[str, str] = field(default_factory=dict)
    """Template field -> dataset column, for datasets whose column names differ from the template's."""
    max_rows: int | None = num(None, "[1, 1000000000000]", "or unset for every row")
    """Read at most this many rows of the source, in file order (before formatting, dedup and
    ``weight``); unset: every row. Set it for a quick trial build of a large dataset."""
    weight: float = num(1.0, "(0, 1000]")
    """Mixing weight of this source's training documents: 0.25 keeps a quarter of them, 3 packs each
    three times, 2.5 each twice plus exactly half of them once more (chosen by a hash of their
    tokens, so the same half every build). Applied after dedup; validation documents are never
    weighted (pipeline/mix.py)."""

    def validate(self, errors: list[str], where: str) -> None:
        if not self.name:
            errors.append(f"{where}.name: must not be empty")


@dataclass
class FormatConfig:
    """How a row becomes (prompt, answer) text. The answer is supervised, the prompt is not."""

    style: Literal["template", "chat"] = "template"
    """``template``: ``prompt`` + ``answer`` + eos. ``chat``: the tokenizer's chat template, with
    ``system`` (optional), the user turn rendered from ``prompt`` and the assistant turn from ``answer``."""
    prompt: str = "{prompt}"
    """Python format string over the row's fields, e.g. ``"### Question\\n{question}\\n### SQL\\n"``."""
    answer: str = "{answer}"
    """Python format string over the row's fields for the supervised part (the loss is on its
    tokens), e.g. ``"{answer}"``; a row whose answer renders empty is a bad row."""
    system: str | None = None
    """style chat: a system message put before the user turn (before a conversation that has none)."""
    messages: str | None = None
    """style chat: the column holding a whole conversation, a list of ``{"role", "content"}`` messages
    (system, user, assistant, tool; assistant ``tool_calls`` as the chat template renders them). The
    loss is on every assistant turn and its end-of-turn token; prompt and answer are not used."""

    def validate(self, errors: list[str], where: str) -> None:
        if self.messages is not None:
            if self.style != "chat":
                errors.append(f"{where}.messages: a conversation column needs style: chat")
            if not self.messages:
                errors.append(f"{where}.messages: name the column holding the conversations, e.g. messages")
            if (self.prompt, self.answer) != ("{prompt}", "{answer}"):
                errors.append(f"{where}.prompt/answer: not used with messages (the conversation holds the turns); "
                              "remove them")
        for name in ("prompt", "answer"):
            try:
                template_fields(getattr(self, name))
            except ValueError as e:
                errors.append(f"{where}.{name}: not a valid format string ({e})")
        if self.system is not None and self.style != "chat":
            errors.append(f"{where}.system: only used with style: chat")
        try:
            names = template_fields(self.prompt, positional=True) + template_fields(self.answer, positional=True)
        except ValueError:
            return  # reported above
        odd = [n for n in names if n == "" or n.isdigit() or "." in n or "[" in n]
        if odd:
            errors.append(f"{where}: field {{{odd[0]}}} is not a column name; name the dataset column in the braces, "
                          "e.g. {question}")
        elif not names:
            errors.append(f"{where}.prompt/answer: no field at all, so every example would be the same text; name the "
                          "dataset's columns in braces, e.g. prompt: \"{question}\" and answer: \"{answer}\"")

    def fields(self) -> list[str]:
        if self.messages is not None:
            return [self.messages]
        return sorted(set(template_fields(self.prompt)) | set(template_fields(self.answer)))


def template_fields(template: str, positional: bool = False) -> list[str]:
    """The field names of a format string; ``positional``: also the empty names of ``{}``."""
    import string

    return [name for _, name, _, _ in string.Formatter().parse(template) if name or (positional and name == "")]


@dataclass
class PackConfig:
    block_size: int = num(2048, "[16, 1048576]")
    """Tokens per packed block (``block_size`` in HF's run_clm.py): the sequence length the model
    trains on, unless ``train.max_seq_length`` cuts blocks into shorter windows (no rebuild; the cpu
    profile does). Raise it for long documents (the build report says which size holds 99% of them);
    it is an input of the build id, so a change means a new build. The same on every machine."""
    strategy: Literal["bfd", "wrap"] = "bfd"
    """``bfd``: best-fit decreasing over the whole dataset, documents never split across blocks.
    ``wrap``: concatenate every document and cut into blocks (documents may span two blocks)."""
    overlong: Literal["split", "truncate", "drop"] = "split"
    """Documents longer than block_size (bfd only): split into block-size pieces, truncate to one
    block, or drop. Always counted in the report."""
    val_fraction: float = num(0.02, "[0, 1)")
    """Share of documents held out for validation, chosen by a hash of each document's content."""
    shard_size_mb: int = num(128, "[1, 1048576]")
    """Target size of one Arrow shard file, in MiB (each shard holds whole blocks). The blocks are the
    same for any value, but it is an input of the build id (the files differ); lower it for many small
    files, raise it for fewer large ones."""

    def validate(self, errors: list[str], where: str) -> None:
        pass  # its numbers are checked by check_numbers


@dataclass
class BuildConfig:
    num_proc: int = num(8, "[1, 1024]", "tokenizer processes; capped at the number of batches")
    """Tokenizer processes, as in ``datasets.map(num_proc=...)``; capped at the number of batches. The
    output (and the build id) is the same for any value: set it to the CPU cores you can spare."""
    batch_rows: int = num(1000, "[1, 10000000]")
    """Rows per tokenization task; fixed, so the output does not depend on num_proc."""
    on_bad_rows: Literal["skip", "error"] = "skip"
    """A row the template cannot turn into text to train on (a missing, null or non-text field, an
    empty answer, a prompt the chat template does not render as a prefix): ``skip`` drops it, counts it
    and names the first one in the report; ``error`` stops the build at the first one."""
    dedup: Literal["exact", "none"] = "exact"
    """``exact``: a document whose tokens and supervised positions equal an earlier one's is packed
    once, within and across sources; a training document equal to a validation one is dropped (a
    document in val is never also in train). Counted per source in the report."""
    line_cache: bool = True
    """Tokenize each distinct line once (schemas repeat across rows), cut where the tokenizer's split
    regex allows (pipeline/encode/line_cache.py). A shortcut: what it makes is checked against the HF tokenizer
    (check_documents) and it is dropped for a tokenizer on any difference. Part of the build id, like
    fast_encoder; the shards are the same bytes with it on or off."""
    fast_encoder: bool | Literal["fastokens", "tiktoken"] = True
    """Encode with a fast encoder where it is proven to give the HF tokenizer's ids: ``true`` tries
    fastokens (pipeline/encode/fastokens_encoder.py), then tiktoken (byte-level BPE whose merges agree
    with its ranks: pipeline/encode/tiktoken_encoder.py); a name tries that one only; ``false``: the HF
    tokenizer only. The choice and its reason are logged. A shortcut, checked like line_cache; part of
    the build id (with the libraries' versions), same bytes either way."""
    render_once: bool = True
    """Conversations (format.messages) from one render of the chat template, every assistant span
    read off it (pipeline/chat_once.py), where probe conversations show the template renders them as
    the exact way does (a render per turn and one through it); the exact way otherwise. A shortcut,
    checked like line_cache (the checked documents rendered the exact way too and compared); part of
    the build id, same bytes either way."""
    check_documents: int = num(2048, "[0, 1000000000]")
    """Every document a shortcut (fast_encoder, line_cache, render_once) makes in the first check_documents rows of
    each source (rounded up to whole batches of batch_rows) is encoded again with the HF tokenizer and compared (ids and loss mask), and one in 512
    of the rest (seeded by the document's text). A difference is never published: the shortcut is
    dropped for that tokenizer, remembered, and the sources tokenized again without it
    (docs/BUILD.md, "Exactness"). Not part of the build id: it changes what is checked, not the bytes."""

    def validate(self, errors: list[str], where: str) -> None:
        pass  # its numbers are checked by check_numbers
