"""Conversations are trained on as written or not at all: a message field the chat template does not
render (SmolLM2's ignores ``tool_calls``) and an empty assistant turn make the row a counted bad row,
whether the conversation is rendered once (pipeline/format/chat_once.py) or turn by turn."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from build_fixtures import seed_decision, write_jsonl
from packtrain.core.configfile import load_config
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.encode.tokenizer_info import load_tokenizer_info
from packtrain.pipeline.format.chat_render import render_conversation
from packtrain.pipeline.format.format import BadRow
from real_tokenizers import CHATML
from test_conversations import TOOL_CHATML, chat_project, quiet, set_template  # noqa: F401 (a fixture)

CALL = {"type": "function", "function": {"name": "run_sql", "arguments": {"query": "SELECT 1"}}}
TOOL_TURN = [{"role": "user", "content": "Check the database."},
             {"role": "assistant", "content": "", "tool_calls": [CALL]}]
PLAIN = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
NOT_RENDERED = ("'messages' message 1 (assistant) has a field 'tool_calls' that the chat template does not render, "
                "so it would be dropped silently; remove the field from the data or use a chat template that renders it")
EMPTY = ("'messages' message {} (assistant) is empty, and an empty answer would be trained on; fill in its content "
         "or drop the turn")


def render(template, messages, once):
    return render_conversation(template, None, messages, "messages", None, "<|im_end|>", once=once)


@pytest.mark.parametrize("once", [False, True])
def test_a_field_the_template_ignores_is_a_bad_row_naming_the_message_and_the_key(once):
    # CHATML renders role and content only, as SmolLM2's template does: the tool call would be lost
    with pytest.raises(BadRow) as e:
        render(CHATML, TOOL_TURN, once)
    assert str(e.value) == NOT_RENDERED
    named = [{"role": "user", "content": "hi", "name": "ann"}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(BadRow, match=r"^'messages' message 0 \(user\) has a field 'name' that the chat template"):
        render(CHATML, named, once)
    legacy = [PLAIN[0], {"role": "assistant", "content": "x", "function_call": {"name": "f", "arguments": "{}"}}]
    with pytest.raises(BadRow, match=r"^'messages' message 1 \(assistant\) has a field 'function_call' that"):
        render(CHATML, legacy, once)


@pytest.mark.parametrize("once", [False, True])
def test_a_template_that_renders_the_field_keeps_the_row(once):
    doc = render(TOOL_CHATML, TOOL_TURN, once)
    assert doc.text == ('<|im_start|>user\nCheck the database.<|im_end|>\n<|im_start|>assistant\n<tool_call>'
                        '{"name": "run_sql", "arguments": {"query": "SELECT 1"}}</tool_call><|im_end|>')
    assert [doc.text[a:b] for a, b in doc.spans] == [
        '<tool_call>{"name": "run_sql", "arguments": {"query": "SELECT 1"}}</tool_call><|im_end|>']


@pytest.mark.parametrize("once", [False, True])
def test_null_and_empty_fields_are_absent(once):
    """Arrow gives every message every key seen in the column (missing ones null); [], {} and "" hold nothing."""
    unified = [{"role": "user", "content": "hi", "tool_calls": None, "name": ""},
               {"role": "assistant", "content": "ok", "tool_calls": [], "function_call": {}}]
    doc = render(CHATML, unified, once)
    assert (doc.text, doc.spans) == ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nok<|im_end|>", ((52, 64),))


@pytest.mark.parametrize("once", [False, True])
def test_empty_assistant_turns_are_bad_rows(once):
    for content in ("", "  \n\t"):
        first = [{"role": "user", "content": "a"}, {"role": "assistant", "content": content},
                 {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]
        with pytest.raises(BadRow) as e:
            render(CHATML, first, once)
        assert str(e.value) == EMPTY.format(1)
        with pytest.raises(BadRow) as e:
            render(CHATML, first[2:] + [first[0], {"role": "assistant", "content": content, "tool_calls": None}], once)
        assert str(e.value) == EMPTY.format(3)
        with pytest.raises(BadRow) as e:
            render(CHATML, [first[0], {"role": "assistant", "content": content, "tool_calls": []}], once)
        assert str(e.value) == EMPTY.format(1)
    # a user turn may be empty: only answers are trained on
    assert render(CHATML, [{"role": "user", "content": ""}, {"role": "assistant", "content": "c"}], once).spans == \
        ((50, 61),)


@pytest.mark.parametrize("once", [False, True])
def test_qwen3s_own_template_keeps_a_tool_call_with_empty_content_and_refuses_a_tool_name(real_tokenizer, once):
    config = json.loads((real_tokenizer("qwen3") / "tokenizer_config.json").read_text())
    template = config["chat_template"]
    assert "tool_calls" in template  # Qwen3's real template, not the fallback
    doc = render(template, TOOL_TURN, once)
    assert [doc.text[a:b] for a, b in doc.spans] == [
        '<think>\n\n</think>\n\n<tool_call>\n{"name": "run_sql", "arguments": {"query": "SELECT 1"}}\n</tool_call>'
        '<|im_end|>']
    # Qwen3 renders a tool result's content but not the tool's name
    named = TOOL_TURN + [{"role": "tool", "content": "1", "name": "run_sql"}, {"role": "assistant", "content": "1"}]
    with pytest.raises(BadRow, match=r"^'messages' message 2 \(tool\) has a field 'name' that the chat template"):
        render(template, named, once)


@pytest.mark.parametrize("once", [False, True])
def test_a_tool_call_without_content_under_smollm2s_template_is_a_bad_row(real_tokenizer, once):
    """The usual OpenAI shape (content null beside tool_calls): SmolLM2's real template fails on the
    missing content; a counted bad row naming the error, not a traceback that stops the build."""
    template = load_tokenizer_info(real_tokenizer("smollm2")).chat_template
    for call in ({"role": "assistant", "content": None, "tool_calls": [CALL]}, {"role": "assistant", "tool_calls": [CALL]}):
        with pytest.raises(BadRow) as e:
            render(template, [TOOL_TURN[0], call], once)
        assert str(e.value) == ("the chat template fails on this row (UndefinedError: 'dict object' has no attribute "
                                "'content'); fix the row, or use a chat template that renders it")


@pytest.mark.parametrize("render_once", [True, False])
def test_the_build_counts_the_bad_rows_and_says_why(chat_project, render_once):
    """SmolLM2-style template, 100 rows: before, 0 bad and tool calls trained on as empty answers."""
    set_template(chat_project, CHATML)
    rows = []
    for i in range(100):
        if i % 10 == 3:
            rows.append(TOOL_TURN)
        elif i % 10 == 7:
            rows.append([{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": " " * (i % 3)}])
        else:
            rows.append([{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"SELECT {i}"}])
    lines: list[str] = []
    write_jsonl(chat_project["data"], [{"messages": c} for c in rows])
    config = load_config("sql", chat_project["configs"], {"build.render_once": render_once})
    result = build(config, chat_project["cache"], log=lines.append, progress=False)
    report = json.loads((result.path / "report.json").read_text())
    assert report["bad_rows"] == 20
    assert report["train"]["documents"] == 80
    assert [(row["row"].rsplit("#", 1)[1], row["reason"]) for row in report["sources"][0]["first_bad_rows"][:4]] == [
        ("3", NOT_RENDERED), ("7", EMPTY.format(1)), ("13", NOT_RENDERED), ("17", EMPTY.format(1))]
    assert f"  skipped 20 bad rows; first: {report['sources'][0]['first_bad_rows'][0]['row']}: {NOT_RENDERED}" in \
        "\n".join(lines).splitlines()


def test_arrow_unified_messages_keep_the_rows_without_the_field(chat_project):
    """One row's tool call gives every message of the parquet column ``tool_calls: null``: only that row
    is bad under a template that ignores tool calls, and none under one that renders them."""
    path = chat_project["data"].with_suffix(".parquet")
    pq.write_table(pa.Table.from_pylist([{"messages": PLAIN}, {"messages": TOOL_TURN}, {"messages": PLAIN[:1] + [
        {"role": "assistant", "content": "fine"}]}]), path)
    assert pq.read_table(path).to_pylist()[0]["messages"][1]["tool_calls"] is None
    chat_project["data"].unlink()
    config = load_config("sql", chat_project["configs"], {"sources": [{"name": str(path)}]})
    counts = {}
    for name, template in (("ignores", CHATML), ("renders", TOOL_CHATML)):
        set_template(chat_project, template)
        seed_decision(chat_project["cache"] / name, chat_project["model"])
        report = build(config, chat_project["cache"] / name, log=quiet, progress=False).report
        counts[name] = (report["bad_rows"], report["train"]["documents"],
                        [row["reason"] for row in report["sources"][0]["first_bad_rows"]])
    assert counts == {"ignores": (1, 2, [NOT_RENDERED]), "renders": (0, 3, [])}
