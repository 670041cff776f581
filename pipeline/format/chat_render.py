"""Chat rendering: a row rendered by the tokenizer's chat template, with the character spans the loss
is on (the ``chat`` and ``chat + messages`` styles drawn in pipeline/format/format.py's module doc).
A prompt and an answer are rendered as [system?, user] with the generation prompt and as [system?, user,
assistant]; a conversation is rendered whole, and each assistant turn's span found by rendering it up
to that turn and through it (the exact way), or from one render where pipeline/format/chat_once.py can.
Whatever a template raises on a row's data makes the row a :class:`BadRow`, never a traceback."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from packtrain.pipeline.format.chat_messages import check_fields_rendered, check_messages, check_tools_rendered
from packtrain.pipeline.format.chat_template import BadRow, compile_chat_template, template_variables
from packtrain.pipeline.format.format import Formatted


def render_chat(
    template: str | None,
    system: str | None,
    prompt: str,
    answer: str,
    bos_token: str | None = None,
    eos_token: str | None = None,
    variables: dict | None = None,
) -> tuple[str, str]:
    if not template:
        raise BadRow("format.style is chat but the tokenizer has no chat_template; use style: template")
    import jinja2

    try:
        compiled = compile_chat_template(template)
    except jinja2.TemplateError as e:
        raise BadRow(f"the chat template does not compile: {e}") from None
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    extra = template_variables(bos_token, eos_token, variables)
    with template_errors_are_bad_rows():
        head = compiled.render(messages=messages, add_generation_prompt=True, **extra)
        full = compiled.render(messages=messages + [{"role": "assistant", "content": answer}],
                               add_generation_prompt=False, **extra)
    if not full.startswith(head):
        raise BadRow("the chat template does not render the prompt as a prefix of prompt + answer")
    if eos_token and full.rstrip().endswith(eos_token):
        full = full.rstrip()  # the turn ends with EOS (Qwen-Instruct's <|im_end|>): train to stop there
    return head, full


def render_conversation(template: str | None, system: str | None, messages: Any, column: str,
                        bos_token: str | None = None, eos_token: str | None = None, once: bool = False,
                        variables: dict | None = None) -> Formatted:
    """The whole conversation and the character span of every assistant turn (see pipeline/format/format.py);
    ``once``: from one render where pipeline/format/chat_once.py can (the same result, checked; a row with
    ``variables`` for the template, its tools or format.chat_template_kwargs, is rendered turn by turn,
    the way proven for any). A row whose
    messages hold a field the template does not render, or an empty assistant turn, is a :class:`BadRow`
    (:func:`check_messages`, :func:`check_fields_rendered`), whichever way it is then rendered."""
    if not template:
        raise BadRow("format.messages needs the tokenizer's chat_template, and it has none")
    messages = check_messages(messages, column)
    if system and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system}] + messages
    with template_errors_are_bad_rows():
        check_fields_rendered(template, messages, column, bos_token, eos_token, variables)
        if variables:
            check_tools_rendered(template, messages, variables, bos_token, eos_token)
        if once and not variables:
            from packtrain.pipeline.format.chat_once import render_once

            doc = render_once(template, messages, bos_token, eos_token)
            if doc is not None:
                return doc
        return render_turns(template, messages, column, bos_token, eos_token, variables)


@contextmanager
def template_errors_are_bad_rows() -> Iterator[None]:
    """A chat template that fails on a row's data (an attribute it expects and the row lacks, such as
    the content of a tool-call turn under a template that renders no tool calls) makes the row a
    :class:`BadRow` naming the error, counted like any other, never a traceback that stops the build.
    Whatever it raises: a Jinja error, or any other a template can make Python raise while it renders
    (``range(100000000)``: the sandbox's OverflowError; ``1 / 0``; a recursive macro's
    RecursionError; issue 46). The error's text is cut to 200 characters, its length said."""
    from packtrain.core.errors import cut

    try:
        yield
    except BadRow:  # the template's raise_exception, or a check of the rendered text: already said
        raise
    except Exception as e:  # noqa: BLE001 - everything a template can raise is the row's reason
        raise BadRow(f"the chat template fails on this row ({type(e).__name__}: {cut(' '.join(str(e).split()), 200)}); "
                     "fix the row, or use a chat template that renders it") from None


def render_turns(template: str, messages: list[dict], column: str, bos_token: str | None = None,
                 eos_token: str | None = None, variables: dict | None = None) -> Formatted:
    """The exact way: the whole conversation rendered, and each assistant turn's span found by
    rendering the conversation up to it and through it (``messages`` already checked); every render
    gets the row's ``variables``."""
    compiled = compile_chat_template(template)
    extra = template_variables(bos_token, eos_token, variables)

    def render(turns: list[dict], generation_prompt: bool) -> str:
        return compiled.render(messages=turns, add_generation_prompt=generation_prompt, **extra)

    full = render(messages, False)
    spans = []
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        through = render(messages[: k + 1], False)
        head = turn_head(render, messages, k, through, column)
        if eos_token and through.endswith(eos_token) and not full.startswith(through) and full.endswith(eos_token) \
                and full.startswith(through[: -len(eos_token)]):
            through = through[: -len(eos_token)]  # the EOS closing the conversation (Phi-3's), not this turn's end
        if k and not through.startswith(head):
            raise BadRow(no_turn_start(k, column))
        if not (full.startswith(head) and full.startswith(through) and len(through) > len(head)):
            fix = ("open the conversation with a system or user message (format.system adds one)" if k == 0 else
                   "set format.each_assistant_turn: true (docs/DATASETS.md), or use a template that renders turns the "
                   "same whatever follows")
            raise BadRow(f"the chat template does not render assistant turn {k} of {column!r} as a prefix of the "
                         "whole conversation (its generation prompt or an earlier turn renders differently), so its "
                         f"span cannot be found; {fix}")
        stop = len(through.rstrip())  # the end-of-turn token is supervised, the newline after it is not
        if stop <= len(head) or not through[len(head):stop].strip():
            raise BadRow(f"the chat template renders no text for assistant turn {k} of {column!r}")
        spans.append((len(head), stop))
    if not spans:
        raise BadRow(f"the conversation in {column!r} has no assistant turn, so nothing to train on")
    if eos_token and full.rstrip().endswith(eos_token):
        full = full.rstrip()
    return Formatted(full, tuple(spans), no_system=messages[0]["role"] != "system")


def no_turn_start(k: int, column: str) -> str:
    """Why assistant turn ``k`` has no span where the conversation through it does not start with the
    conversation before it and its generation prompt (nor without the prompt: :func:`turn_head`)."""
    return (f"the chat template renders the conversation through assistant turn {k} of {column!r} with other text "
            "before the turn than its generation prompt, so its start cannot be found, turn by turn or with "
            "format.each_assistant_turn; change the rows (Mistral v0.3's template renders a system message only "
            "before a final user turn: put its text in the first user message), or use another chat template")


def turn_head(render, messages: list[dict], k: int, through: str, column: str = "messages") -> str:
    """The text before assistant turn ``k``'s span, ``through`` being the conversation rendered through
    it: the conversation up to it with the generation prompt, where that is how the template starts
    the turn; else, where the generation prompt is not (DeepSeek-V3's and R1's add ``<think>\n``,
    which their turns do not have), the conversation up to it without (the generation prompt follows
    it): the turn's header is then supervised with it, as TRL's training templates for them mark it.
    A conversation that opens with an assistant turn, under a template that fails on no messages at
    all (Qwen3's reads ``messages[0]``), is a :class:`BadRow` saying so, not the template's error."""
    try:
        head = render(messages[:k], True)
    except Exception as e:  # noqa: BLE001 - whatever the template raises on the empty history
        if k:
            raise
        from packtrain.core.errors import cut

        raise BadRow(f"the conversation in {column!r} opens with an assistant turn, and the chat template fails on the "
                     f"empty conversation before it ({type(e).__name__}: {cut(' '.join(str(e).split()), 80)}), so the "
                     "turn's start cannot be found; open the conversation with a system or user message (format.system "
                     "adds one)") from None
    if through.startswith(head) or k == 0:  # no history: the turn's start is the generation prompt's, or unknown
        return head
    bare = render(messages[:k], False)
    return bare if head.startswith(bare) and through.startswith(bare) and len(through) > len(bare) else head
