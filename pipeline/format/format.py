"""Formatting: one dataset row -> its text and the character spans the loss is on. Pure functions,
no tokenizer.

A row becomes a :class:`Formatted` text with ``spans``, the supervised character ranges (the
answers); everything else is read but not trained on. Two styles (``format.style``)::

    template   prompt = format.prompt.format(**row)     "### Question\\nHow many?\\n### SQL\\n"
               full   = prompt + format.answer.format(**row)    ... + "SELECT count(*) FROM t"

    chat       the tokenizer's chat template over [system?, user, assistant]:
               prompt = render(system?, user; add_generation_prompt=True)
               full   = render(system?, user, assistant)
               and the full text must start with the prompt (checked per row)

    chat + messages   a conversation column (``format.messages``), multi-turn, rendered whole;
               every assistant turn is a span, found by rendering the conversation up to it:
                 render(m[:k], add_generation_prompt=True)  ends where assistant turn k starts
                 render(m[:k+1])                            ends after its end-of-turn token
               both must be prefixes of render(m), else the row is refused (never trained on
               text the template would not produce)

    <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n⟦Hello<|im_end|>⟧\n<|im_start|>user\n...

Template fields name dataset columns, through ``sources[i].columns`` when the names differ.
A batch of template rows over text columns is formatted column-wise instead, with the same result
(pipeline/format/format_columns.py). The chat styles are rendered by pipeline/format/chat_render.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

from packtrain.core import hints
from packtrain.core.config_build import FormatConfig
from packtrain.pipeline.format.chat_messages import check_row_kwargs, check_tools
from packtrain.pipeline.format.chat_template import BadRow, template_for, variables_read
from packtrain.pipeline.format.field_text import spec_on_text, text_value
from packtrain.pipeline.format.special_text import SpecialText, SpecialTextRefused, marked, where_in_row


def template_columns_fix() -> str:
    """How to fix a dataset that lacks a template field's column (the config file under --configs-dir)."""
    return ("map the template's fields to this dataset's columns with `columns: {field: column}` under the source in "
            f"{hints.config_file()}, or name those columns in format.prompt / format.answer")


def messages_column_fix() -> str:
    return (f"set format.messages in {hints.config_file()} to the column holding the conversations (a list "
            "of {\"role\", \"content\"} messages)")


@dataclass(frozen=True)
class RowFormatter:
    fmt: FormatConfig
    columns: tuple[tuple[str, str], ...] = ()
    """(template field, dataset column) pairs; fields not listed read the column of the same name."""
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    render_once: bool = False
    """Conversations from one render of the chat template where that is checked to be what the exact
    way gives (pipeline/format/chat_once.py); the exact way otherwise."""
    tool_chat_template: str | None = None
    """The tokenizer's template named ``tool_use``, where it has one: a row with tools is rendered by it,
    as ``apply_chat_template`` renders a call with tools (transformers' ``get_chat_template``)."""
    special: SpecialText | None = None
    """``build.special_tokens_in_text`` and the tokenizer's special tokens (set by the worker, which has
    the tokenizer); None: the data's special-token text is not looked for (it encodes as special tokens)."""

    def needed_columns(self) -> list[str]:
        return [column for _, column in self.field_columns]

    @property
    def column_fix(self) -> str:
        """How to fix a dataset that lacks a column :meth:`needed_columns` names, by what the column is for."""
        return messages_column_fix() if self.fmt.messages is not None else template_columns_fix()

    @cached_property
    def field_columns(self) -> tuple[tuple[str, str], ...]:
        """(template field, dataset column) of every field, parsed once (not per row)."""
        return tuple((name, self.column(name)) for name in self.fmt.fields())

    def empty_fields(self, row: dict[str, Any]) -> list[str]:
        """The optional fields (``format.prompt_no_input``'s, alpaca's ``input``) this row leaves empty
        (null or ""), all of them or none (then the row has every field)."""
        optional = self.optional_columns
        if not optional or any(row.get(column) not in (None, "") for _, column in optional):
            return []
        return [name for name, _ in optional]

    @cached_property
    def optional_columns(self) -> tuple[tuple[str, str], ...]:
        names = set(self.fmt.optional_fields())
        return tuple((name, column) for name, column in self.field_columns if name in names)

    def column(self, name: str | None) -> str | None:
        """The dataset column a format field names, through ``columns`` (None: the field is not set)."""
        return None if name is None else dict(self.columns).get(name, name)

    @cached_property
    def messages_column(self) -> str | None:
        """The dataset column of ``format.messages``."""
        return self.column(self.fmt.messages)

    @cached_property
    def tools_column(self) -> str | None:
        """The dataset column of ``format.tools``."""
        return self.column(self.fmt.tools)

    @cached_property
    def kwargs_column(self) -> str | None:
        """The dataset column of ``format.chat_template_kwargs_column``."""
        return self.column(self.fmt.chat_template_kwargs_column)

    def variables(self, row: dict[str, Any]) -> dict | None:
        """What the chat template gets for this row besides the messages and the special tokens:
        ``format.chat_template_kwargs``, the row's own (``format.chat_template_kwargs_column``, over
        those) and its tool definitions (``format.tools``); None: nothing."""
        tools = None if self.tools_column is None else check_tools(row.get(self.tools_column), self.tools_column)
        own = {}
        if self.kwargs_column is not None and self.chat_template:
            read = variables_read(template_for(self.chat_template, self.tool_chat_template, tools))
            own = check_row_kwargs(row.get(self.kwargs_column), self.kwargs_column, read)
        return {**self.fmt.chat_template_kwargs, **own, **({"tools": tools} if tools is not None else {})} or None

    def template(self, variables: dict | None) -> str | None:
        """The chat template a row with these ``variables`` is rendered by (:func:`template_for`)."""
        return template_for(self.chat_template, self.tool_chat_template, (variables or {}).get("tools"))

    @cached_property
    def plain_chatml(self):
        """Where conversations render once and the template is ChatML by string joins
        (pipeline/format/chat_once.py ``chatml_system``): the function that renders a row of plain messages
        straight from the row (``chat_once.plain_chatml``), else None."""
        if not (self.render_once and self.chat_template and self.fmt.messages is not None):
            return None
        from packtrain.pipeline.format import chat_once

        plain, default = chat_once.chatml_system(self.chat_template, self.bos_token, self.eos_token)
        return partial(chat_once.plain_chatml, system=self.fmt.system, default_system=default,
                       eos_token=self.eos_token) if plain else None

    def conversation(self, row: dict[str, Any]) -> tuple[Any, int]:
        """The row's messages and the index of the first one trained on (format_messages.conversation)."""
        fmt = self.fmt
        if fmt.completion is None and not (fmt.message_property_mappings or fmt.roles):
            return row.get(self.messages_column), 0  # OpenAI-style messages, as they are
        from packtrain.pipeline.format.format_messages import conversation

        return conversation(fmt, row, self.messages_column, self.column(fmt.completion))

    def documents(self, row: dict[str, Any]) -> list["Formatted"]:
        """The row's documents: one, or with ``format.each_assistant_turn`` one per assistant turn; the
        data's special-token text marked on them (:meth:`with_special_text`)."""
        return self.with_special_text(row, self.row_documents)

    def __call__(self, row: dict[str, Any]) -> "Formatted":
        return self.with_special_text(row, lambda r: [self.format_row(r)])[0]

    def with_special_text(self, row: dict[str, Any], make) -> list["Formatted"]:
        """``make(row)``, the row's documents, with where its data holds special-token text: refused
        (``refuse``), noted (``special``), or noted and marked to be encoded as text (``text``), found by
        formatting the row again with that text escaped (pipeline/format/special_text.py). The data is every
        column the format reads (fields, messages, tools, the row's template variables), never the
        format's own text."""
        special = self.special
        if special is None or special.pattern is None:
            return make(row)
        found = None
        for _, column in self.field_columns:
            if column in row and (found := special.find(row[column])) is not None:
                found = (column, *found)
                break
        if found is None:
            return make(row)
        column, path, token = found
        where = f"{where_in_row(column, path, {c: name for name, c in self.field_columns})} holds {token!r}"
        if special.mode == "refuse":
            raise SpecialTextRefused(where)
        docs = make(row)
        if special.mode == "special":
            return [dataclasses.replace(doc, special_text_at=where) for doc in docs]
        data = {name for _, name in self.field_columns}
        escaped = make({key: special.escape(value) if key in data else value for key, value in row.items()})
        return marked(docs, escaped, where, special)

    def row_documents(self, row: dict[str, Any]) -> list["Formatted"]:
        """:meth:`documents` without looking for special-token text."""
        if not self.fmt.each_assistant_turn:
            return [self.format_row(row)]
        from packtrain.pipeline.format.format_messages import render_each_turn

        messages, train_from = self.conversation(row)
        variables = self.variables(row)
        return render_each_turn(self.template(variables), self.fmt.system, messages, self.messages_column, self.bos_token,
                                self.eos_token, train_from, variables=variables)

    def format_row(self, row: dict[str, Any]) -> "Formatted":
        """The row's document (:meth:`__call__` without looking for special-token text)."""
        if self.fmt.messages is not None:
            messages, train_from = self.conversation(row)
            variables = self.variables(row)
            doc = self.plain_chatml(messages) if self.plain_chatml is not None and variables is None else None
            if doc is None:
                from packtrain.pipeline.format.chat_render import render_conversation

                doc = render_conversation(self.template(variables), self.fmt.system, messages, self.messages_column,
                                          self.bos_token, self.eos_token, once=self.render_once, variables=variables)
            if train_from:
                from packtrain.pipeline.format.format_messages import completion_spans

                doc = completion_spans(doc, messages[:train_from], self.messages_column)
            return doc
        empty = self.empty_fields(row)  # then format.prompt_no_input, and "" where the answer names them
        values = {name: "" if name in empty else text_value(row.get(column), name) for name, column in self.field_columns}
        template = self.fmt.prompt_no_input if empty else self.fmt.prompt
        try:
            prompt, answer = template.format_map(values), self.fmt.answer.format_map(values)
        except ValueError as e:
            raise spec_on_text(e, (template, self.fmt.answer), values) from None
        if not answer.strip():
            raise BadRow("the answer is empty")
        if self.fmt.style == "template":
            return Formatted(prompt + answer, ((len(prompt), len(prompt) + len(answer)),))
        from packtrain.pipeline.format.chat_render import render_chat

        head, full = render_chat(self.chat_template, self.fmt.system, prompt, answer, self.bos_token, self.eos_token,
                                 self.fmt.chat_template_kwargs)
        return Formatted(full, ((len(head), len(full)),), no_system=not self.fmt.system)


@dataclass(frozen=True)
class Formatted:
    """A document's text and its supervised character spans ``(start, stop)``, in order."""

    text: str
    spans: tuple[tuple[int, int], ...]
    rendered_once: bool = field(default=False, compare=False)
    """Made by one render of the chat template (pipeline/format/chat_once.py), a shortcut the build checks."""
    no_system: bool = field(default=False, compare=False)
    """A chat document with no system message, from the data or format.system: a template with a default
    system prompt put its own (counted by the build: pipeline/format/system_prompt.py)."""
    special_text: tuple[tuple[int, int], ...] = field(default=(), compare=False)
    """Character ranges of special-token text from the row's data, to encode as text
    (``build.special_tokens_in_text: text``; pipeline/format/special_text.py)."""
    special_text_at: str | None = field(default=None, compare=False)
    """Where the row's data holds special-token text (its first: the field and the token), in every mode;
    None: nowhere. Counted per source in the report."""
    split_text: str | None = field(default=None, compare=False)
    """The text whose hash puts the document in train or val, where not its own: every document of a
    conversation made one per assistant turn goes where its last one goes (format_messages.py)."""

    @property
    def prompt_chars(self) -> int:
        """Characters before the first supervised one."""
        return self.spans[0][0]

    @property
    def is_suffix(self) -> bool:
        """One span running to the end of the text: the prompt + answer shape."""
        return len(self.spans) == 1 and self.spans[0][1] == len(self.text)


def not_unicode(texts: list[str]) -> list[tuple[int, str]]:
    r"""(index, why) of each text that is not Unicode text: one holding a lone surrogate (JSON's
    ``"\ud800"`` escape without the other half of its UTF-16 pair, which ``json.loads`` keeps), which
    no tokenizer encodes (UTF-8 has no bytes for it: fastokens and the HF tokenizer both fail on it).
    A bad row, like an empty answer. Only the texts that are not ASCII (CPython knows that of a string
    without looking at it) are encoded, all at once where none has one.

    >>> [k for k, _ in not_unicode(["ok", "a\ud800b", "\U0001f600", "\ud83d\ude00"])]
    [1, 3]
    >>> not_unicode(["a\udfffb"])[0][1][:73]
    "the formatted text holds a lone surrogate '\\udfff' at character 1 (a JSON"
    """
    wide = [k for k, text in enumerate(texts) if not text.isascii()]
    try:
        "".join([texts[k] for k in wide]).encode("utf-8")
        return []
    except UnicodeEncodeError:
        pass
    out = []
    for k in wide:
        text = texts[k]
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            out.append((k, f"the formatted text holds a lone surrogate {text[e.start]!r} at character {e.start} (a JSON "
                           "\\u escape of half a UTF-16 pair), which is not Unicode text and no tokenizer encodes; "
                           "fix that value in the data"))
    return out
