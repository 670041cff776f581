"""Hostile inputs to the dataset formats (docs/DATASETS.md): config mistakes an axolotl or TRL user
makes, rows ShareGPT dumps hold, row filters on columns they cannot read. Each is refused by config
validation or as a bad row with a one-line message naming the field and the fix, and the one-render
shortcut judges every row as the exact rendering does (tests/test_dataset_formats.py builds the
formats themselves)."""

from __future__ import annotations

import json

import pytest

from build_fixtures import make_tokenizer, packed_documents as documents, seed_decision, write_jsonl
from packtrain.core.config import ConfigError
from packtrain.core.configfile import config_from_dict
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.read.discover import SourceError
from packtrain.pipeline.encode.tokenizer_info import load_tokenizer_info
from packtrain.pipeline.errors import BuildError
from packtrain.pipeline.format.format import BadRow, RowFormatter


def config_errors(fmt: dict) -> list[str]:
    with pytest.raises(ConfigError) as e:
        config_from_dict({"expert": "x", "sources": [{"name": "bundled"}], "format": fmt})
    return str(e.value).splitlines()[1:] or [str(e.value).split(": ", 1)[1]]


def test_a_role_value_under_two_roles_and_one_key_for_role_and_content_are_config_errors():
    """Unchecked, the role value went to whichever role came last, and role and content read from one
    key made every row bad with a message about the template."""
    assert config_errors({"style": "chat", "preset": "sharegpt", "roles": {"user": ["human", "gpt"],
                                                                          "assistant": ["gpt"]},
                          "message_property_mappings": {"role": "from", "content": "from"}}) == [
        "  - format.message_property_mappings: role and content both read the key 'from'; name the key holding each",
        "  - format.roles: 'gpt' is listed under both user and assistant; list each of the data's role values under "
        "one role"]
    assert config_errors({"style": "chat", "messages": "m", "message_property_mappings": {"content": "role"}}) == [
        "format.message_property_mappings: role and content both read the key 'role'; name the key holding each"]


def test_a_preset_of_template_columns_with_a_conversation_column_names_the_preset():
    """The user wrote no prompt or answer: the preset did, so the message names the preset."""
    assert config_errors({"style": "chat", "preset": "alpaca", "messages": "conversations"}) == [
        "format.preset: alpaca reads prompt/answer columns, not a conversation column; remove format.messages or "
        "the preset"]


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("attacks")
    seed_decision(root / "cache", make_tokenizer(root / "model"))  # the fast-encoder decision, proved once per run
    return root, json.loads((root / "model" / "tokenizer_config.json").read_text())


def formatter(fmt: dict, tokenizer, render_once: bool = False) -> RowFormatter:
    """A RowFormatter of ``fmt`` over ``tokenizer``: a tokenizer_config.json's dict, or a TokenizerInfo."""
    config = config_from_dict({"expert": "x", "sources": [{"name": "bundled"}], "format": fmt})
    get = tokenizer.get if isinstance(tokenizer, dict) else lambda name: getattr(tokenizer, name)
    return RowFormatter(config.format, chat_template=get("chat_template"), bos_token=get("bos_token"),
                        eos_token=get("eos_token"), render_once=render_once)


def test_a_content_key_the_messages_lack_is_named_with_the_mapping_to_set(tiny_tokenizer):
    """``content: text`` on ShareGPT rows (whose text is under ``value``): the row said it had "neither
    content nor tool_calls", not which key was looked for."""
    sharegpt = formatter({"style": "chat", "preset": "sharegpt", "message_property_mappings":
                          {"role": "from", "content": "text"}}, tiny_tokenizer[1])
    with pytest.raises(BadRow) as e:
        sharegpt({"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]})
    assert str(e.value) == ("'conversations' message 0 has no 'text' key (got {'from': 'human', 'value': 'Hi'}); "
                            "set format.message_property_mappings content: to the key holding the text")


def test_where_on_a_column_of_objects_is_refused_not_an_empty_build(tiny_tokenizer):
    """``equals`` on a column of objects kept no row, and the build said only that the filter kept none."""
    root = tiny_tokenizer[0]
    data = write_jsonl(root / "nested" / "rows.jsonl", [{"meta": {"lang": "en" if i % 2 else "fr"},
                                                         "prompt": f"Q{i}", "answer": f"A{i}"} for i in range(4)])
    config = config_from_dict({"expert": "x", "model": {"name": str(root / "model")}, "build": {"num_proc": 1},
                               "sources": [{"name": str(data), "where": [{"column": "meta", "equals": "en"}]}]})
    with pytest.raises(BuildError) as e:
        build(config, root / "cache", log=lambda *_: None, progress=False)
    assert str(e.value) == (
        "sources[0].where[0]: column 'meta' holds objects (e.g. {'lang': 'fr'}), and the condition compares with text "
        "('en'); equals and one_of compare a column's own text, number or boolean, not the fields inside it: name a "
        "column holding the value itself (not_empty works on any column)")
    assert not (root / "cache" / "x").exists() or not any((root / "cache" / "x").glob("*/manifest.json"))
    config.sources[0].where[0].column = "meta.lang"  # axolotl-style dotted path: no such column, and said why
    with pytest.raises(SourceError) as e:
        build(config, root / "cache", log=lambda *_: None, progress=False)
    assert str(e.value).endswith("sources[0].where names the column 'meta.lang', which source " + str(data) + " does "
                                 "not have; name one of its columns in the condition (a condition reads a column "
                                 "itself, not a field inside one)")


OPENS_WITH_AN_ANSWER = {"conversations": [{"from": "gpt", "value": "Hello, how can I help?"},
                                          {"from": "human", "value": "Count t."},
                                          {"from": "gpt", "value": "SELECT COUNT(*) FROM t"}]}


def test_a_conversation_opening_with_an_answer_is_judged_alike_with_and_without_render_once(real_tokenizer):
    """ShareGPT dumps hold conversations that open with the model's greeting. SmolLM2's template puts
    its default system prompt before a conversation, not before no message at all, so the exact way
    cannot find the opening turn's start and refuses the row; the one-render shortcut kept it, the
    build's check saw the difference and turned the shortcut off for that template, remembered, for
    every later build. Both ways now refuse it, saying how to fix it; format.system makes it a row."""
    tokenizer = load_tokenizer_info(real_tokenizer("smollm2"))
    fmt = {"style": "chat", "preset": "sharegpt"}
    for once in (False, True):
        with pytest.raises(BadRow) as e:
            formatter(fmt, tokenizer, render_once=once)(OPENS_WITH_AN_ANSWER)
        assert str(e.value).endswith("assistant turn 0 of 'conversations' as a prefix of the whole conversation (its "
                                     "generation prompt or an earlier turn renders differently), so its span cannot be "
                                     "found; open the conversation with a system or user message (format.system adds "
                                     "one)")
    with_system = {**fmt, "system": "You write SQL."}
    docs = [formatter(with_system, tokenizer, render_once=once)(OPENS_WITH_AN_ANSWER) for once in (False, True)]
    assert docs[0] == docs[1] and [docs[0].text[a:b] for a, b in docs[0].spans] == [
        "Hello, how can I help?<|im_end|>", "SELECT COUNT(*) FROM t<|im_end|>"]


def test_a_conversation_qwen3_renders_otherwise_at_its_end_is_refused_pointing_at_each_assistant_turn(real_tokenizer):
    """Qwen3 drops an answer's empty <think> block once a user turn follows it: the refusal names the
    setting that trains such a conversation."""
    tokenizer = load_tokenizer_info(real_tokenizer("qwen3"))
    row = {"conversations": [{"from": "human", "value": "Count t."}, {"from": "gpt", "value": "SELECT COUNT(*) FROM t"},
                             {"from": "human", "value": "Thanks"}]}
    with pytest.raises(BadRow) as e:
        formatter({"style": "chat", "preset": "sharegpt"}, tokenizer)(row)
    assert str(e.value).endswith("so its span cannot be found; set format.each_assistant_turn: true "
                                 "(docs/DATASETS.md), or use a template that renders turns the same whatever follows")
    docs = formatter({"style": "chat", "preset": "sharegpt", "each_assistant_turn": True}, tokenizer).documents(row)
    assert [doc.text[slice(*doc.spans[0])] for doc in docs] == ["<think>\n\n</think>\n\nSELECT COUNT(*) FROM t<|im_end|>"]


ALPACA_NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately completes "
                   "the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")


def test_alpaca_rows_without_an_input_column_build_with_the_prompt_without_input(tiny_tokenizer):
    """Many alpaca-style datasets have no ``input`` column at all; axolotl reads their rows as rows
    without input. It was refused ("no column 'input'", with a fix about template columns)."""
    root = tiny_tokenizer[0]
    rows = [{"instruction": f"Name table {i}.", "output": f"t{i}"} for i in range(6)]
    results = []
    for n, fmt in enumerate(({"preset": "alpaca"}, {"prompt": ALPACA_NO_INPUT, "answer": "{output}"})):
        data = write_jsonl(root / f"alpaca-{n}" / "rows.jsonl", rows)
        config = config_from_dict({"expert": "x", "model": {"name": str(root / "model")}, "format": fmt,
                                   "build": {"num_proc": 1}, "sources": [{"name": str(data)}]})
        results.append(build(config, root / "cache", log=lambda *_: None, progress=False))
    assert [sorted(documents(result)) for result in results[:1]] == [sorted(documents(results[1]))]
    assert json.loads((results[0].path / "report.json").read_text())["bad_rows"] == 0


def test_conversational_prompt_completion_under_style_template_is_refused_not_trained_as_json(tiny_tokenizer):
    """TRL tells the two forms of prompt/completion apart by itself; here style says which. Under the
    default style template, lists of messages were printed as JSON text and trained on."""
    pc = formatter({"preset": "prompt_completion"}, tiny_tokenizer[1])
    with pytest.raises(BadRow) as e:
        pc({"prompt": [{"role": "user", "content": "Hi"}], "completion": [{"role": "assistant", "content": "Yo"}]})
    assert str(e.value) == ("field 'completion' holds a conversation (messages with roles), not text; conversations "
                            "need format.style: chat (with format.messages or a preset)")
    assert pc({"prompt": "Hi ", "completion": "Yo"}).text == "Hi Yo"
    # a column of other JSON (a list of objects without roles) is still printed as JSON text
    assert formatter({"prompt": "{q}", "answer": "{a}"}, tiny_tokenizer[1])({"q": "Q", "a": [{"k": 1}]}).text == \
        'Q[{"k":1}]'


def test_a_filter_that_keeps_no_row_names_the_source_and_what_to_loosen(tiny_tokenizer):
    root = tiny_tokenizer[0]
    data = write_jsonl(root / "kept-none" / "rows.jsonl", [{"prompt": f"Q{i}", "answer": f"A{i}", "n": i}
                                                            for i in range(5)])
    config = config_from_dict({"expert": "x", "model": {"name": str(root / "model")}, "build": {"num_proc": 1},
                               "sources": [{"name": str(data), "where": [{"column": "n", "one_of": [7, 8]}]}]})
    with pytest.raises(BuildError) as e:
        build(config, root / "cache", log=lambda *_: None, progress=False)
    assert str(e.value) == ("the build of 'x' has no training blocks: 0 of 5 rows were bad, 5 filtered out by "
                            "sources[].where (sources[0].where kept none of its 5 rows); loosen its conditions to "
                            "match the values the column holds")


def test_a_field_prompt_no_input_leaves_out_may_be_in_the_answer(tiny_tokenizer):
    """The answer may name the optional field too: a row that leaves it empty crashed the build with a
    KeyError (the field was dropped from the values the answer is formatted with); it is "" there."""
    fmt = {"prompt": "{instruction} | {input}\n", "prompt_no_input": "{instruction}\n", "answer": "{output} ({input})"}
    rows = formatter(fmt, tiny_tokenizer[1])
    assert [rows({"instruction": "a", "input": value, "output": "c"}).text for value in ("b", "", None)] == [
        "a | b\nc (b)", "a\nc ()", "a\nc ()"]


def test_nan_and_infinite_numbers_in_a_field_are_bad_rows_not_the_text_nan(tiny_tokenizer):
    """JSON lines may hold NaN, Infinity or a number past a float's range (json.loads reads them as
    floats): the row trained on the text "nan" or "inf". Each is a bad row naming the field."""
    root = tiny_tokenizer[0]
    data = root / "nan" / "rows.jsonl"
    data.parent.mkdir()
    data.write_text('{"prompt": "Q0", "answer": 2.5}\n{"prompt": "Q1", "answer": NaN}\n'
                    '{"prompt": "Q2", "answer": -Infinity}\n{"prompt": "Q3", "answer": 1e400}\n'
                    '{"prompt": "Q4", "answer": [1, NaN]}\n{"prompt": "Q5", "answer": "ok"}\n')
    config = config_from_dict({"expert": "x", "model": {"name": str(root / "model")}, "build": {"num_proc": 1},
                               "format": {"prompt": "{prompt}\n", "answer": "{answer}"}, "sources": [{"name": str(data)}]})
    report = json.loads((build(config, root / "cache", log=lambda *_: None, progress=False).path / "report.json").read_text())
    assert [(bad["row"].rsplit("#", 1)[1], bad["reason"]) for bad in report["sources"][0]["first_bad_rows"]] == [
        ("1", "field 'answer' is nan, not a finite number (a NaN, Infinity or out-of-range number in the data); fix "
              "that value in the data"),
        ("2", "field 'answer' is -inf, not a finite number (a NaN, Infinity or out-of-range number in the data); fix "
              "that value in the data"),
        ("3", "field 'answer' is inf, not a finite number (a NaN, Infinity or out-of-range number in the data); fix "
              "that value in the data"),
        ("4", "field 'answer' holds a NaN or infinite number, which JSON has no text for; fix that value in the data")]
    assert report["bad_rows"] == 4 and report["sources"][0]["documents"] == 2


def test_a_format_spec_for_numbers_formats_a_number_column(tiny_tokenizer):
    """``{price:.2f}`` made every row bad ("Unknown format code 'f' for object of type 'str'"): the
    values were text before the spec was applied. A spec a string takes gives what it gave."""
    rows = formatter({"prompt": "{item} at {price:.2f} x{n:,} [{n:>8}] [{n:8}] #{n:08} {price!r}\n",
                      "answer": "{total:.0%}"}, tiny_tokenizer[1])
    # {n:8} right-aligns and {n:08} zero-pads the number, as str.format does with it (as text: "12345   ", "12345000")
    assert rows({"item": "tea", "price": 3.14159, "n": 12345, "total": 0.875}).text == \
        "tea at 3.14 x12,345 [   12345] [   12345] #00012345 '3.14159'\n88%"
    # text under a number's spec (a CSV cell is text): a bad row naming the field and the fix; it was the worker's
    # "template error: Unknown format code 'f' for object of type 'str'", naming neither
    with pytest.raises(BadRow, match=r"^field 'price' is text \('cheap'\), which the format spec '.2f' of "
                                     r"'\{price:.2f\}' does not take \(Unknown format code 'f' for object of type "
                                     r"'str'\); CSV and TSV cells are text: remove the spec from the template, or "
                                     r"give the column as numbers \(JSON lines, Parquet\)$"):
        rows({"item": "tea", "price": "cheap", "n": 1, "total": 0.5})
