"""Conversations in other layouts than OpenAI's ``messages`` (docs/DATASETS.md), made into the
messages pipeline/format/chat_render.py renders:

- other keys and role names (ShareGPT ``{"from": "human", "value": "Hi"}``), through
  ``format.message_property_mappings`` and ``format.roles`` (:func:`map_messages`);
- a prompt and a completion (TRL's conversational ``prompt``/``completion`` columns): one
  conversation, the loss on the completion's assistant turns only (``format.completion``,
  :func:`completion_spans`);
- one document per assistant turn (``format.each_assistant_turn``, :func:`render_each_turn`),
  for templates that render earlier turns otherwise than the last one (Qwen3 drops earlier
  ``<think>`` blocks)::

      turn 1: <|im_start|>user\\nA<|im_end|>\\n<|im_start|>assistant\\n⟦<think>\\nr1\\n</think>\\n\\nB<|im_end|>⟧
      turn 2: <|im_start|>user\\nA<|im_end|>\\n<|im_start|>assistant\\nB<|im_end|>\\n<|im_start|>user\\nC<|im_end|>\\n
              <|im_start|>assistant\\n⟦<think>\\nr2\\n</think>\\n\\nD<|im_end|>⟧

  each as the template renders the conversation up to that turn (its history as the model sees
  it when it generates that turn); the history's tokens are repeated in every later document.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from packtrain.pipeline.format.chat_messages import (check_fields_rendered, check_messages, check_tools_rendered,
                                              from_json_text)
from packtrain.pipeline.format.chat_render import no_turn_start, template_errors_are_bad_rows, turn_head
from packtrain.pipeline.format.chat_template import BadRow, compile_chat_template, template_variables
from packtrain.pipeline.format.format import Formatted


def parsed(messages: Any, column: str) -> Any:
    """A JSON string of messages parsed; anything else as it is (check_messages judges it)."""
    return from_json_text(messages, column, "a list of messages")


def map_messages(messages: Any, column: str, mappings: dict[str, str], roles: dict[str, list[str]]) -> Any:
    """The messages with ``role`` and ``content`` read from the keys ``mappings`` names and each role
    value renamed by ``roles`` (other keys kept as they are).

    >>> map_messages([{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}], "conversations",
    ...              {"role": "from", "content": "value"}, {"user": ["human"], "assistant": ["gpt"]})
    [{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': 'Yo'}]
    >>> try:
    ...     map_messages([{"from": "bot", "value": "Yo"}], "c", {"role": "from"}, {"assistant": ["gpt"]})
    ... except BadRow as e:
    ...     print(e)
    'c' message 0 has the role 'bot', which format.roles does not map (assistant: [gpt]); add it to the list of the role it stands for in format.roles
    """
    messages = parsed(messages, column)
    if not isinstance(messages, list):
        return messages
    role_key, content_key = mappings.get("role", "role"), mappings.get("content", "content")
    rename = {value: role for role, values in roles.items() for value in values}
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            out.append(message)  # check_messages says why it is bad
            continue
        if message.get(role_key) is None:
            raise BadRow(f"{column!r} message {i} has no {role_key!r} key (got {message!r:.80}); set "
                         "format.message_property_mappings role: to the key holding the role")
        role = message[role_key]
        if rename:
            if not isinstance(role, str) or role not in rename:
                known = ", ".join(f"{r}: [{', '.join(v)}]" for r, v in roles.items())
                raise BadRow(f"{column!r} message {i} has the role {role!r}, which format.roles does not map ({known}); "
                             "add it to the list of the role it stands for in format.roles")
            role = rename[role]
        if content_key not in message and not message.get("tool_calls"):
            raise BadRow(f"{column!r} message {i} has no {content_key!r} key (got {message!r:.80}); set "
                         "format.message_property_mappings content: to the key holding the text")
        rest = {key: value for key, value in message.items() if key not in (role_key, content_key)}
        out.append({**rest, "role": role, "content": message.get(content_key)})
    return out


def conversation(fmt, row: dict, column: str, completion_column: str | None) -> tuple[Any, int]:
    """The messages of ``row`` (a FormatConfig ``fmt``'s conversation, in ``column``), mapped by
    ``format.message_property_mappings`` and ``format.roles``, the prompt's then the completion's with
    ``format.completion``; and the index of the first message trained on."""
    mapped = fmt.message_property_mappings or fmt.roles
    if completion_column is None:
        messages = row.get(column)
        return (map_messages(messages, column, fmt.message_property_mappings, fmt.roles) if mapped else messages), 0
    prompt, completion = prompt_and_completion(row, column, completion_column)
    if mapped:
        prompt = map_messages(prompt, column, fmt.message_property_mappings, fmt.roles)
        completion = map_messages(completion, completion_column, fmt.message_property_mappings, fmt.roles)
    return prompt + completion, len(prompt)


def completion_spans(doc: Formatted, prompt: list, column: str) -> Formatted:
    """``doc`` (the prompt's messages and the completion's, rendered as one conversation) with the
    spans of the prompt's assistant turns dropped: the loss is on the completion only."""
    before = sum(isinstance(m, dict) and m.get("role") == "assistant" for m in prompt)
    if len(doc.spans) <= before:
        raise BadRow(f"the completion in {column!r} has no assistant turn, so nothing to train on")
    return dataclasses.replace(doc, spans=doc.spans[before:])


def prompt_and_completion(row: dict, prompt_column: str, completion_column: str) -> tuple[list, list]:
    """The prompt's and the completion's messages of a conversational prompt/completion row."""
    out = []
    for column in (prompt_column, completion_column):
        try:
            value = parsed(row.get(column), column)
        except BadRow:
            value = row.get(column)
        if isinstance(value, str):
            raise BadRow(f"{column!r} is text, not a list of messages: plain prompt/completion strings need "
                         "format.style: template (style chat reads conversational ones)")
        out.append(value)
        if not isinstance(value, list) or not value:
            raise BadRow(f"{column!r} is {type(value).__name__ if value else 'empty'}, expected a non-empty list "
                         "of messages")
    return out[0], out[1]


def render_each_turn(template: str | None, system: str | None, messages: Any, column: str,
                     bos_token: str | None = None, eos_token: str | None = None, train_from: int = 0,
                     variables: dict | None = None) -> list[Formatted]:
    """One document per assistant turn (from message ``train_from`` on): the conversation up to it
    rendered with the generation prompt, then through it; the loss on the turn and its end-of-turn
    token. Every document of the conversation goes to the split of its last one (``split_text``), so
    no turn's history is validated on while trained on; the last one alone counts the conversation as
    one without a system message (``no_system``)."""
    if not template:
        raise BadRow("format.messages needs the tokenizer's chat_template, and it has none")
    messages = check_messages(messages, column)
    if system and messages[0]["role"] != "system":
        messages, train_from = [{"role": "system", "content": system}] + messages, train_from + 1
    extra = template_variables(bos_token, eos_token, variables)
    docs = []
    with template_errors_are_bad_rows():
        ends = tuple(k + 1 for k in range(train_from, len(messages)) if messages[k]["role"] == "assistant")
        check_fields_rendered(template, messages, column, bos_token, eos_token, variables, ends)
        if variables:
            check_tools_rendered(template, messages, variables, bos_token, eos_token)
        compiled = compile_chat_template(template)

        def render(turns: list[dict], generation_prompt: bool) -> str:
            return compiled.render(messages=turns, add_generation_prompt=generation_prompt, **extra)

        for k in range(train_from, len(messages)):
            if messages[k]["role"] != "assistant":
                continue
            through = render(messages[: k + 1], False)
            head = turn_head(render, messages, k, through, column)
            stop = len(through.rstrip())  # the end-of-turn token is supervised, the newline after it is not
            if not through.startswith(head):
                raise BadRow(no_turn_start(k, column) if k else
                             f"the chat template does not render assistant turn 0 of {column!r} after its generation "
                             "prompt, so its span cannot be found; open the conversation with a system or user "
                             "message (format.system adds one)")
            if stop <= len(head) or not through[len(head):stop].strip():
                raise BadRow(f"the chat template renders no text for assistant turn {k} of {column!r}")
            text = through.rstrip() if eos_token and through.rstrip().endswith(eos_token) else through
            docs.append(Formatted(text, ((len(head), stop),), no_system=messages[0]["role"] != "system"))
    if not docs:
        raise BadRow(f"the conversation in {column!r} has no assistant turn to train on")
    # the conversation counts once among those without a system message (pipeline/format/system_prompt.py)
    return [dataclasses.replace(doc, split_text=docs[-1].text, no_system=doc.no_system and doc is docs[-1])
            for doc in docs]
