"""The build's config sections: ``format`` (how a row becomes prompt and answer text), ``pack`` (blocks
and shards) and ``build`` (how the build runs); ``sources`` (what to read) is in
packtrain/core/config_sources.py. Every field's default is here or there; packtrain/core/config.py puts the
sections together.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from packtrain.core.config_fields import num
from packtrain.core.machine import affinity_cpus


ALPACA_PROMPT = ("Below is an instruction that describes a task, paired with an input that provides further "
                 "context. Write a response that appropriately completes the request.\n\n"
                 "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
ALPACA_PROMPT_NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately "
                          "completes the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")
SHAREGPT_ROLES = {"system": ["system"], "user": ["human", "user"], "assistant": ["gpt", "assistant"], "tool": ["tool"]}


def preset_fields(preset: str | None, style: str) -> dict[str, Any]:
    """The fields a ``format.preset`` stands for (fields the config sets itself win)::

        sharegpt            messages: conversations, message_property_mappings: {role: from, content: value},
                            roles: {system: [system], user: [human, user], assistant: [gpt, assistant], tool: [tool]}
        prompt_completion   style template: prompt: "{prompt}", answer: "{completion}" (TRL's plain form)
                            style chat: messages: prompt, completion: completion (TRL's conversational form)
        alpaca              prompt / prompt_no_input: the Stanford alpaca prompts, answer: "{output}"
    """
    if preset == "sharegpt":
        return {"messages": "conversations", "message_property_mappings": {"role": "from", "content": "value"},
                "roles": {role: list(values) for role, values in SHAREGPT_ROLES.items()}}
    if preset == "prompt_completion":
        return {"messages": "prompt", "completion": "completion"} if style == "chat" else \
            {"prompt": "{prompt}", "answer": "{completion}"}
    if preset == "alpaca":
        return {"prompt": ALPACA_PROMPT, "prompt_no_input": ALPACA_PROMPT_NO_INPUT, "answer": "{output}"}
    return {}


# what the build passes the chat template itself (format.chat_template_kwargs may not set them)
RESERVED_TEMPLATE_VARIABLES = {
    "messages": "the conversation", "add_generation_prompt": "set by the build for each render",
    "continue_final_message": "not how the build renders", "bos_token": "the tokenizer's", "eos_token": "the tokenizer's",
    "tools": "each row's, from the column format.tools names", "documents": "not supported",
}

def not_json(value: Any, where: str) -> list[tuple[str, Any]]:
    """(dotted path, value) of each value under ``value`` that JSON has no type for (YAML reads an
    unquoted 2024-07-26 as a date): the build id hashes the chat template's variables as JSON.

    >>> import datetime
    >>> not_json({"a": [1, {"b": datetime.date(2024, 7, 26)}], "c": None}, "kw")
    [('kw.a[1].b', datetime.date(2024, 7, 26))]
    """
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in not_json(item, f"{where}.{key}")]
    if isinstance(value, list):
        return [found for i, item in enumerate(value) for found in not_json(item, f"{where}[{i}]")]
    return [] if value is None or isinstance(value, (str, int, float, bool)) else [(where, value)]


# fields added after builds existed: the build id hashes them only where set, so a config that sets
# none keeps its build id (FormatConfig.identity)
ADDED_FIELDS = ("preset", "message_property_mappings", "roles", "completion", "prompt_no_input", "each_assistant_turn",
                "tools", "chat_template_kwargs", "chat_template_kwargs_column")


@dataclass
class FormatConfig:
    """How a row becomes (prompt, answer) text. The answer is supervised, the prompt is not."""

    style: Literal["template", "chat"] = "template"
    """``template``: ``prompt`` + ``answer`` + eos. ``chat``: the tokenizer's chat template, with
    ``system`` (optional), the user turn rendered from ``prompt`` and the assistant turn from ``answer``."""
    preset: Literal["sharegpt", "prompt_completion", "alpaca"] | None = None
    """A dataset layout by name, standing for the fields it sets (those the config sets win):
    ``sharegpt`` (``conversations: [{from: human|gpt|system, value}]``, style chat), ``prompt_completion``
    (TRL's ``prompt``/``completion`` columns: strings with style template, lists of messages with style
    chat), ``alpaca`` (``instruction``/``input``/``output`` in the Stanford alpaca prompt); docs/DATASETS.md."""
    prompt: str = "{prompt}"
    """Python format string over the row's fields, e.g. ``"### Question\\n{question}\\n### SQL\\n"``."""
    prompt_no_input: str | None = None
    """The prompt for a row whose fields that are in ``prompt`` but not in this one are all empty (alpaca's
    prompt without ``### Input:`` for a row whose ``input`` is ""), as axolotl's ``no_input_format``."""
    answer: str = "{answer}"
    """Python format string over the row's fields for the supervised part (the loss is on its
    tokens), e.g. ``"{answer}"``; a row whose answer renders empty is a bad row."""
    system: str | None = None
    """style chat: a system message put before the user turn (before a conversation that has none)."""
    messages: str | None = None
    """style chat: the column holding a whole conversation, a list of ``{"role", "content"}`` messages
    (system, user, assistant, tool; assistant ``tool_calls`` as the chat template renders them). The
    loss is on every assistant turn and its end-of-turn token; prompt and answer are not used."""
    message_property_mappings: dict[str, str] = field(default_factory=dict)
    """With ``messages``: the keys of the data's messages that hold the role and the content, e.g.
    ``{role: from, content: value}`` (ShareGPT); unset: ``role`` and ``content``. As axolotl's."""
    roles: dict[str, list[str]] = field(default_factory=dict)
    """With ``messages``: the data's role values for each role, e.g. ``{user: [human], assistant: [gpt]}``
    (ShareGPT); a role value no list names is a bad row. Unset: the roles as written (system, user,
    assistant, tool). As axolotl's."""
    completion: str | None = None
    """With ``messages`` (the prompt's messages): the column holding the completion's messages, appended
    to the prompt's as one conversation; the loss is on the completion's assistant turns only (TRL's
    conversational prompt/completion)."""
    tools: str | None = None
    """With ``messages``: the column holding each row's tool definitions (a list of JSON-schema
    function specs, or that list as JSON text; null or "": none, an empty list passed as one), passed
    to the chat template as ``apply_chat_template(tools=...)`` passes them (TRL's ``tools`` column). A row with tools whose
    template does not render them is a bad row (they would be dropped silently)."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """style chat: more variables for the chat template, as ``apply_chat_template(**kwargs)`` passes them
    (TRL's ``chat_template_kwargs``), e.g. ``{enable_thinking: false}`` for Qwen3; every row's every
    render gets them (the one-render shortcut is then not used)."""
    chat_template_kwargs_column: str | None = None
    """style chat with ``messages``: the column holding each row's own template variables (a mapping, or
    its JSON text; null: none), over ``chat_template_kwargs``, as TRL reads its ``chat_template_kwargs``
    column (e.g. ``{enable_thinking: false}`` on the rows that answer without reasoning)."""
    each_assistant_turn: bool = False
    """With ``messages``: each assistant turn its own document, its history rendered as the chat template
    renders it at that turn, the loss on that turn only. For templates that render earlier turns
    otherwise (Qwen3 drops earlier ``<think>`` blocks); costs the history's tokens once per turn."""

    def __post_init__(self) -> None:
        for name, value in preset_fields(self.preset, self.style).items():
            f = self.__dataclass_fields__[name]
            if getattr(self, name) == (f.default_factory() if f.default is dataclasses.MISSING else f.default):
                setattr(self, name, value)

    def identity(self) -> dict:
        """What the build id hashes: every field, those of ``ADDED_FIELDS`` only where set."""
        out = dataclasses.asdict(self)
        for name in ADDED_FIELDS:
            if out[name] in (None, False, {}):
                del out[name]
        return out

    def validate(self, errors: list[str], where: str) -> None:
        if self.preset == "sharegpt" and self.style != "chat":
            errors.append(f"{where}.preset: sharegpt holds conversations, which need style: chat")
        if self.messages is not None:
            if self.style != "chat":
                errors.append(f"{where}.messages: a conversation column needs style: chat")
            if not self.messages:
                errors.append(f"{where}.messages: name the column holding the conversations, e.g. messages")
            if self.tools == "":
                errors.append(f"{where}.tools: name the column holding each row's tool definitions, e.g. tools")
            if {"prompt", "answer"} & set(preset_fields(self.preset, self.style)):
                errors.append(f"{where}.preset: {self.preset} reads prompt/answer columns, not a conversation column; "
                              "remove format.messages or the preset")
            elif (self.prompt, self.answer, self.prompt_no_input) != ("{prompt}", "{answer}", None):
                errors.append(f"{where}.prompt/answer: not used with messages (the conversation holds the turns); "
                              "remove them")
        else:
            for name in ("message_property_mappings", "roles", "completion", "each_assistant_turn", "tools",
                         "chat_template_kwargs_column"):
                if getattr(self, name) not in (None, False, {}):
                    errors.append(f"{where}.{name}: only used with format.messages (a conversation column)")
        unknown = sorted(set(self.message_property_mappings) - {"role", "content"})
        if unknown:
            errors.append(f"{where}.message_property_mappings: {unknown[0]!r} is not role or content")
        keys = self.message_property_mappings
        if keys.get("role", "role") == keys.get("content", "content"):
            errors.append(f"{where}.message_property_mappings: role and content both read the key "
                          f"{keys.get('role', 'role')!r}; name the key holding each")
        for role in sorted(set(self.roles) - set(MESSAGE_ROLES)):
            errors.append(f"{where}.roles: {role!r} is not one of {', '.join(MESSAGE_ROLES)}")
        listed: dict[str, str] = {}
        for role, values in self.roles.items():
            for value in values:
                if listed.setdefault(value, role) != role:
                    errors.append(f"{where}.roles: {value!r} is listed under both {listed[value]} and {role}; list "
                                  "each of the data's role values under one role")
        for name in ("prompt", "answer") + (("prompt_no_input",) if self.prompt_no_input is not None else ()):
            try:
                template_fields(getattr(self, name))
            except ValueError as e:
                errors.append(f"{where}.{name}: not a valid format string ({e})")
        if self.system is not None and self.style != "chat":
            errors.append(f"{where}.system: only used with style: chat")
        if self.chat_template_kwargs and self.style != "chat":
            errors.append(f"{where}.chat_template_kwargs: only used with style: chat (they go to the chat template)")
        for name in sorted(set(self.chat_template_kwargs) & set(RESERVED_TEMPLATE_VARIABLES)):
            errors.append(f"{where}.chat_template_kwargs: {name!r} is {RESERVED_TEMPLATE_VARIABLES[name]}; remove it")
        for path, value in not_json(self.chat_template_kwargs, f"{where}.chat_template_kwargs"):
            errors.append(f"{path}: {value} is a {type(value).__name__}, not text: quote it (\"{value}\") to pass it as text")
        try:
            names = template_fields(self.prompt, positional=True) + template_fields(self.answer, positional=True)
            optional = self.optional_fields()
        except ValueError:
            return  # reported above
        if self.prompt_no_input is not None and not optional:
            errors.append(f"{where}.prompt_no_input: must leave out a field of format.prompt (the one that may be "
                          "empty, e.g. {input}), and name no other")
        odd = [n for n in names if n == "" or n.isdigit() or "." in n or "[" in n]
        if odd:
            errors.append(f"{where}: field {{{odd[0]}}} is not a column name; name the dataset column in the braces, "
                          "e.g. {question}")
        elif not names:
            errors.append(f"{where}.prompt/answer: no field at all, so every example would be the same text; name the "
                          "dataset's columns in braces, e.g. prompt: \"{question}\" and answer: \"{answer}\"")

    def optional_fields(self) -> list[str]:
        """The fields of ``prompt`` that ``prompt_no_input`` leaves out (none without it, or where it names a
        field ``prompt`` does not)."""
        if self.prompt_no_input is None:
            return []
        full, short = template_fields(self.prompt), set(template_fields(self.prompt_no_input))
        return [] if short - set(full) else sorted(set(full) - short)

    def fields(self) -> list[str]:
        if self.messages is not None:
            return [self.messages] + [name for name in (self.completion, self.tools, self.chat_template_kwargs_column)
                                      if name]
        return sorted(set(template_fields(self.prompt)) | set(template_fields(self.answer)))


MESSAGE_ROLES = ("system", "user", "assistant", "tool")


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


AUTO_NUM_PROC_MAX = 8
"""``build.num_proc: auto`` starts at most this many tokenizer processes (the default was 8 before auto)."""


@dataclass
class BuildConfig:
    num_proc: int | Literal["auto"] = num("auto", "[1, 1024]",
                                          "tokenizer processes or auto; capped at the number of batches")
    """Tokenizer processes, as in ``datasets.map(num_proc=...)``; capped at the number of batches.
    ``auto``: one per CPU this process may use (its CPU affinity: a container's or ``taskset``'s share), at most
    :data:`AUTO_NUM_PROC_MAX` (each holds a tokenizer's memory). The output (and the build id) is the same for any
    value: set a number to the CPU cores you can spare."""
    batch_rows: int = num(1000, "[1, 10000000]")
    """Rows per tokenization task; fixed, so the output does not depend on num_proc."""
    on_bad_rows: Literal["skip", "error"] = "skip"
    """A row the template cannot turn into text to train on (a missing, null or non-text field, an
    empty answer, a prompt the chat template does not render as a prefix): ``skip`` drops it, counts it
    and names the first one in the report; ``error`` stops the build at the first one."""
    dedup: Literal["exact", "near", "none"] = "exact"
    """``exact``: a document whose tokens and supervised positions equal an earlier one's is packed
    once, within and across sources; a training document equal to a validation one is dropped (a
    document in val is never also in train). ``near``: that, and a training document that is a
    near-duplicate of one kept before it (prompt and answer each at least ``dedup_threshold``
    similar: pipeline/pack/near_dup.py) is dropped too, and training is compared with validation the same
    way (contamination). Counted per source in the report, with examples (docs/BUILD.md)."""
    dedup_threshold: float = num(0.8, "[0.5, 1]")
    """``dedup: near`` and ``decontaminate``: the Jaccard similarity (of 3-grams of the tokens' lowercased
    text), of the prompts and of the answers, at or above which two documents are near-duplicates. Part
    of the build id where used."""
    decontaminate: bool = False
    """Drop every training document that is a near-duplicate (or a copy) of a validation document;
    validation is never changed. Off: they are counted and shown in the report, and kept. Part of the
    build id when on."""
    special_tokens_in_text: Literal["text", "special", "refuse"] = "text"
    """What a special token's text inside the data (a field's value, a message's content, a tool
    definition: ``<|endoftext|>``, ``<|im_end|>``) becomes: ``text`` encodes it as ordinary text (HF's
    ``split_special_tokens=True`` on the data, so data never forges a control token), while the
    template's own markers and the EOS packtrain appends stay special; ``special`` encodes it as the
    special token (what the HF tokenizer and TRL do by default, and packtrain did before); ``refuse``
    makes such a row a bad row naming the field and the token. Rows holding such text are counted per
    source in the report, with an example. Part of the build id (docs/BUILD.md, "Special-token text in
    the data")."""
    line_cache: bool = True
    """Tokenize each distinct line once (schemas repeat across rows), cut where the tokenizer's split
    regex allows (pipeline/encode/fast/line_cache.py). A shortcut: what it makes is checked against the HF tokenizer
    (check_documents) and it is dropped for a tokenizer on any difference. Part of the build id, like
    fast_encoder; the shards are the same bytes with it on or off."""
    fast_encoder: bool | Literal["fastokens", "tiktoken"] = True
    """Encode with a fast encoder where it is proven to give the HF tokenizer's ids: ``true`` tries
    fastokens (pipeline/encode/fast/fastokens_encoder.py), then tiktoken (byte-level BPE whose merges agree
    with its ranks: pipeline/encode/fast/tiktoken_encoder.py); a name tries that one only; ``false``: the HF
    tokenizer only. The choice and its reason are logged. A shortcut, checked like line_cache; part of
    the build id (with the libraries' versions), same bytes either way."""
    render_once: bool = True
    """Conversations (format.messages) from one render of the chat template, every assistant span
    read off it (pipeline/format/chat_once.py), where probe conversations show the template renders them as
    the exact way does (a render per turn and one through it); the exact way otherwise. A shortcut,
    checked like line_cache (the checked documents rendered the exact way too and compared); part of
    the build id, same bytes either way."""
    check_documents: int = num(2048, "[0, 1000000000]")
    """Every document a shortcut (fast_encoder, line_cache, render_once) makes in the first check_documents
    rows of each source (as read, counted before sources[].where) is encoded again with the HF tokenizer
    and compared (ids and loss mask), and one in 512 of the rest (seeded by the document's text). A difference is never published: the shortcut is
    dropped for that tokenizer, remembered, and the sources tokenized again without it
    (docs/BUILD.md, "Exactness"). Not part of the build id: it changes what is checked, not the bytes."""
    read_memory_mb: int = num(2048, "[8, 1048576]")
    """The memory, in MiB, that reading one data file may hold at once. A line of a JSON lines file, a
    row of a CSV/TSV file and a JSON array file (parsed whole) are held in memory while read, up to 8
    times over (the bytes, the decoded text, the parsed values), so each may be at most
    read_memory_mb / 8 once decompressed (256 MiB by default); a longer one stops the build in one line
    naming the file, the line and the bound, before it is held (a 1 MB ``.jsonl.gz`` can expand to a
    1 GiB line). A document is held far more while the model's tokenizer encodes it (up to 512 bytes per
    byte of its text), so a formatted document may be at most read_memory_mb / 512 bytes of text (4 MiB by
    default): a longer one stops the build in one line naming its row, before it is encoded. Raise it for
    a dataset that really holds such rows. Not part of the build id: it changes whether a build runs,
    never its bytes."""

    def processes(self) -> int:
        """``num_proc`` as a number: ``auto`` resolved on this machine (packtrain/core/machine.py ``affinity_cpus``, at most
        :data:`AUTO_NUM_PROC_MAX`)."""
        return min(affinity_cpus(), AUTO_NUM_PROC_MAX) if self.num_proc == "auto" else self.num_proc

    def validate(self, errors: list[str], where: str) -> None:
        pass  # its numbers are checked by check_numbers
