"""Formatting: one dataset row -> (prompt text, full text). Pure functions, no tokenizer.

The prompt is everything the model reads but is not trained to produce; the full text is the
prompt followed by the answer. Two styles (``format.style``)::

    template   prompt = format.prompt.format(**row)     "### Question\\nHow many?\\n### SQL\\n"
               full   = prompt + format.answer.format(**row)    ... + "SELECT count(*) FROM t"

    chat       the tokenizer's chat template over [system?, user, assistant]:
               prompt = render(system?, user; add_generation_prompt=True)
               full   = render(system?, user, assistant)
               and the full text must start with the prompt (checked per row)

Template fields name dataset columns, through ``sources[i].columns`` when the names differ.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from packtrain.core.config import FormatConfig


class BadRow(ValueError):
    """A row that cannot become a training document; the message says why."""


@dataclass(frozen=True)
class RowFormatter:
    fmt: FormatConfig
    columns: tuple[tuple[str, str], ...] = ()
    """(template field, dataset column) pairs; fields not listed read the column of the same name."""
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None

    def needed_columns(self) -> list[str]:
        mapping = dict(self.columns)
        return [mapping.get(name, name) for name in self.fmt.fields()]

    def __call__(self, row: dict[str, Any]) -> tuple[str, str]:
        mapping = dict(self.columns)
        values = {name: text_value(row.get(mapping.get(name, name)), name) for name in self.fmt.fields()}
        prompt = self.fmt.prompt.format_map(values)
        answer = self.fmt.answer.format_map(values)
        if not answer.strip():
            raise BadRow("the answer is empty")
        if self.fmt.style == "template":
            return prompt, prompt + answer
        return render_chat(self.chat_template, self.fmt.system, prompt, answer, self.bos_token, self.eos_token)


def text_value(value: Any, name: str) -> str:
    """A field's text: strings as they are, numbers printed, lists/objects as compact JSON."""
    if value is None:
        raise BadRow(f"field {name!r} is null")
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    raise BadRow(f"field {name!r} has type {type(value).__name__}, expected text")


def render_chat(
    template: str | None,
    system: str | None,
    prompt: str,
    answer: str,
    bos_token: str | None = None,
    eos_token: str | None = None,
) -> tuple[str, str]:
    if not template:
        raise BadRow("format.style is chat but the tokenizer has no chat_template; use style: template")
    import jinja2

    try:
        compiled = compile_chat_template(template)
    except jinja2.TemplateError as e:
        raise BadRow(f"the chat template does not compile: {e}") from None
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    extra = {"bos_token": bos_token or "", "eos_token": eos_token or ""}
    head = compiled.render(messages=messages, add_generation_prompt=True, **extra)
    full = compiled.render(messages=messages + [{"role": "assistant", "content": answer}],
                           add_generation_prompt=False, **extra)
    if not full.startswith(head):
        raise BadRow("the chat template does not render the prompt as a prefix of prompt + answer")
    if eos_token and full.rstrip().endswith(eos_token):
        full = full.rstrip()  # the turn ends with EOS (Qwen-Instruct's <|im_end|>): train to stop there
    return head, full


@lru_cache(maxsize=4)
def compile_chat_template(template: str):
    """Compile a chat template the way transformers does (sandboxed Jinja, trim/lstrip blocks)."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise BadRow(f"chat template: {message}")

    def tojson(value, indent=None, ensure_ascii=False):
        return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)
