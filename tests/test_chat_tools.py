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
from packtrain.pipeline.build import SOURCES, build
from packtrain.pipeline.partition import PARTS, merge, pretokenize_part
from test_dataset_formats import CHAT, WEATHER, Builder, expected_turns, quiet, report, shards

SHORTCUTS_OFF = {"fast_encoder": False, "line_cache": False, "render_once": False}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}}}}


@pytest.fixture(scope="module")
def qwen(real_tokenizer, tmp_path_factory):
    """A builder over Qwen3's real tokenizer, and the HF tokenizer (the reference)."""
    from transformers import AutoTokenizer

    builder = Builder(tmp_path_factory.mktemp("tools-qwen3"), real_tokenizer("qwen3"))
    return builder, AutoTokenizer.from_pretrained(str(builder.tokenizer))


def ask(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Weather in city {i}?"}, {"role": "assistant", "content": f"Sunny {i}."}]


def varied_rows() -> list[dict]:
    """Rows whose tools differ in keys (Arrow unifies them), none, or empty."""
    tools = [[WEATHER], [SEARCH], [WEATHER, SEARCH], None, []]
    return [{"messages": ask(i), "tools": t} for i, t in enumerate(tools)]


def reference(tokenizer, rows: list[dict], tools_key: str = "tools", **kwargs) -> list:
    """TRL's documents of ``rows`` (as ``datasets`` gives them): apply_chat_template with the row's tools."""
    def tools(row):
        value = row.get(tools_key)
        return json.loads(value) if isinstance(value, str) else value

    return sorted(doc for row in rows for doc in expected_turns(
        tokenizer, row["messages"], tools(row), [k for k, m in enumerate(row["messages"]) if m["role"] == "assistant"],
        **kwargs))


def check(builder: Builder, tokenizer, data, fmt: dict, expected_rows: list[dict], source: dict | None = None, **settings):
    """The build of ``data`` is the reference of ``expected_rows``, the same bytes with the shortcuts off."""
    result = builder.build(data, fmt, source, **settings)
    assert shards(result) == shards(builder.build(data, fmt, source, **settings, **SHORTCUTS_OFF))
    assert sorted(documents(result)) == reference(tokenizer, expected_rows)
    return result


def write_lines(path, rows: list[dict]):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


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
    result = check(builder, tokenizer, write_lines(tmp_path / "rows.jsonl", rows), {**CHAT, "tools": "tools"}, rows)
    assert report(result)["bad_rows"] == 0


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


# --- format.chat_template_kwargs ---------------------------------------------------------------------

def load_format(kwargs: dict):
    from packtrain.core.configfile import config_from_dict

    return config_from_dict({"expert": "x", "sources": [{"name": "d"}], "model": {"name": "m"},
                             "format": {**CHAT, "chat_template_kwargs": kwargs}})


def test_every_yaml_value_of_a_kwarg_is_its_own_build_id_and_a_date_is_refused_in_one_line(qwen, tmp_path):
    """YAML gives str, int, float, bool, null, lists and mappings (each its own build id) and dates
    (Llama 3.1's ``date_string: 2024-07-26`` unquoted): a date is no JSON value (the build id hashes
    JSON) and no text (the template concatenates it): refused when the config loads, saying to quote it."""
    import yaml

    from packtrain.core.config import ConfigError
    from packtrain.pipeline.build import plan

    builder, _ = qwen
    data = write_lines(tmp_path / "rows.jsonl", [{"messages": ask(0)}])
    values = yaml.safe_load("[x, 1, 1.5, true, false, null, [1, a], {k: v}, '2024-07-26']")
    ids = {plan(builder.config(data, {**CHAT, "chat_template_kwargs": {"enable_thinking": v}}), builder.root / "cache",
                quiet)[3] for v in values}
    assert len(ids) == len(values)
    for text in ("{date_string: 2024-07-26}", "{date_string: 2024-07-26 10:00:00}", "{a: [{b: 2024-07-26}]}"):
        with pytest.raises(ConfigError) as e:
            load_format(yaml.safe_load(text))
        assert "\n" not in str(e.value) and ", not text: quote it (\"2024-07-26" in str(e.value)


@pytest.fixture(scope="module")
def templated(real_tokenizer, tmp_path_factory):
    """``templated(name)``: a builder over Qwen3's tokenizer with the chat template of
    tests/chat_templates/<name>.jinja (or ``chat_template`` as given), its turns ending with Qwen's
    end-of-turn token (the build appends the EOS to a document that ends otherwise), and the HF tokenizer."""
    from pathlib import Path

    from transformers import AutoTokenizer

    made = {}

    def get(name: str, chat_template=None):
        if name not in made:
            directory = tmp_path_factory.mktemp(f"tools-{name}") / "tokenizer"
            shutil.copytree(real_tokenizer("qwen3"), directory)
            config = json.loads((directory / "tokenizer_config.json").read_text())
            config["chat_template"] = chat_template or (Path(__file__).parent / "chat_templates" / f"{name}.jinja"
                                                        ).read_text().replace("<|eot_id|>", "<|im_end|>")
            (directory / "tokenizer_config.json").write_text(json.dumps(config))
            builder = Builder(directory.parent, directory)
            made[name] = builder, AutoTokenizer.from_pretrained(str(directory))
        return made[name]

    return get


@pytest.mark.parametrize("name", ["llama3_1", "mistral_v0_3"])
def test_an_empty_tool_list_is_passed_as_apply_chat_template_gets_it(templated, tmp_path, name):
    """Llama 3.1 and Mistral v0.3 render ``tools=[]`` (an empty tool block) unlike ``tools=None``: a
    row whose tools are [] (or "[]") is TRL's document with the empty list, one with null the
    conversation alone; [] under a template that renders no tools is no dropped tool."""
    builder, tokenizer = templated(name)
    chat = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "Sunny."}]
    rows = [{"messages": chat, "tools": []}, {"messages": chat, "tools": "[]"}, {"messages": chat, "tools": None},
            {"messages": chat, "tools": [WEATHER]}]
    result = check(builder, tokenizer, write_lines(tmp_path / "rows.jsonl", rows), {**CHAT, "tools": "tools"}, rows)
    assert len(set(map(str, documents(result)))) == 3


@pytest.mark.parametrize("layout", ["tokenizer_config.json", "save_pretrained"])
def test_a_row_with_tools_is_rendered_by_the_tokenizers_tool_use_template(templated, tmp_path, layout):
    """A tokenizer with named templates (Hermes, Command-R): apply_chat_template renders a call with
    tools by the one named ``tool_use``, one without by ``default`` (transformers' get_chat_template),
    whether tokenizer_config.json lists them or save_pretrained wrote additional_chat_templates/."""
    from pathlib import Path

    from real_tokenizers import CHATML
    from transformers import AutoTokenizer

    tool_use = (Path(__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    builder, tokenizer = templated("named", [{"name": "default", "template": CHATML},
                                             {"name": "tool_use", "template": tool_use}])
    if layout == "save_pretrained":
        tokenizer.save_pretrained(tmp_path / "saved")
        assert (tmp_path / "saved" / "additional_chat_templates" / "tool_use.jinja").is_file()
        builder = Builder(tmp_path, tmp_path / "saved")
        tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "saved"))
    rows = [{"messages": ask(0), "tools": [WEATHER]}, {"messages": ask(1), "tools": None}]
    result = check(builder, tokenizer, write_lines(tmp_path / "rows.jsonl", rows), {**CHAT, "tools": "tools"}, rows)
    assert report(result)["bad_rows"] == 0


def test_generates_prompt_is_the_prompt_the_build_wrote_with_the_kwargs(qwen, tmp_path):
    """``packtrain generate``/``chat`` render the prompt with format.chat_template_kwargs, as the build
    did: a validation row's prompt ids (up to its first trained token) are generation_prompt's."""
    from tokenizers import Tokenizer

    from packtrain.core.configfile import config_from_dict
    from packtrain.core.contract import Manifest
    from packtrain.core.shardfile import open_shard
    from packtrain.pipeline.encode.tokenizer_info import load_tokenizer_info
    from packtrain.pipeline.generation_prompt import generation_prompt

    builder, _ = qwen
    for fmt in ({**CHAT, "chat_template_kwargs": {"enable_thinking": False}},
                {"style": "chat", "prompt": "{q}", "answer": "{a}", "chat_template_kwargs": {"enable_thinking": False}}):
        rows = [{"messages": ask(i), "q": ask(i)[0]["content"], "a": ask(i)[1]["content"]} for i in range(12)]
        data = write_lines(tmp_path / "rows.jsonl", rows)
        config = config_from_dict({"expert": "talk", "sources": [{"name": str(data)}], "format": fmt,
                                   "pack": {"block_size": 256, "val_fraction": 0.5},
                                   "build": {"num_proc": 1, "dedup": "none"}, "model": {"name": str(builder.tokenizer)}})
        result = build(config, builder.root / "cache", log=quiet, progress=False)
        manifest = Manifest.load(result.path)
        info = load_tokenizer_info(builder.tokenizer)
        tokenizer = Tokenizer.from_file(str(builder.tokenizer / "tokenizer.json"))
        prompts = []
        for shard in sorted(result.path.glob("val-*.arrow")):
            ids, masks, doc_lens = open_shard(shard, manifest.block_size).arrays()
            for row, mask, lens in zip(ids, masks, doc_lens):
                at = 0
                for n in lens:
                    prompts.append(row[at: at + list(mask[at: at + n]).index(1)].tolist())
                    at += n
        assert prompts
        for prompt in prompts:
            question = tokenizer.decode(prompt).split("user\n")[1].split("\n")[0].split("<|im_end|>")[0].strip()
            made = generation_prompt(config.format, [{"role": "user", "content": question}], {},
                                     info.chat_template, info.bos_token, info.eos_token, info.prefix_ids)
            assert tokenizer.decode(prompt).endswith("<think>\n\n</think>\n\n")
            assert tokenizer.encode(made.text, add_special_tokens=False).ids == prompt


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


@pytest.mark.parametrize("name", ["llama3_1", "mistral_v0_3", "qwen2_5"])
def test_multi_turn_with_tools_is_apply_chat_templates_ids_or_a_bad_row(templated, tmp_path, name):
    """Two exchanges with tools: Mistral v0.3 renders the tools before the last user message only, so
    the first answer's history differs once the second exists: a one-line bad row saying to set
    each_assistant_turn (then each turn is its own reference document); where the history stays put,
    the whole conversation's ids are apply_chat_template's, both answers trained on."""
    from packtrain.pipeline.errors import BuildError

    builder, tokenizer = templated(name)
    chat = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "Sunny."},
            {"role": "user", "content": "Tomorrow?"}, {"role": "assistant", "content": "Rain."}]
    data = write_lines(tmp_path / "rows.jsonl", [{"messages": chat, "tools": [WEATHER]}])
    fmt = {**CHAT, "tools": "tools"}
    try:
        result = builder.build(data, fmt)
    except BuildError as e:
        assert name == "mistral_v0_3" and "\n" not in str(e) and "each_assistant_turn" in str(e)
        result = builder.build(data, {**fmt, "each_assistant_turn": True})
        assert sorted(documents(result)) == sorted(expected_turns(tokenizer, chat, [WEATHER], [1, 3]))
        return
    [(ids, mask)] = documents(result)
    full = list(tokenizer.apply_chat_template(chat, tools=[WEATHER], tokenize=True, return_dict=True)["input_ids"])
    assert ids == full[: len(ids)] and all(tokenizer.decode(full[len(ids):]).isspace() for _ in [0] if full[len(ids):])
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert trained.replace("<|im_end|>", "|").replace("\n", "") == "Sunny.|Rain.|"


def test_jsonl_whose_first_megabyte_of_rows_lacks_the_tools_key(qwen, tmp_path):
    """Conversations without tools first (over pyarrow's first 1 MB block), then rows with them: the
    column exists (the file's later rows hold it), the rows before are rows without tools."""
    builder, tokenizer = qwen
    rows = [{"messages": ask(i), "pad": "x" * 300_000} for i in range(4)] + [{"messages": ask(9), "tools": [WEATHER]}]
    result = check(builder, tokenizer, write_lines(tmp_path / "late.jsonl", rows), {**CHAT, "tools": "tools"}, rows)
    assert report(result)["bad_rows"] == 0


def test_a_file_without_the_tools_column_says_to_fix_format_tools(qwen, tmp_path):
    from packtrain.pipeline.discover import SourceError

    builder, _ = qwen
    with pytest.raises(SourceError) as e:
        builder.build(write_lines(tmp_path / "rows.jsonl", [{"messages": ask(0), "functions": []}]), {**CHAT, "tools": "tools"})
    assert "\n" not in str(e.value) and str(e.value).endswith(
        "no column 'tools' (it has: 'messages', 'functions'); format.tools names the column 'tools', which this "
        "source does not have: name the column holding each row's tool definitions (map it with "
        "sources[].columns: {tools: <column>}), or remove format.tools")


@pytest.mark.parametrize("name", ["llama3_1", "llama3_2", "mistral_v0_3", "qwen2_5", "qwen3"])
def test_every_real_template_that_renders_tools_gives_the_reference(templated, tmp_path, name):
    """Rows with and without a system message, with tools as a list, JSON text, none and []: the
    reference documents under each real template that renders tools. (Mistral v0.3 renders the system
    message in the last user turn only when it is the last message: a prompt that is no prefix of
    the conversation, refused with or without tools, so none there.)"""
    builder, tokenizer = templated(name)
    system = [{"role": "system", "content": "You are terse."}] if name != "mistral_v0_3" else []
    rows = [{"messages": (system if i % 2 else []) + ask(i), "tools": tools}
            for i, tools in enumerate([[WEATHER, SEARCH], json.dumps([SEARCH]), None, [], [WEATHER]])]
    result = check(builder, tokenizer, write_lines(tmp_path / "rows.jsonl", rows), {**CHAT, "tools": "tools"}, rows)
    assert report(result)["bad_rows"] == 0


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


def test_adapter_and_merged_model_directories_keep_the_tool_use_template(tmp_path):
    """The tokenizer files saved beside an adapter or merged weights include the tool_use template
    (part of the tokenizer's hash): the saved model renders a call with tools as the build did."""
    from packtrain.core.contract import tokenizer_fingerprint
    from packtrain.trainer.adapters import save_adapter_extras

    source = tmp_path / "tokenizer"
    (source / "additional_chat_templates").mkdir(parents=True)
    (source / "tokenizer.json").write_text("{}")
    (source / "additional_chat_templates" / "tool_use.jinja").write_text("{{ tools }}")
    (tmp_path / "adapter").mkdir()  # where save_pretrained wrote the weights
    save_adapter_extras(tmp_path / "adapter", {}, source)
    assert (tmp_path / "adapter" / "additional_chat_templates" / "tool_use.jinja").read_text() == "{{ tools }}"
    assert tokenizer_fingerprint(tmp_path / "adapter") == tokenizer_fingerprint(source)
    assert "additional_chat_templates/tool_use.jinja" in tokenizer_fingerprint(source)["files"]


def test_prompt_completion_one_document_per_turn_with_tools_and_kwargs(qwen, tmp_path):
    """A two-exchange prompt and its completion, with tools and enable_thinking: false, one document
    per assistant turn: the completion's turn alone, apply_chat_template's with both."""
    builder, tokenizer = qwen
    chat = ask(0) + [{"role": "user", "content": "And tomorrow?"}, {"role": "assistant", "content": "Rain."}]
    data = write_lines(tmp_path / "rows.jsonl", [{"prompt": chat[:3], "completion": chat[3:], "tools": [WEATHER]}])
    fmt = {"style": "chat", "preset": "prompt_completion", "tools": "tools", "each_assistant_turn": True,
           "chat_template_kwargs": {"enable_thinking": False}}
    result = builder.build(data, fmt)
    assert shards(result) == shards(builder.build(data, fmt, **SHORTCUTS_OFF))
    assert documents(result) == expected_turns(tokenizer, chat, [WEATHER], [3], enable_thinking=False)
