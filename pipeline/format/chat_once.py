"""Conversations rendered once: every assistant span read off one render of the chat template.

The exact way (chat_render.render_turns) renders the template 2k+1 times for a conversation of k
assistant turns: the whole, and for each turn the conversation up to it with the generation prompt
(where the turn starts) and through it (where it ends). Here the template renders the conversation
once, with a marker pair (two private-use characters) around each assistant turn's content::

    <|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n\\U000F0000Hello\\U000F0001<|im_end|>\\n
    -> text without the markers; turn k starts at its opening marker and ends at its closing marker
       plus the template's turn end ("<|im_end|>"), the text the exact way supervises after the content

A ChatML template (SmolLM2's, Qwen2.5's) whose probes string joins render exactly is rendered
without Jinja at all (:func:`chatml`), for conversations of roles and text alone; a row of such
plain messages is joined straight from the row (:func:`plain_chatml`, called by ``RowFormatter``), its
checks folded into the one pass (they are what ``chat_messages.check_messages`` would find of it).

It is a shortcut, so it is used only where it is checked to give what the exact way gives:

- per template, :func:`turn_end` renders probe conversations both ways and learns the turn end; a
  template whose spans or text differ on them (one that rewrites content, drops earlier turns'
  reasoning, renders a generation prompt other than the turn's start) is never rendered once;
- per row, anything unexpected (a marker character in the data, markers not found in order, a turn
  end that is not there, an assistant turn with no text content, a conversation that opens with an
  assistant turn: the exact way reads its start off the template's render of no message at all,
  which a template with a default system prompt renders without it) is left to the exact way;
- per build, the exactness check renders the checked documents the exact way too and compares
  (pipeline/encode/worker.py); a difference drops the shortcut for that template, remembered.
"""

from __future__ import annotations

from functools import lru_cache

from packtrain.pipeline.format.chat_render import render_turns
from packtrain.pipeline.format.chat_template import BadRow, compile_chat_template, template_variables
from packtrain.pipeline.format.format import Formatted

OPEN, CLOSE = "\U000f0000", "\U000f0001"
VERSION = 3  # raise when what is rendered once changes (part of the remembered refusals' key)

PROBES = (
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
    [{"role": "system", "content": "You write SQL."}, {"role": "user", "content": "Rows of t?\n"},
     {"role": "assistant", "content": "SELECT *\nFROM t;"}, {"role": "user", "content": " And x "},
     {"role": "assistant", "content": "```sql\nSELECT x FROM t\n```\n"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b "}, {"role": "user", "content": "c"},
     {"role": "assistant", "content": "\nd"}, {"role": "user", "content": "e"}, {"role": "assistant", "content": "f"}],
    # edges a template may look at: empty content, trailing punctuation (markers hide both from it)
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}, {"role": "user", "content": "y."},
     {"role": "assistant", "content": "done..."}],
    # tool results (Qwen2.5 renders them as a user turn), roles that do not alternate, a late system message
    # (Cohere2's gathers every system message before the conversation), a conversation ending with a user turn
    [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "calling"},
     {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "It is sunny."}],
    [{"role": role, "content": content} for role, content in (
        ("user", "a"), ("user", "b"), ("assistant", "c"), ("system", "s"), ("user", "d"), ("assistant", "e"),
        ("assistant", "f"))],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
    # a long conversation, for templates that render turns by their index
    [m for i in range(8) for m in ({"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"})],
)

# content templates are known to treat specially (earlier turns' reasoning dropped, content trimmed,
# special-token text): a template that does must not be rendered by string joins
CONTENT_PROBES = (
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\nb"},
     {"role": "user", "content": " c\n"}, {"role": "assistant", "content": "<think>s</think>d "}],
    [{"role": "system", "content": " s "}, {"role": "user", "content": "<|im_start|>x<|im_end|>"},
     {"role": "assistant", "content": "\n\ny\t"}],
    # whitespace at both edges of every turn, first, middle and last (a template that strips some turns only)
    [{"role": role, "content": content} for role, content in (
        ("system", "\n s \n"), ("user", "\n u \n"), ("assistant", "\n a \n"), ("user", "\tu\t"),
        ("assistant", " a\n\n"), ("user", " u "), ("assistant", "\n\na \t"))],
)


def marked(messages: list[dict]) -> list[dict] | None:
    """The messages with each assistant turn's content between the markers; None where a turn has no
    text content (tool calls alone) or a message already holds a marker character."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) and (OPEN in content or CLOSE in content):
            return None
        if message["role"] == "assistant":
            if not isinstance(content, str):
                return None
            message = {**message, "content": OPEN + content + CLOSE}
        out.append(message)
    return out


def unmark(text: str, turns: int) -> tuple[str, list[tuple[int, int]]] | None:
    """The text without the markers and each turn's (opening, closing) positions in it; None unless
    there are exactly ``turns`` pairs, each opening before its closing."""
    if text.count(OPEN) != turns or text.count(CLOSE) != turns:
        return None
    pieces, positions, at, removed = [], [], 0, 0
    for _ in range(turns):
        start = text.find(OPEN, at)
        stop = text.find(CLOSE, start + 1)
        if stop < 0 or text.find(OPEN, start + 1, stop) >= 0:
            return None
        pieces += [text[at:start], text[start + 1 : stop]]
        positions.append((start - removed, stop - removed - 1))
        at, removed = stop + 1, removed + 2
    pieces.append(text[at:])
    return "".join(pieces), positions


def spans_once(template: str, messages: list[dict], end: str, bos_token: str | None,
               eos_token: str | None) -> tuple[str, tuple[tuple[int, int], ...]] | None:
    """(text, spans) from one render, ``end`` being the template's turn end; None: ask the exact way."""
    wrapped = marked(messages)
    if wrapped is None:
        return None
    turns = sum(m["role"] == "assistant" for m in messages)
    render = compile_chat_template(template).render
    tokens = {**template_variables(bos_token, eos_token), "add_generation_prompt": False}
    try:
        rendered = render(messages=wrapped, **tokens)
        plain = render(messages=messages, **tokens)
    except Exception:  # the markers upset the template (or the row does): the exact way says what it makes of it
        return None
    found = unmark(rendered, turns)
    if found is None or found[0] != plain:  # the markers changed what the template does with the content
        return None  # (it strips or splits an earlier turn's, or the last one's, in a way no probe showed)
    text, positions = found
    if any(text[close : close + len(end)] != end for _, close in positions):
        return None
    if eos_token and text.rstrip().endswith(eos_token):
        text = text.rstrip()
    return text, tuple((start, close + len(end)) for start, close in positions)


@lru_cache(maxsize=8)
def turn_end(template: str, bos_token: str | None, eos_token: str | None) -> str | None:
    """The text the template writes between an assistant turn's content and the end of its span
    (ChatML: ``<|im_end|>``), the same on every probe conversation, where rendering the probes once
    gives exactly the exact way's text and spans; else None (never rendered once, also where the
    template fails on a probe)."""
    try:
        return _turn_end(template, bos_token, eos_token)
    except Exception:  # a template that cannot render the probes is rendered the exact way, row by row
        return None


def _turn_end(template: str, bos_token: str | None, eos_token: str | None) -> str | None:
    ends = set()
    for probe in PROBES:
        try:
            exact = render_turns(template, probe, "probe", bos_token, eos_token)
        except BadRow:
            return None
        wrapped = marked(probe)
        rendered = compile_chat_template(template).render(messages=wrapped, add_generation_prompt=False,
                                                          **template_variables(bos_token, eos_token))
        found = unmark(rendered, len(exact.spans))
        if found is None:
            return None
        for (start, close), (want_start, want_stop) in zip(found[1], exact.spans):
            if start != want_start or want_stop <= close:
                return None
            ends.add(found[0][close:want_stop])
    if len(ends) != 1:
        return None
    (end,) = ends
    if not end.strip() or end[-1].isspace():  # the exact way's rstrip would then reach into the content
        return None
    for probe in PROBES:  # the end learned, rendering once must now give the exact way's result
        exact = render_turns(template, probe, "probe", bos_token, eos_token)
        if spans_once(template, probe, end, bos_token, eos_token) != (exact.text, exact.spans):
            return None
    return end


CHATML_END = "<|im_end|>"


def chatml(messages: list[dict], default_system: str | None, eos_token: str | None) -> tuple[str, tuple]:
    """ChatML rendered by string joins (no Jinja), with ``default_system`` before a conversation that
    has no system message (SmolLM2's, Qwen2.5's templates); (text, each assistant turn's span)."""
    parts = [] if default_system is None or messages[0]["role"] == "system" else \
        [f"<|im_start|>system\n{default_system}{CHATML_END}\n"]
    at, spans = len(parts[0]) if parts else 0, []
    for message in messages:
        head = f"<|im_start|>{message['role']}\n"
        if message["role"] == "assistant":
            spans.append((at + len(head), at + len(head) + len(message["content"]) + len(CHATML_END)))
        part = head + message["content"] + CHATML_END + "\n"
        parts.append(part)
        at += len(part)
    text = "".join(parts)
    if eos_token and text.rstrip().endswith(eos_token):
        text = text.rstrip()
    return text, tuple(spans)


@lru_cache(maxsize=8)
def chatml_system(template: str, bos_token: str | None, eos_token: str | None) -> tuple[bool, str | None]:
    """(whether :func:`chatml` renders this template's probe conversations exactly as the template
    does turn by turn, its default system prompt)."""
    if turn_end(template, bos_token, eos_token) != CHATML_END:
        return False, None
    try:
        text = compile_chat_template(template).render(messages=PROBES[0], add_generation_prompt=False,
                                                      **template_variables(bos_token, eos_token))
    except Exception:
        return False, None
    default = None
    if text.startswith("<|im_start|>system\n"):
        default = text[len("<|im_start|>system\n") : text.find(CHATML_END)]
    for probe in PROBES + CONTENT_PROBES:
        try:
            exact = render_turns(template, probe, "probe", bos_token, eos_token)
        except Exception:  # the template treats this content specially: string joins cannot follow it
            return False, None
        if chatml(probe, default, eos_token) != (exact.text, exact.spans):
            return False, None
    return True, default


HEADS = {role: f"<|im_start|>{role}\n" for role in ("system", "user", "assistant", "tool")}  # chat_messages.ROLES


def plain_chatml(messages, system: str | None, default_system: str | None, eos_token: str | None) -> Formatted | None:
    """A conversation of plain messages rendered by string joins straight from the row, for a template
    :func:`chatml_system` admits: the result of ``chat_render.render_conversation(..., once=True)``, which
    would check the messages (``check_messages``, ``check_fields_rendered``), add ``system`` and render
    by :func:`chatml`. Plain: a non-empty list of dicts of exactly a role (chat_messages.ROLES) and text
    content, every assistant turn's content not blank, at least one assistant turn. None for any other
    row: render_conversation then checks it (and says why a bad one is bad) and renders it as before.

    >>> doc = plain_chatml([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}], None, "S", None)
    >>> doc.text, doc.spans, doc.text[doc.spans[0][0]:doc.spans[0][1]]
    ('<|im_start|>system\\nS<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nYo<|im_end|>\\n', ((83, 95),), 'Yo<|im_end|>')
    >>> plain_chatml([{"role": "user", "content": "Hi"}, {"content": "Yo", "role": "assistant"}], "T", "S", "<|im_end|>").text
    '<|im_start|>system\\nT<|im_end|>\\n<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nYo<|im_end|>'
    >>> [plain_chatml(m, None, None, None) for m in ([{"role": "user", "content": "Hi"}],  # no answer
    ...     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " "}],  # a blank answer
    ...     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo", "name": None}],  # another key
    ...     [{"role": ["user"], "content": "Hi"}], '[{"role": "user"}]', [])]
    [None, None, None, None, None, None]
    """
    if not isinstance(messages, list) or not messages:
        return None
    parts, spans, at = [], [], 0
    first = messages[0]
    if type(first) is dict and first.get("role") == "assistant":
        return None  # the exact way judges a conversation that opens with an answer (see the module doc)
    if type(first) is dict and first.get("role") != "system":
        prefix = system or default_system
        if prefix is not None:
            parts.append(f"<|im_start|>system\n{prefix}{CHATML_END}\n")
            at = len(parts[0])
    for message in messages:
        if type(message) is not dict or len(message) != 2:
            return None
        role, content = message.get("role"), message.get("content")
        head = HEADS.get(role) if type(role) is str else None
        if head is None or not isinstance(content, str):
            return None
        if role == "assistant":
            if not content.strip():
                return None
            spans.append((at + len(head), at + len(head) + len(content) + len(CHATML_END)))
        part = head + content + CHATML_END + "\n"
        parts.append(part)
        at += len(part)
    if not spans:
        return None
    text = "".join(parts)
    if eos_token and text.endswith(eos_token, 0, len(text) - 1):  # text.rstrip() is text[:-1]: it ends in ">\n"
        text = text[:-1]
    # no system message of its own nor format.system: the template's default (if any) went in
    return Formatted(text, tuple(spans), rendered_once=True, no_system=not system and messages[0]["role"] != "system")


def render_once(template: str | None, messages: list[dict], bos_token: str | None,
                eos_token: str | None) -> Formatted | None:
    """The conversation (checked, system prompt added: chat_render.render_conversation's input) from one
    render, or None where the exact way must render it. A ChatML template whose probes :func:`chatml`
    renders exactly is rendered by it, without Jinja, for messages of role and text content alone;
    others by the template with markers."""
    if not template or messages[0]["role"] == "assistant":
        return None
    end = turn_end(template, bos_token, eos_token)
    if end is None:
        return None
    plain, default = chatml_system(template, bos_token, eos_token)
    if plain and all(len(m) == 2 and isinstance(m.get("content"), str) for m in messages):
        text, spans = chatml(messages, default, eos_token)
        return Formatted(text, spans, rendered_once=True, no_system=messages[0]["role"] != "system") if spans else None
    found = spans_once(template, messages, end, bos_token, eos_token)
    if found is None or not found[1]:
        return None
    return Formatted(found[0], found[1], rendered_once=True, no_system=messages[0]["role"] != "system")
