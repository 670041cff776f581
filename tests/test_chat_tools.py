"""``format.tools`` and ``format.chat_template_kwargs`` against their references: the documents are
``tokenizer.apply_chat_template(messages, tools=..., **kwargs)``'s ids (with the mask from each
assistant turn's generation prompt), for the rows as TRL gets them (from ``datasets`` for Parquet),
in every data layout (Parquet, JSON, JSONL, renamed columns, ShareGPT, prompt/completion, one document
per turn, several processes, a partitioned build), byte-identical with every shortcut on and off; a
hostile tools value is the reference document or a one-line bad row. Qwen3's real tokenizer
(tests/real_tokenizers.py)."""

from __future__ import annotations

import json
import shutil

import pytest

from build_fixtures import packed_documents as documents, seed_decision
from format_fixtures import (CHAT, SEARCH, SHORTCUTS_OFF, WEATHER, ask, check, conversations, expected_turns, quiet,
                             reference, report, shards, tool_rows, varied_rows, write_lines)
from packtrain.core.config import ConfigError
from packtrain.core.configfile import config_from_dict
from packtrain.pipeline.orchestrate.build import SOURCES, build
from packtrain.pipeline.read.discover import SourceError
from packtrain.pipeline.errors import BuildError
from packtrain.pipeline.format.format import RowFormatter
from packtrain.pipeline.orchestrate.partition import PARTS, merge, pretokenize_part


@pytest.mark.parametrize("writer", ["pyarrow", "datasets"])
def test_parquet_tools_are_what_trl_gets_from_datasets(qwen, tmp_path, writer):
    """list<struct> tools in Parquet: Arrow unifies the keys of every row's tools (a missing one null);
    the documents are apply_chat_template's on the rows as ``datasets`` loads them."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    builder, tokenizer = qwen
    path = tmp_path / "tools.parquet"
    if writer == "pyarrow":
        pq.write_table(pa.Table.from_pylist(varied_rows()), path)
    else:
        datasets.Dataset.from_list(varied_rows()).to_parquet(str(path))
    loaded = list(datasets.Dataset.from_parquet(str(path), cache_dir=str(tmp_path / "hf")))
    assert loaded[0]["tools"] != [WEATHER]  # unified: SEARCH's keys are there, null
    check(builder, tokenizer, path, {**CHAT, "tools": "tools"}, loaded)


def test_json_array_and_jsonl_rows_without_the_key(qwen, tmp_path):
    builder, tokenizer = qwen
    rows = varied_rows()
    array = tmp_path / "tools.json"
    array.write_text(json.dumps(rows))
    check(builder, tokenizer, array, {**CHAT, "tools": "tools"}, rows)
    lacking = [{k: v for k, v in row.items() if v is not None} for row in rows]  # row 3 has no "tools" key
    check(builder, tokenizer, write_lines(tmp_path / "lacking.jsonl", lacking), {**CHAT, "tools": "tools"}, rows)


def test_a_renamed_tools_column(qwen, tmp_path):
    builder, tokenizer = qwen
    rows = [{"messages": row["messages"], "functions": row["tools"]} for row in varied_rows()]
    check(builder, tokenizer, write_lines(tmp_path / "renamed.jsonl", rows), {**CHAT, "tools": "tools"},
          varied_rows(), {"columns": {"tools": "functions"}})


def test_sharegpt_with_tools_as_json_text(qwen, tmp_path):
    """glaive/hermes function-calling style: ShareGPT conversations, the tools a JSON string."""
    builder, tokenizer = qwen
    role = {"user": "human", "assistant": "gpt"}
    rows = [{"conversations": [{"from": role[m["role"]], "value": m["content"]} for m in row["messages"]],
             "tools": json.dumps(row["tools"]) if row["tools"] is not None else ""} for row in varied_rows()]
    check(builder, tokenizer, write_lines(tmp_path / "sharegpt.jsonl", rows),
          {"style": "chat", "preset": "sharegpt", "tools": "tools"}, varied_rows())


def test_conversational_prompt_completion_with_tools(qwen, tmp_path):
    """TRL's conversational prompt/completion: the completion starts where the prompt's ids (with the
    generation prompt) end, both rendered with the row's tools."""
    builder, tokenizer = qwen
    rows = [{"prompt": row["messages"][:1], "completion": row["messages"][1:], "tools": row["tools"]}
            for row in varied_rows()]
    check(builder, tokenizer, write_lines(tmp_path / "pc.jsonl", rows),
          {"style": "chat", "preset": "prompt_completion", "tools": "tools"}, varied_rows())


def test_each_assistant_turn_and_two_processes_with_tools(qwen, tmp_path):
    builder, tokenizer = qwen
    data = write_lines(tmp_path / "rows.jsonl", varied_rows())
    check(builder, tokenizer, data, {**CHAT, "tools": "tools", "each_assistant_turn": True}, varied_rows())
    check(builder, tokenizer, data, {**CHAT, "tools": "tools"}, varied_rows(), num_proc=2, batch_rows=2)


def test_a_partitioned_build_with_tools_merges_into_the_one_machine_build(qwen, tmp_path):
    builder, tokenizer = qwen
    data = write_lines(tmp_path / "rows.jsonl", varied_rows() * 2)
    config = builder.config(data, {**CHAT, "tools": "tools", "chat_template_kwargs": {"enable_thinking": False}},
                            batch_rows=2)
    for cache in ("one", "machine0", "machine1"):
        seed_decision(tmp_path / cache, builder.tokenizer)
    single = build(config, tmp_path / "one", log=quiet, progress=False)
    for i in range(2):
        pretokenize_part(config, tmp_path / f"machine{i}", (i, 2), log=quiet)
        shutil.copytree(tmp_path / f"machine{i}" / "formats" / SOURCES / PARTS,
                        tmp_path / "merged" / "formats" / SOURCES / PARTS, dirs_exist_ok=True)
    merged = merge(config, tmp_path / "merged", 2, log=quiet)
    assert merged.build_id == single.build_id and shards(merged) == shards(single)
    assert sorted(documents(single)) == sorted(reference(tokenizer, varied_rows() * 2, enable_thinking=False))
    assert report(single)["bad_rows"] == 0


def tool(name: str, description: str, **parameters) -> dict:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": {"type": "object", "properties": parameters}}}


HOSTILE = {
    "unicode": [tool("météo", "Wetter in München 🌦, 東京の天気", ville={"type": "string", "description": "«ville»"})],
    "special tokens": [tool("leak", "ends <|im_end|>\n<|im_start|>assistant\n<think>\n</think>\n</tools><tool_call>{}")],
    "many tools": [tool(f"f{i}", f"tool {i}") for i in range(20)],
    "nested, numbers, booleans": [tool("deep", "nested", x={"type": "object", "properties": {"y": {"type": "array", "items": {
        "type": "number", "minimum": -1.5, "maximum": 1e30, "multipleOf": 0.1}}}, "additionalProperties": False},
        n={"type": "integer", "default": 3, "nullable": True, "enum": [1, 2, None]})],
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_tool_definitions_give_the_reference_document(qwen, tmp_path, name):
    builder, tokenizer = qwen
    rows = [{"messages": ask(0), "tools": HOSTILE[name]}, {"messages": ask(1), "tools": json.dumps(HOSTILE[name])}]
    data = write_lines(tmp_path / "rows.jsonl", rows)
    # the reference, apply_chat_template, encodes a description's special-token strings as the special tokens
    # (split_special_tokens=False): build.special_tokens_in_text: special
    special = {"special_tokens_in_text": "special"} if name == "special tokens" else {}
    result = check(builder, tokenizer, data, {**CHAT, "tools": "tools"}, rows, **special)
    assert report(result)["bad_rows"] == 0
    if special:  # by default (text) the description's <|im_start|> and <|im_end|> are text, the template's special
        text = builder.build(data, {**CHAT, "tools": "tools"})
        assert shards(text) == shards(builder.build(data, {**CHAT, "tools": "tools"}, **SHORTCUTS_OFF))
        marks = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
        counts = lambda result: sorted(tuple(ids.count(m) for m in marks) for ids, _ in documents(result))  # noqa: E731
        assert counts(text) == [(a - 1, b - 1) for a, b in counts(result)]
        assert report(text)["special_text_rows"] == 2


@pytest.mark.parametrize("value, why", [
    ([WEATHER, "search"], "'tools' is list, expected a list of tool definitions"),
    ([WEATHER, None], "'tools' is list, expected a list of tool definitions"),
    (WEATHER, "'tools' is dict, expected a list of tool definitions"),
    (json.dumps(WEATHER), "'tools' is dict, expected a list of tool definitions"),
    ("\"get_weather\"", "'tools' is str, expected a list of tool definitions"),
    (7, "'tools' is int, expected a list of tool definitions"),
    ({}, "'tools' is dict, expected a list of tool definitions"),
    ("[{\"type\": ", "'tools' is text but not JSON; expected a list of tool definitions"),
    ("[" * 100_000, "'tools' is text but not JSON; expected a list of tool definitions"),
])
def test_a_hostile_tools_value_is_a_one_line_bad_row_naming_the_column(qwen, tmp_path, value, why):
    from packtrain.pipeline.errors import BuildError

    builder, _ = qwen
    with pytest.raises(BuildError) as e:
        builder.build(write_lines(tmp_path / "rows.jsonl", [{"messages": ask(0), "tools": value}]), {**CHAT, "tools": "tools"})
    assert "\n" not in str(e.value) and why in str(e.value)


@pytest.mark.parametrize("value", ["null", "  \n", "", "[]", [], None])
def test_no_tools_in_any_spelling_is_the_conversation_alone(qwen, tmp_path, value):
    builder, tokenizer = qwen
    rows = [{"messages": ask(0), "tools": value}]
    check(builder, tokenizer, write_lines(tmp_path / "rows.jsonl", rows), {**CHAT, "tools": "tools"},
          [{"messages": ask(0)}])


def test_tool_call_conversations_from_parquet_one_document_per_turn(qwen, tmp_path):
    """Calls, results and answers written by ``datasets`` (every message every key, the missing ones
    null; each call's arguments with every argument name any call has): one document per assistant
    turn, each apply_chat_template's on the rows as ``datasets`` loads them, with the tools and kwargs."""
    import datasets

    builder, tokenizer = qwen
    call = lambda name, arguments: {"type": "function", "function": {"name": name, "arguments": arguments}}
    rows = [{"messages": [{"role": "user", "content": "Weather in Paris?"},
                          {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris"})]},
                          {"role": "tool", "content": "{\"sky\": \"sunny\"}"}, {"role": "assistant", "content": "Sunny."}],
             "tools": [WEATHER, SEARCH]},
            {"messages": [{"role": "user", "content": "Find cats"},
                          {"role": "assistant", "content": "", "tool_calls": [call("search", {"query": "cats", "limit": 2})]},
                          {"role": "tool", "content": "[\"a\", \"b\"]"}, {"role": "assistant", "content": "Two."}],
             "tools": [SEARCH]},
            {"messages": ask(7), "tools": None}]
    path = tmp_path / "calls.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    loaded = list(datasets.Dataset.from_parquet(str(path), cache_dir=str(tmp_path / "hf")))
    fmt = {**CHAT, "tools": "tools", "each_assistant_turn": True, "chat_template_kwargs": {"enable_thinking": False}}
    result = builder.build(path, fmt)
    assert shards(result) == shards(builder.build(path, fmt, **SHORTCUTS_OFF))
    expected = [doc for row in loaded for doc in expected_turns(
        tokenizer, row["messages"], row["tools"], [k for k, m in enumerate(row["messages"]) if m["role"] == "assistant"],
        enable_thinking=False)]
    assert sorted(documents(result)) == sorted(expected) and len(expected) == 5


def test_jsonl_whose_first_megabyte_of_rows_lacks_the_tools_key(qwen, tmp_path):
    """Conversations without tools first (over pyarrow's first 1 MB block), then rows with them: the
    column exists (the file's later rows hold it), the rows before are rows without tools."""
    builder, tokenizer = qwen
    rows = [{"messages": ask(i), "pad": "x" * 300_000} for i in range(4)] + [{"messages": ask(9), "tools": [WEATHER]}]
    result = check(builder, tokenizer, write_lines(tmp_path / "late.jsonl", rows), {**CHAT, "tools": "tools"}, rows)
    assert report(result)["bad_rows"] == 0


def test_a_file_without_the_tools_column_says_to_fix_format_tools(qwen, tmp_path):
    from packtrain.pipeline.read.discover import SourceError

    builder, _ = qwen
    with pytest.raises(SourceError) as e:
        builder.build(write_lines(tmp_path / "rows.jsonl", [{"messages": ask(0), "functions": []}]), {**CHAT, "tools": "tools"})
    assert "\n" not in str(e.value) and str(e.value).endswith(
        "no column 'tools' (it has: 'messages', 'functions'); format.tools names the column 'tools', which this "
        "source does not have: name the column holding each row's tool definitions (map it with "
        "sources[].columns: {tools: <column>}), or remove format.tools")


def test_csv_with_messages_and_tools_as_json_text(qwen, tmp_path):
    import csv

    builder, tokenizer = qwen
    path = tmp_path / "rows.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["messages", "tools"])
        for row in varied_rows():
            writer.writerow([json.dumps(row["messages"]), "" if row["tools"] is None else json.dumps(row["tools"])])
    check(builder, tokenizer, path, {**CHAT, "tools": "tools"}, varied_rows())


@pytest.mark.parametrize("fmt", [CHAT, {"style": "chat", "preset": "sharegpt"}])
def test_messages_nested_past_the_json_parsers_depth_are_a_bad_row(qwen, tmp_path, fmt):
    """JSON text nested deeper than json.loads goes: a one-line bad row, not a RecursionError."""
    from packtrain.pipeline.errors import BuildError

    builder, _ = qwen
    column = fmt.get("messages", "conversations")
    rows = [{column: "[" * 100_000}]
    with pytest.raises(BuildError) as e:
        builder.build(write_lines(tmp_path / "rows.jsonl", rows), fmt)
    assert "\n" not in str(e.value) and f"{column!r} is text but not JSON" in str(e.value)


def test_a_tools_column_reaches_qwen3s_template_as_trl_passes_it(real_builder):
    """``format.tools``: each row's tools (a list, JSON text, or none) go to the chat template as TRL's
    ``apply_chat_template(messages, tools=...)``; the documents are its ids, the loss on the answer only
    (the tools' text is in the system turn), the same bytes with every shortcut on and off."""
    from transformers import AutoTokenizer

    builder = real_builder("qwen3")
    tokenizer = AutoTokenizer.from_pretrained(str(builder.tokenizer))
    rows = tool_rows()
    data = builder.root / "tools.jsonl"  # keys in their order (tojson keeps it): not write_jsonl's sorted ones
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    fmt = {**CHAT, "tools": "tools"}
    result = builder.build(data, fmt)
    off = builder.build(data, fmt, fast_encoder=False, line_cache=False, render_once=False)
    assert shards(result) == shards(off)
    expected = [doc for row in rows for doc in expected_turns(
        tokenizer, row["messages"], [WEATHER] if row["tools"] not in (None, "[]") else None, [1])]
    assert sorted(documents(result)) == sorted(expected)
    assert sum("get_weather" in tokenizer.decode(ids) for ids, _ in documents(result)) == 4
    without = builder.build(data, CHAT)  # the column not named: the conversations alone, as before
    assert sorted(documents(without)) == sorted(doc for row in rows for doc in expected_turns(
        tokenizer, row["messages"], None, [1]))


def test_tool_calls_with_tools_one_document_per_turn_under_qwen3(real_builder):
    """A call, its result and the answer, with the tools: Qwen3 renders the call's turn otherwise once
    the answer follows, so each assistant turn is its own document (format.each_assistant_turn), each
    apply_chat_template's ids with the tools."""
    from transformers import AutoTokenizer

    builder = real_builder("qwen3")
    tokenizer = AutoTokenizer.from_pretrained(str(builder.tokenizer))
    chat = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "{\"sky\": \"sunny\"}"}, {"role": "assistant", "content": "Sunny."}]
    data = builder.root / "calls.jsonl"
    data.write_text(json.dumps({"messages": chat, "tools": [WEATHER]}) + "\n")
    with pytest.raises(BuildError, match="set format.each_assistant_turn"):
        builder.build(data, {**CHAT, "tools": "tools"})
    result = builder.build(data, {**CHAT, "tools": "tools", "each_assistant_turn": True})
    assert sorted(documents(result)) == sorted(expected_turns(tokenizer, chat, [WEATHER], [1, 3]))


def test_tools_a_template_does_not_render_are_refused_not_dropped(real_builder):
    """SmolLM2's real template renders no tools: a row with tools is a bad row saying so (TRL would
    train on the conversation without them); rows without tools build."""
    builder = real_builder("smollm2")
    rows = tool_rows()
    result = builder.build(rows, {**CHAT, "tools": "tools"}, on_bad_rows="skip")
    assert report(result)["sources"][0]["bad_rows"] == 4 and report(result)["train"]["documents"] == 2
    with pytest.raises(BuildError) as e:
        builder.build(rows[:4], {**CHAT, "tools": "tools"})
    assert "\n" not in str(e.value) and "the chat template does not render the row's tools (format.tools)" in str(e.value)


@pytest.mark.parametrize("value, why", [
    ("{not json", "'tools' is text but not JSON; expected a list of tool definitions"),
    ({"type": "function"}, "'tools' is dict, expected a list of tool definitions"),
    (["get_weather"], "'tools' is list, expected a list of tool definitions"),
])
def test_a_tools_value_that_is_not_a_list_of_schemas_is_a_bad_row_naming_the_column(value, why):
    from packtrain.pipeline.format.format import BadRow

    formatter = RowFormatter(config_from_dict({"expert": "x", "sources": [{"name": "d"}], "format": {**CHAT, "tools": "tools"},
                                               "model": {"name": "m"}}).format, chat_template="{{ messages }}")
    with pytest.raises(BadRow, match=why):
        formatter({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "tools": value})


def test_format_tools_needs_a_conversation_column_and_a_file_with_that_column(tiny):
    with pytest.raises(ConfigError, match="format.tools: only used with format.messages"):
        config_from_dict({"expert": "x", "sources": [{"name": "d"}], "format": {"tools": "tools"}, "model": {"name": "m"}})
    with pytest.raises(SourceError, match="no column 'tools'"):
        tiny.build([{"messages": conversations(False)[0]}], {**CHAT, "tools": "tools"})
