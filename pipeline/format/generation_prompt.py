"""What a trained expert is prompted with at generation time (``packtrain generate`` / ``chat``): the
text the build put before the answer, made from the user's text by the same format the run trained
on, so the model sees the tokens it learned from.

- ``format.style: template``: ``format.prompt`` with its fields filled (the user's text fills the one
  field not given as ``--field name=value``); the document starts with the tokenizer's prefix ids
  (Llama's BOS), as in the build.
- ``format.style: chat``: the chat template's rendering of ``format.system`` and the user turn made
  from ``format.prompt``, up to where the assistant's answer starts (``add_generation_prompt``).
- ``format.messages``: the chat template's rendering of the conversation so far (``format.system``,
  then the user and assistant turns, the last one the user's), ending where the next answer starts;
  with ``format.chat_template_kwargs`` and, for experts trained with ``format.tools``, the tools given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from packtrain.core.config_build import FormatConfig, template_fields
from packtrain.pipeline.format.chat_render import render_chat, template_errors_are_bad_rows
from packtrain.pipeline.format.chat_template import BadRow, compile_chat_template, template_variables


class PromptError(ValueError):
    """The user's text and fields do not make a prompt for this expert's format; the message says how."""


@dataclass(frozen=True)
class GenerationPrompt:
    text: str
    prefix_ids: tuple[int, ...]  # token ids before the text's own (the tokenizer's BOS for template experts)


def is_conversation(fmt: FormatConfig) -> bool:
    """Experts trained on whole conversations keep the chat's history; the others answer one prompt."""
    return fmt.messages is not None


def prompt_template(fmt: FormatConfig, fields: Mapping[str, str]) -> str:
    """``format.prompt``, or ``format.prompt_no_input`` where no ``--field`` gives a field it leaves out
    (alpaca asked without ``--field input=...``), as the build chose per row."""
    optional = fmt.optional_fields()
    return fmt.prompt_no_input if optional and not any(fields.get(name) for name in optional) else fmt.prompt


def template_values(fmt: FormatConfig, text: str, fields: Mapping[str, str]) -> dict[str, str]:
    """The prompt template's fields (:func:`prompt_template`'s): ``fields`` as given, the text in the one
    field left::

        >>> fmt = FormatConfig(prompt="### Schema\\n{context}\\n\\n### Question\\n{question}\\n")
        >>> template_values(fmt, "How many?", {"context": "CREATE TABLE t (a INT)"})
        {'context': 'CREATE TABLE t (a INT)', 'question': 'How many?'}
    """
    needed = list(dict.fromkeys(template_fields(prompt_template(fmt, fields))))
    unknown = sorted(set(fields) - set(needed) - set(template_fields(fmt.prompt)))
    if unknown:
        raise PromptError(f"--field {unknown[0]}: format.prompt has no {{{unknown[0]}}} (its fields: "
                          f"{', '.join(needed) or 'none'})")
    left = [name for name in needed if name not in fields]
    if len(left) > 1:
        raise PromptError(f"format.prompt needs {', '.join('{' + n + '}' for n in left)}: give all but one with "
                          f"--field NAME=VALUE (the text fills the last one left), e.g. --field {left[0]}=...")
    values = dict(fields)
    if left:
        values[left[0]] = text
    elif text:
        raise PromptError("every field of format.prompt is given with --field: the text has no field to fill; "
                          "leave one field out")
    return values


def generation_prompt(fmt: FormatConfig, turns: Sequence[dict], fields: Mapping[str, str], chat_template: str | None,
                      bos_token: str | None, eos_token: str | None, prefix_ids: Sequence[int],
                      tools: list | None = None) -> GenerationPrompt:
    """The prompt for the next answer. ``turns``: the conversation so far as ``{"role", "content"}``
    messages ending with the user's; experts that are not conversations read only the last one.
    ``tools``: the tool definitions to prompt with (experts trained with ``format.tools``), with
    ``chat_template`` the one for them (:func:`packtrain.pipeline.format.chat_template.template_for`)."""
    text = turns[-1]["content"]
    if tools is not None and fmt.tools is None:
        raise PromptError("--tools: this expert was not trained with tools (its format.tools is not set); leave "
                          "--tools out")
    try:
        if is_conversation(fmt):
            variables = {**fmt.chat_template_kwargs, **({"tools": tools} if tools is not None else {})}
            return GenerationPrompt(render_generation(chat_template, fmt.system, turns, bos_token, eos_token,
                                                      variables), ())
        prompt = prompt_template(fmt, fields).format_map(template_values(fmt, text, fields))
        if fmt.style == "template":
            return GenerationPrompt(prompt, tuple(prefix_ids))
        head, _ = render_chat(chat_template, fmt.system, prompt, "x", bos_token, eos_token, fmt.chat_template_kwargs)
        return GenerationPrompt(head, ())
    except BadRow as e:
        raise PromptError(str(e)) from None


def render_generation(template: str | None, system: str | None, turns: Sequence[dict], bos_token: str | None,
                      eos_token: str | None, variables: dict | None = None) -> str:
    """The chat template's rendering of ``system`` and ``turns`` with the generation prompt (and
    ``variables``: format.chat_template_kwargs, as the build rendered with them)."""
    if not template:
        raise BadRow("this expert trains on conversations but the tokenizer has no chat_template")
    messages = ([{"role": "system", "content": system}] if system else []) + list(turns)
    with template_errors_are_bad_rows():
        return compile_chat_template(template).render(messages=messages, add_generation_prompt=True,
                                                      **template_variables(bos_token, eos_token, variables))
