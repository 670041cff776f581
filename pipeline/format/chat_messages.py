"""The messages of a conversation as the chat template gets them: checked (:func:`check_messages`:
known roles, text content, no empty answer, null keys dropped), an answer's reasoning under all its
names (:func:`with_reasoning`), and refused where the template would drop a field silently
(:func:`check_fields_rendered`)."""

from __future__ import annotations

import json
from typing import Any

from packtrain.core.config_build import MESSAGE_ROLES
from packtrain.pipeline.format.chat_template import BadRow, compile_chat_template, template_variables


def present(value: Any) -> bool:
    """Whether a message field holds something: None, "", [] and {} are absent (Arrow and `datasets` give
    every message every key seen in the column, the missing ones as null)."""
    return value is not None and not (isinstance(value, (str, list, dict)) and not value)


def extra_fields(message: dict) -> list[str]:
    """The keys of ``message`` besides role and content that hold something."""
    return [key for key, value in message.items() if key not in ("role", "content") and present(value)]


def from_json_text(value: Any, column: str, expected: str) -> Any:
    """``value``, or what its JSON text holds (datasets keep conversations, tools and variables as JSON
    text too); text that is not JSON is a :class:`BadRow` saying what the column should hold."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (json.JSONDecodeError, RecursionError):  # nested past the parser's depth: not JSON it reads
        raise BadRow(f"{column!r} is text but not JSON; expected {expected}") from None


def check_tools(value: Any, column: str) -> list | None:
    """A row's tool definitions (``format.tools``) as the template gets them: a list of JSON-schema specs
    (dicts), or that list as JSON text, as TRL reads its ``tools`` column; None for null or blank text.
    An empty list stays one: ``apply_chat_template(tools=[])`` is not ``tools=None`` (Llama 3.1's and
    Mistral's templates render an empty tool block)."""
    if isinstance(value, str) and not value.strip():
        return None
    value = from_json_text(value, column, "a list of tool definitions (JSON schemas)")
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(tool, dict) for tool in value):
        raise BadRow(f"{column!r} is {type(value).__name__}, expected a list of tool definitions (JSON schemas, "
                     "{\"type\": \"function\", \"function\": {...}})")
    return value


def check_row_kwargs(value: Any, column: str, read: frozenset[str]) -> dict:
    """A row's own chat-template variables (``format.chat_template_kwargs_column``): a mapping, or its JSON
    text, of variables the template ``read``s, none of those the build sets itself; {} for null or blank."""
    from packtrain.core.config_build import RESERVED_TEMPLATE_VARIABLES

    if isinstance(value, str) and not value.strip():
        return {}
    value = from_json_text(value, column, "a mapping of chat template variables")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRow(f"{column!r} is {type(value).__name__}, expected a mapping of chat template variables "
                     "(e.g. {\"enable_thinking\": false})")
    for name in value:
        if name in RESERVED_TEMPLATE_VARIABLES:
            raise BadRow(f"{column!r} sets {name!r}, which is {RESERVED_TEMPLATE_VARIABLES[name]}; remove it from the rows")
        if name not in read:
            raise BadRow(f"{column!r} sets {name!r}, which the chat template never reads, so it would change nothing; "
                         "remove it from the rows, or use the chat template it was written for")
    return value


def check_fields_rendered(template: str, messages: list[dict], column: str, bos_token: str | None = None,
                          eos_token: str | None = None, variables: dict | None = None,
                          ends: tuple[int, ...] | None = None) -> None:
    """Refuse (:class:`BadRow`) a conversation with a message field the chat template does not render:
    a field is rendered when the conversation renders differently without it. Training on such a row
    would silently drop the field (SmolLM2's template ignores ``tool_calls``: the assistant's tool call
    would become an empty answer). Only rows with fields besides role and content are rendered here.
    ``ends``: the row's documents are the conversations ``messages[:end]`` (``format.each_assistant_turn``),
    and a field is rendered when one of the documents holding its message renders differently without
    it (Qwen3's template renders an answer's ``reasoning_content`` while it is the last turn only: in
    that turn's own document); None: one document, the whole conversation.

    >>> ignores = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\\n{% endfor %}"
    >>> try:
    ...     check_fields_rendered(ignores, [{"role": "user", "content": "hi", "name": "ann"},
    ...                                     {"role": "assistant", "content": "ok", "tool_calls": []}], "messages")
    ... except BadRow as e:
    ...     print(e)
    'messages' message 0 (user) has a field 'name' that the chat template does not render, so it would be dropped silently; remove the field from the data or use a chat template that renders it
    >>> last_only = ("{% for m in messages %}{{ m['content'] }}{% if loop.last %}{{ m.get('reasoning_content', '') }}"
    ...              "{% endif %}|{% endfor %}")
    >>> twice = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": "r"},
    ...          {"role": "user", "content": "q2"}, {"role": "assistant", "content": "b"}]
    >>> check_fields_rendered(last_only, twice, "messages", ends=(2, 4))  # rendered in the document of its turn
    >>> check_fields_rendered(last_only, twice, "messages")
    Traceback (most recent call last):
    ...
    packtrain.pipeline.format.chat_template.BadRow: 'messages' message 1 (assistant) has a field 'reasoning_content' that the chat template does not render, so it would be dropped silently; remove the field from the data or use a chat template that renders it
    """
    fields = list(dict.fromkeys((i, REASONING if key in REASONING else (key,))
                                for i, message in enumerate(messages) for key in extra_fields(message)))
    if not fields:
        return
    compiled = compile_chat_template(template)
    extra = template_variables(bos_token, eos_token, variables)
    documents: dict[int, str] = {}

    def render(turns: list[dict]) -> str:
        return compiled.render(messages=turns, add_generation_prompt=False, **extra)

    def document(end: int) -> str:  # the conversation through message end - 1, rendered once
        if end not in documents:
            documents[end] = render(messages[:end])
        return documents[end]

    try:
        document(len(messages))
    except Exception:  # the template fails on the row: rendering it says why (a bad row, or the error)
        return
    for i, keys in fields:  # a message's reasoning goes under all its names at once (with_reasoning)
        key = keys[0] if len(keys) == 1 else "reasoning_content"
        without = messages[:i] + [{k: v for k, v in messages[i].items() if k not in keys}] + messages[i + 1:]
        holding = [end for end in ends or () if end > i] or [len(messages)]  # the documents holding message i
        try:
            ignored = all(render(without[:end]) == document(end) for end in holding)
        except Exception:  # the template needs the field: it is rendered (or looked at)
            ignored = False
        if ignored:
            raise BadRow(f"{column!r} message {i} ({messages[i]['role']}) has a field {key!r} that the chat template "
                         "does not render, so it would be dropped silently; remove the field from the data or use "
                         "a chat template that renders it")


def check_tools_rendered(template: str, messages: list[dict], variables: dict, bos_token: str | None = None,
                         eos_token: str | None = None) -> None:
    """Refuse (:class:`BadRow`) a row whose tools (``variables["tools"]``, where set) the chat template
    does not render (it renders the conversation the same without them): training on it would drop
    them silently."""
    if not variables.get("tools"):  # none, or an empty list: no tool to drop
        return
    compiled = compile_chat_template(template)
    extra = {"messages": messages, "add_generation_prompt": False,
             **template_variables(bos_token, eos_token, variables)}
    try:
        ignored = compiled.render(**extra) == compiled.render(**{**extra, "tools": None})
    except Exception:  # the template fails on the row: rendering it says why (a bad row, or the error)
        return
    if ignored:
        raise BadRow("the chat template does not render the row's tools (format.tools), so they would be dropped "
                     "silently; use a chat template that renders tools, or remove format.tools")


ROLES = MESSAGE_ROLES


def check_messages(messages: Any, column: str) -> list[dict]:
    """A list of ``{"role", "content"}`` dicts with known roles (null keys dropped); a JSON string of one is parsed."""
    messages = from_json_text(messages, column, "a list of {\"role\", \"content\"} messages")
    if not isinstance(messages, list) or not messages:
        raise BadRow(f"{column!r} is {type(messages).__name__ if messages else 'empty'}, expected a non-empty list of "
                     "{\"role\", \"content\"} messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise BadRow(f"{column!r} message {i} has no role among {', '.join(ROLES)} (got {message!r:.80}); map the "
                         "data's keys and roles with format.message_property_mappings and format.roles (ShareGPT's: "
                         "format.preset: sharegpt)")
        content = message.get("content")
        if isinstance(content, list):  # OpenAI's content parts: apply_chat_template passes them to the template as is
            raise BadRow(f"{column!r} message {i}: content is a list of {len(content)} parts, expected text (the chat "
                         "template renders text; SmolLM2's fails on a list, Llama 3's writes its Python text); join "
                         "the parts' text into one string in the data")
        if content is not None and not isinstance(content, str):
            raise BadRow(f"{column!r} message {i}: content is {type(content).__name__}, expected text")
        if content is None and not message.get("tool_calls"):
            raise BadRow(f"{column!r} message {i} ({message['role']}) has neither content nor tool_calls")
        if message["role"] == "assistant" and not (content or "").strip() and not extra_fields(message):
            raise BadRow(f"{column!r} message {i} (assistant) is empty, and an empty answer would be trained on; "
                         "fill in its content or drop the turn")
    # parquet/arrow give every message every key seen in the column, missing ones as null: drop
    # those, so a template's "is defined" tests see the message as it was written
    return [with_reasoning({key: value for key, value in message.items() if value is not None}) for message in messages]


REASONING = ("reasoning_content", "thinking", "reasoning")  # the names of an answer's reasoning, as transformers reads them


def with_reasoning(message: dict) -> dict:
    """The message with its reasoning (under any of :data:`REASONING`) also as ``reasoning_content``
    (Qwen3's templates read it) and ``thinking`` (gpt-oss's), as ``apply_chat_template`` passes it.

    >>> with_reasoning({"role": "assistant", "content": "4", "reasoning": "2+2"})
    {'thinking': '2+2', 'role': 'assistant', 'content': '4', 'reasoning': '2+2', 'reasoning_content': '2+2'}
    """
    reasoning = next((message[key] for key in REASONING if message.get(key) is not None), None)
    return message if reasoning is None else {"thinking": reasoning, **message, "reasoning_content": reasoning}
