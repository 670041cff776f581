"""Tools and template variables by the real templates (tests/chat_templates/ on Qwen3's tokenizer): an empty
tool list, a tokenizer's ``tool_use`` template, multi-turn tool conversations, and
``format.chat_template_kwargs`` (every YAML value, the generation prompt, the refusals), against
``apply_chat_template``."""

from __future__ import annotations

import json

import pytest

from build_fixtures import packed_documents as documents
from format_fixtures import (CHAT, SEARCH, SHORTCUTS_OFF, WEATHER, Builder, ask, check, conversations,
                             expected_turns, quiet, report, shards, tool_rows, write_lines)
from packtrain.core.config import ConfigError
from packtrain.core.configfile import config_from_dict
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.errors import BuildError

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


def test_adapter_and_merged_model_directories_keep_the_tool_use_template(tmp_path):
    """The tokenizer files saved beside an adapter or merged weights include the tool_use template
    (part of the tokenizer's hash): the saved model renders a call with tools as the build did."""
    from packtrain.core.tokenizer_files import tokenizer_fingerprint
    from packtrain.trainer.model.adapters import save_adapter_extras

    source = tmp_path / "tokenizer"
    (source / "additional_chat_templates").mkdir(parents=True)
    (source / "tokenizer.json").write_text("{}")
    (source / "additional_chat_templates" / "tool_use.jinja").write_text("{{ tools }}")
    (tmp_path / "adapter").mkdir()  # where save_pretrained wrote the weights
    save_adapter_extras(tmp_path / "adapter", {}, source)
    assert (tmp_path / "adapter" / "additional_chat_templates" / "tool_use.jinja").read_text() == "{{ tools }}"
    assert tokenizer_fingerprint(tmp_path / "adapter") == tokenizer_fingerprint(source)
    assert "additional_chat_templates/tool_use.jinja" in tokenizer_fingerprint(source)["files"]


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
    from packtrain.pipeline.orchestrate.build import plan

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


def test_generates_prompt_is_the_prompt_the_build_wrote_with_the_kwargs(qwen, tmp_path):
    """``packtrain generate``/``chat`` render the prompt with format.chat_template_kwargs, as the build
    did: a validation row's prompt ids (up to its first trained token) are generation_prompt's."""
    from tokenizers import Tokenizer

    from packtrain.core.configfile import config_from_dict
    from packtrain.core.contract import Manifest
    from packtrain.core.shardfile import open_shard
    from packtrain.pipeline.encode.tokenizer_info import load_tokenizer_info
    from packtrain.pipeline.format.generation_prompt import generation_prompt

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


def test_chat_template_kwargs_reach_every_render_as_apply_chat_template_passes_them(real_builder):
    """``format.chat_template_kwargs: {enable_thinking: false}`` under Qwen3: its generation prompt ends
    with an empty <think> block, so the answer alone is trained on (without it, the empty block is part
    of the answer); the ids are apply_chat_template's with the same kwargs, shortcuts on or off, the
    tools beside them."""
    from transformers import AutoTokenizer

    builder = real_builder("qwen3")
    tokenizer = AutoTokenizer.from_pretrained(str(builder.tokenizer))
    rows = tool_rows()[3:]  # tools as JSON text, none, and "[]"
    data = builder.root / "kwargs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    fmt = {**CHAT, "tools": "tools", "chat_template_kwargs": {"enable_thinking": False}}
    result = builder.build(data, fmt)
    assert shards(result) == shards(builder.build(data, fmt, fast_encoder=False, line_cache=False, render_once=False))
    expected = [doc for row in rows for doc in expected_turns(
        tokenizer, row["messages"], [WEATHER] if row["tools"] not in (None, "[]") else None, [1], enable_thinking=False)]
    assert sorted(documents(result)) == sorted(expected)
    trained = [tokenizer.decode([t for t, m in zip(ids, mask) if m]) for ids, mask in documents(result)]
    assert sorted(trained) == ["Sunny 3.<|im_end|>", "Sunny 4.<|im_end|>", "Sunny 5.<|im_end|>"]
    thinking = [tokenizer.decode([t for t, m in zip(ids, mask) if m]) for ids, mask in documents(builder.build(
        data, {**CHAT, "tools": "tools"}))]
    assert sorted(thinking)[0] == "<think>\n\n</think>\n\nSunny 3.<|im_end|>"


def test_chat_template_kwargs_are_checked_when_the_config_loads():
    def load(fmt):
        return config_from_dict({"expert": "x", "sources": [{"name": "d"}], "format": fmt, "model": {"name": "m"}})

    with pytest.raises(ConfigError, match=r"format.chat_template_kwargs: only used with style: chat"):
        load({"chat_template_kwargs": {"enable_thinking": False}})
    with pytest.raises(ConfigError, match=r"format.chat_template_kwargs: 'tools' is each row's, from the column "
                                          "format.tools names; remove it"):
        load({**CHAT, "chat_template_kwargs": {"tools": []}})
    assert load({**CHAT, "chat_template_kwargs": {"enable_thinking": False}}).format.chat_template_kwargs == {
        "enable_thinking": False}


def test_a_chat_template_kwarg_the_template_never_reads_is_refused_before_tokenizing(tiny):
    """A misspelt name, or another model's variable (``enable_thinking`` under a template without it),
    would change nothing: one line naming it and what the template reads, nothing built."""
    with pytest.raises(BuildError) as e:
        tiny.build([{"messages": conversations(False)[0]}], {**CHAT, "chat_template_kwargs": {"enable_thinkng": False}})
    assert "\n" not in str(e.value) and str(e.value).startswith(
        f"format.chat_template_kwargs: the chat template of {tiny.tokenizer} never reads 'enable_thinkng', so it "
        "would change nothing; remove it or correct its name (the template reads: ")



def test_each_rows_own_kwargs_reach_its_renders_as_trl_passes_its_column(real_builder):
    """``format.chat_template_kwargs_column``: each row's own variables (a mapping, its JSON text, or none)
    over format.chat_template_kwargs, as TRL passes a row's ``chat_template_kwargs``: under Qwen3 the
    rows with ``enable_thinking: false`` train on the answer alone, the others on the empty <think>
    block too; a row setting a variable the build sets, one the template never reads, or no mapping is
    a one-line bad row naming the column."""
    from transformers import AutoTokenizer

    builder = real_builder("qwen3")
    tokenizer = AutoTokenizer.from_pretrained(str(builder.tokenizer))
    ask = lambda i: [{"role": "user", "content": f"Rows in t{i}?"}, {"role": "assistant", "content": f"SELECT {i}"}]  # noqa: E731
    own = [{"enable_thinking": False}, json.dumps({"enable_thinking": False}), None, "", {"enable_thinking": True}]
    rows = [{"messages": ask(i), "kw": value} for i, value in enumerate(own)]
    data = builder.root / "row-kwargs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    fmt = {**CHAT, "chat_template_kwargs_column": "kw"}
    result = builder.build(data, fmt)
    assert shards(result) == shards(builder.build(data, fmt, fast_encoder=False, line_cache=False, render_once=False))
    expected = [doc for row, value in zip(rows, own) for doc in expected_turns(
        tokenizer, row["messages"], None, [1], **(json.loads(value) if isinstance(value, str) and value else value or {}))]
    assert sorted(documents(result)) == sorted(expected)
    trained = sorted(tokenizer.decode([t for t, m in zip(ids, mask) if m]) for ids, mask in documents(result))
    assert trained == ["<think>\n\n</think>\n\nSELECT 2<|im_end|>", "<think>\n\n</think>\n\nSELECT 3<|im_end|>",
                       "<think>\n\n</think>\n\nSELECT 4<|im_end|>", "SELECT 0<|im_end|>", "SELECT 1<|im_end|>"]
    bad = [{"messages": ask(0), "kw": {"tools": []}}, {"messages": ask(1), "kw": {"xml_tools": "x"}},
           {"messages": ask(2), "kw": ["enable_thinking"]}, {"messages": ask(3), "kw": "{not json"}]
    whys = ("'kw' sets 'tools', which is each row's, from the column format.tools names; remove it from the rows",
            "'kw' sets 'xml_tools', which the chat template never reads, so it would change nothing; remove it",
            "'kw' is list, expected a mapping of chat template variables",
            "'kw' is text but not JSON; expected a mapping of chat template variables")
    for row, why in zip(bad, whys):  # the build's error names the first rows only: one row per build
        data.write_text(json.dumps(row) + "\n")
        with pytest.raises(BuildError) as e:
            builder.build(data, fmt)
        assert "\n" not in str(e.value) and why in str(e.value), why


def test_the_kwargs_column_needs_a_conversation_column():
    with pytest.raises(ConfigError, match="format.chat_template_kwargs_column: only used with format.messages"):
        config_from_dict({"expert": "x", "sources": [{"name": "d"}], "model": {"name": "m"},
                          "format": {"style": "chat", "chat_template_kwargs_column": "kw"}})


def test_a_tool_use_template_that_renders_the_date_puts_the_day_in_the_build(templated):
    """The date is part of a build whose rows with tools are rendered by a ``tool_use`` template that
    renders today's date (Llama 3.2's does), even where the default template renders none."""
    from pathlib import Path

    from real_tokenizers import CHATML

    from packtrain.pipeline.orchestrate.build import plan_inputs

    llama = (Path(__file__).parent / "chat_templates" / "llama3_2.jinja").read_text()
    builder, _ = templated("dated-tool-use", [{"name": "default", "template": CHATML},
                                              {"name": "tool_use", "template": llama}])
    data = write_lines(builder.root / "rows.jsonl", [{"messages": ask(0), "tools": [WEATHER]}])
    assert "chat_date" in plan_inputs(builder.config(data, {**CHAT, "tools": "tools"}))[2]
