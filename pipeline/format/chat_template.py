"""Chat templates compiled the way transformers compiles them, and the error a row that cannot
become a training document raises (:class:`BadRow`, also what a template's ``raise_exception`` raises).

The template sees what ``apply_chat_template`` gives it (transformers' ``_compile_jinja_template`` and
``render_jinja_template``): ``raise_exception``, ``strftime_now`` (Llama 3.2's and gpt-oss's "Today
Date"), a ``tojson`` that does not escape HTML and takes ``indent``/``separators``/``sort_keys``, and
``tools`` and ``documents`` defined as none (Mistral's ``tools is not none``)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from datetime import date, datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Iterator

from packtrain.core.config_build import RESERVED_TEMPLATE_VARIABLES
from packtrain.pipeline.errors import BuildError

if TYPE_CHECKING:
    from packtrain.pipeline.encode.tokenizer_info import TokenizerInfo


class BadRow(ValueError):
    """A row that cannot become a training document; the message says why."""


_DAY: date | None = None  # the build's day while it renders (rendered_on), else today


def strftime_now(format: str) -> str:
    """Now as the template formats it, as transformers renders it: a template that calls this makes
    documents of the day they are built (pipeline/orchestrate/build.py puts the day in the build id), the day
    :func:`rendered_on` pins while a build renders."""
    now = datetime.now()
    return (now.replace(year=_DAY.year, month=_DAY.month, day=_DAY.day) if _DAY else now).strftime(format)


@contextmanager
def rendered_on(day: str | None) -> Iterator[None]:
    """Render ``strftime_now`` as of ``day`` (YYYY-MM-DD: the day the build planned, its id's
    ``chat_date``) in this block, so a build that runs past midnight renders every row with the day its
    id names (None: today, as it comes)."""
    global _DAY
    previous, _DAY = _DAY, (date.fromisoformat(day) if day else None)
    try:
        yield
    finally:
        _DAY = previous


def template_variables(bos_token: str | None, eos_token: str | None, variables: dict | None = None) -> dict:
    """What a render gets besides the messages and ``add_generation_prompt``: the special tokens as
    text, "" where the tokenizer has none (as transformers passes them), and the row's ``variables``
    (its tools, format.chat_template_kwargs)."""
    return {"bos_token": bos_token or "", "eos_token": eos_token or "", **(variables or {})}


def template_for(chat_template: str | None, tool_chat_template: str | None, tools: list | None) -> str | None:
    """The template a conversation is rendered by: the tokenizer's ``tool_use`` one where it has one and
    the conversation has tools (an empty list included), else its default one, as ``apply_chat_template``
    picks them (transformers' ``get_chat_template``)."""
    return tool_chat_template if tool_chat_template and tools is not None else chat_template


@lru_cache(maxsize=8)
def variables_read(template: str) -> frozenset[str]:
    """The variables ``template`` reads that it does not set itself (a variable it never reads changes
    nothing it renders)."""
    from jinja2 import meta

    compiled = compile_chat_template(template)
    return frozenset(meta.find_undeclared_variables(compiled.environment.parse(template)))


def uses_the_date(template: str | None) -> bool:
    """Whether the template may render today's date (calls ``strftime_now``)."""
    return bool(template) and "strftime_now" in template


@lru_cache(maxsize=4)
def compile_chat_template(template: str):
    """Compile a chat template the way transformers does (sandboxed Jinja, trim/lstrip blocks)."""
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationMarkers(Extension):
        """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask markers) renders its
        body: the spans are found by rendering prefixes, with or without the markers."""

        tags = {"generation"}

        def parse(self, parser):
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    def raise_exception(message: str):
        raise BadRow(f"the chat template refuses this conversation ({message}); change the rows to what it accepts, or "
                     "point model.tokenizer at a tokenizer whose chat_template renders them")

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols, GenerationMarkers])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, tools=None, documents=None)
    return env.from_string(template)


def check_chat_template(tokenizer: TokenizerInfo, kwargs: dict) -> None:
    """format.style chat needs a chat template that compiles, and reads every variable of
    ``format.chat_template_kwargs`` (one it never reads changes nothing: a misspelt name, or another
    model's); say so before tokenizing anything."""
    import jinja2

    if not tokenizer.chat_template:
        raise BuildError(f"format.style is chat but {tokenizer.directory} has no chat_template "
                         "(tokenizer_config.json or chat_template.jinja); use format.style: template")
    read: set[str] = set()
    for template in tokenizer.chat_templates:
        try:
            read |= variables_read(template)
        except jinja2.TemplateError as e:
            raise BuildError(f"the chat template of {tokenizer.directory} does not compile: {e}") from None
    unread = sorted(set(kwargs) - read)
    if unread:
        others = sorted(read - set(RESERVED_TEMPLATE_VARIABLES) - {"raise_exception", "strftime_now"})
        raise BuildError(f"format.chat_template_kwargs: the chat template of {tokenizer.directory} never reads "
                         f"{unread[0]!r}, so it would change nothing; remove it or correct its name (the template "
                         f"reads: {', '.join(others) or 'no other variable'})")
