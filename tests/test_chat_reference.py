"""Conversations the build refuses, refused for what they are (bench/chat_reference_check.py, the differential
harness against transformers' ``apply_chat_template``, found each; docs/BUILD.md, Conversations)."""

from __future__ import annotations

from pathlib import Path

import pytest

from packtrain.pipeline.format.format import BadRow, render_conversation
from packtrain.pipeline.format.format_messages import render_each_turn

ROOT = Path(__file__).resolve().parents[1]
QWEN3 = (ROOT / "tests" / "chat_templates" / "qwen3.jinja").read_text()


def U(text):
    return {"role": "user", "content": text}


def A(text, **extra):
    return {"role": "assistant", "content": text, **extra}


def test_qwen3s_reasoning_in_earlier_turns_trains_one_document_per_turn():
    """Qwen3's template renders an answer's ``reasoning_content`` only while the answer is the last turn:
    with ``format.each_assistant_turn`` each turn's document renders its own. Until 2026-12-06 the check
    that refuses a field the template drops looked at the whole conversation only, and refused the row."""
    messages = [U("q1"), A("a1", reasoning_content="r1"), U("q2"), A("a2", reasoning_content="r2")]
    docs = render_each_turn(QWEN3, None, messages, "messages", None, "<|im_end|>")
    assert [d.text for d in docs] == [
        "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\n<think>\nr1\n</think>\n\na1<|im_end|>",
        "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nr2\n</think>\n\na2<|im_end|>"]
    assert [d.text[a:b] for d in docs for a, b in d.spans] == ["<think>\nr1\n</think>\n\na1<|im_end|>",
                                                                "<think>\nr2\n</think>\n\na2<|im_end|>"]
    with pytest.raises(BadRow, match="message 1 .assistant. has a field 'reasoning_content' that the chat template "
                                     "does not render"):  # the whole conversation drops turn 1's: one document cannot
        render_conversation(QWEN3, None, messages, "messages", None, "<|im_end|>")


def test_an_answer_first_conversation_says_so_where_the_template_fails_on_no_messages():
    """Qwen3's template reads ``messages[0]``: the empty history before an opening answer fails to render.
    The row is refused for what it is, not for the template's error (until 2026-12-06: 'the chat template
    fails on this row (UndefinedError: list object has no element 0)')."""
    messages = [A("I start."), U("q"), A("ok")]
    for render in (lambda: render_conversation(QWEN3, None, messages, "messages", None, "<|im_end|>", once=True),
                   lambda: render_each_turn(QWEN3, None, messages, "messages", None, "<|im_end|>")):
        with pytest.raises(BadRow) as e:
            render()
        assert str(e.value) == (
            "the conversation in 'messages' opens with an assistant turn, and the chat template fails on the empty "
            "conversation before it (UndefinedError: list object has no element 0), so the turn's start cannot be "
            "found; open the conversation with a system or user message (format.system adds one)")
    doc = render_conversation(QWEN3, "Be brief.", messages, "messages", None, "<|im_end|>")  # format.system: fixed
    assert [doc.text[a:b] for a, b in doc.spans] == ["I start.<|im_end|>", "<think>\n\n</think>\n\nok<|im_end|>"]


def test_content_given_as_parts_is_refused_saying_how_to_fix_it():
    """OpenAI-style content parts: transformers hands the list to the template (SmolLM2's raises, a Llama 3
    style ``| trim`` renders the list's Python text); the build refuses the row naming the fix (until
    2026-12-06: "'messages' message 0: content is list, expected text")."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}, A("Hello")]
    with pytest.raises(BadRow) as e:
        render_conversation(QWEN3, None, messages, "messages", None, "<|im_end|>")
    assert str(e.value) == (
        "'messages' message 0: content is a list of 1 parts, expected text (the chat template renders text; "
        "SmolLM2's fails on a list, Llama 3's writes its Python text); join the parts' text into one string in "
        "the data")
