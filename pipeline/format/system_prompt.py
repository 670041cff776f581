"""The chat template's default system prompt: the system message a template puts before a
conversation that has none (SmolLM2's and Qwen2.5's do: "You are a helpful AI assistant named
SmolLM, trained by Hugging Face"). The build counts the conversations that got it (each document
says whether it had a system message: pipeline/format/format.py ``Formatted.no_system``) and its summary
names ``format.system``, which puts another one there.

Found by rendering two conversations, one with a marker system message and one with none: where the
template puts the marker in the first, the second holds the default (if anything).
"""

from __future__ import annotations

from packtrain.pipeline.format.chat_template import compile_chat_template, template_variables

MARK, USER = "\x00system-mark\x00", "\x00user-mark\x00"


def default_system_prompt(template: str | None, bos_token: str | None, eos_token: str | None) -> str | None:
    """The text the template inserts as the system message of a conversation without one; None
    when it inserts none (or cannot render the probes)."""
    if not template:
        return None
    render = compile_chat_template(template).render
    tokens = {**template_variables(bos_token, eos_token), "add_generation_prompt": False}
    try:
        marked = render(messages=[{"role": "system", "content": MARK}, {"role": "user", "content": USER}], **tokens)
        plain = render(messages=[{"role": "user", "content": USER}], **tokens)
    except Exception:  # a template that refuses a probe: nothing to say
        return None
    if MARK not in marked or USER not in marked or USER not in plain:
        return None
    before, after = marked[:marked.index(USER)].split(MARK, 1)
    head = plain[:plain.index(USER)]
    if not (head.startswith(before) and head.endswith(after)) or len(head) < len(before) + len(after):
        return None
    return head[len(before):len(head) - len(after)] or None
