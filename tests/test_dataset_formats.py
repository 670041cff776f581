"""Dataset formats by configuration (issue 26, item 4): ShareGPT through message key and role
mappings, TRL's prompt/completion (plain and conversational), alpaca, the row filter
``sources[].where`` and one document per assistant turn. Each builds a small fixture and matches
the equivalent ``messages`` (or hand-written template) build token for token, on the real tokenizers
where the chat template matters (tests/real_tokenizers.py)."""

from __future__ import annotations

import json
import shutil

import pytest

from build_fixtures import packed_documents as documents, seed_decision, write_jsonl
from build_fixtures import rows as sql_rows
from format_fixtures import CHAT, conversations, quiet, report, shards
from packtrain.core.config import ConfigError
from packtrain.core.configfile import config_from_dict
from packtrain.pipeline.orchestrate.build import SOURCES, build, plan
from packtrain.pipeline.read.discover import SourceError
from packtrain.pipeline.errors import BuildError
from packtrain.pipeline.format.format import RowFormatter
from packtrain.pipeline.orchestrate.partition import PARTS, merge, pretokenize_part

SHAREGPT_ROLE = {"system": "system", "user": "human", "assistant": "gpt"}


def sharegpt(messages: list[dict]) -> list[dict]:
    return [{"from": SHAREGPT_ROLE[m["role"]], "value": m["content"]} for m in messages]


@pytest.mark.parametrize("name", ["smollm2", "qwen3", "qwen2"])
def test_sharegpt_builds_the_bytes_of_the_same_conversations_as_messages(real_builder, name):
    builder = real_builder(name)
    chats = conversations(multi_turn=name != "qwen3")  # Qwen3 renders earlier turns otherwise: see below
    as_messages = builder.build([{"messages": c} for c in chats], CHAT)
    as_sharegpt = builder.build([{"conversations": sharegpt(c)} for c in chats], {"style": "chat", "preset": "sharegpt"})
    assert shards(as_sharegpt) == shards(as_messages)
    assert report(as_sharegpt)["train"]["documents"] == 8 and report(as_sharegpt)["bad_rows"] == 0
    assert as_sharegpt.build_id != as_messages.build_id


def test_any_key_and_role_names_map_onto_messages(tiny):
    chats = conversations(multi_turn=True)
    names = {"system": "sys", "user": "person", "assistant": "bot"}
    rows = [{"chat": [{"speaker": names[m["role"]], "text": m["content"]} for m in c]} for c in chats]
    fmt = {"style": "chat", "messages": "chat", "message_property_mappings": {"role": "speaker", "content": "text"},
           "roles": {"system": ["sys"], "user": ["person"], "assistant": ["bot"]}}
    as_messages = tiny.build([{"messages": c} for c in chats], CHAT)
    mapped = tiny.build(rows, fmt)
    assert shards(mapped) == shards(as_messages) and report(mapped)["train"]["documents"] == 8
    # keys besides the mapped two are kept, and refused like any field the template does not render
    rows[0]["chat"][1]["lang"] = "en"
    source = report(tiny.build(rows, fmt))["sources"][0]
    assert (source["documents"], source["bad_rows"]) == (7, 1)
    assert source["first_bad_rows"][0]["reason"].startswith(
        "'chat' message 1 (user) has a field 'lang' that the chat template does not render")


def test_a_role_no_mapping_names_is_a_one_line_error_naming_the_row_value_and_field(tiny):
    chats = [sharegpt(c) for c in conversations(multi_turn=False)[:2]]
    chats[1][-1]["from"] = "bot"
    with pytest.raises(BuildError) as e:
        tiny.build([{"conversations": c} for c in chats], {"style": "chat", "preset": "sharegpt"},
                   on_bad_rows="error")
    assert str(e.value) == (
        "bad row " + str(tiny.root / f"data-{tiny.n}" / "rows.jsonl") + ":rows.jsonl#1: 'conversations' message 1 has "
        "the role 'bot', which format.roles does not map (system: [system], user: [human, user], assistant: [gpt, "
        "assistant], tool: [tool]); add it to the list of the role it stands for in format.roles "
        "(set build.on_bad_rows: skip to skip and count such rows)")


def test_mapping_fields_are_checked_when_the_config_loads():
    with pytest.raises(ConfigError) as e:
        config_from_dict({"expert": "x", "sources": [{"name": "bundled"}],
                          "format": {"preset": "sharegpt", "message_property_mappings": {"speaker": "from"},
                                     "roles": {"bot": ["gpt"]}}})
    assert str(e.value).splitlines()[1:] == [
        "  - format.preset: sharegpt holds conversations, which need style: chat",
        "  - format.messages: a conversation column needs style: chat",
        "  - format.message_property_mappings: 'speaker' is not role or content",
        "  - format.roles: 'bot' is not one of system, user, assistant, tool"]


def test_axolotls_names_for_the_format_fields_say_which_field_to_write():
    with pytest.raises(ConfigError) as e:
        config_from_dict({"expert": "x", "sources": [{"name": "bundled"}], "format": {"no_input_format": "{a}"}})
    assert str(e.value).startswith("invalid config (<dict>): format.no_input_format: unknown key (did you mean "
                                   "prompt_no_input?)")


@pytest.mark.parametrize("name", ["smollm2", "qwen3"])
def test_conversational_prompt_completion_builds_the_bytes_of_the_same_messages(real_builder, name):
    builder = real_builder(name)
    chats = conversations(multi_turn=False)
    as_messages = builder.build([{"messages": c} for c in chats], CHAT)
    split = builder.build([{"prompt": c[:-1], "completion": c[-1:]} for c in chats],
                          {"style": "chat", "preset": "prompt_completion"})
    assert shards(split) == shards(as_messages)
    assert report(split)["train"]["documents"] == 8 and report(split)["bad_rows"] == 0


def test_the_prompts_assistant_turns_are_not_trained_on(tiny):
    """TRL's conversational prompt/completion: the loss is on the completion only, where the messages
    build trains every assistant turn."""
    chat = conversations(multi_turn=True)[1]
    config = tiny.config([{"x": 1}], {"style": "chat", "preset": "prompt_completion"})
    tokenizer = json.loads((tiny.tokenizer / "tokenizer_config.json").read_text())
    for once in (False, True):
        formatter = RowFormatter(config.format, chat_template=tokenizer["chat_template"],
                                 eos_token=tokenizer["eos_token"], render_once=once)
        whole = RowFormatter(tiny.config([{"x": 1}], CHAT).format, chat_template=tokenizer["chat_template"],
                             eos_token=tokenizer["eos_token"], render_once=once)({"messages": chat})
        doc = formatter({"prompt": chat[:-1], "completion": chat[-1:]})
        assert (doc.text, doc.spans) == (whole.text, whole.spans[1:]) and len(whole.spans) == 2
    with pytest.raises(Exception, match="'prompt' is text, not a list of messages: plain prompt/completion strings "
                                        "need format.style: template"):
        formatter({"prompt": "Hi", "completion": "Yo"})


def test_plain_prompt_completion_builds_the_bytes_of_the_hand_written_template(tiny):
    rows = [{"prompt": f"Q{i}: how many in t{i}?\n", "completion": f"SELECT COUNT(*) FROM t{i}"} for i in range(8)]
    preset = tiny.build(rows, {"preset": "prompt_completion"})
    hand = tiny.build(rows, {"prompt": "{prompt}", "answer": "{completion}"})
    assert shards(preset) == shards(hand) and report(preset)["train"]["documents"] == 8


ALPACA = ("Below is an instruction that describes a task, paired with an input that provides further context. "
          "Write a response that appropriately completes the request.\n\n"
          "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
ALPACA_NO_INPUT = ("Below is an instruction that describes a task. Write a response that appropriately completes "
                   "the request.\n\n### Instruction:\n{instruction}\n\n### Response:\n")


def test_alpaca_builds_the_documents_of_the_hand_written_prompts_with_and_without_input(tiny):
    with_input = [{"instruction": f"Count the rows of t{i}.", "input": f"CREATE TABLE t{i} (a INT)",
                   "output": f"SELECT COUNT(*) FROM t{i}"} for i in range(5)]
    without = [{"instruction": f"Name table {i}.", "input": "" if i % 2 else None, "output": f"t{i}"} for i in range(4)]
    alpaca = tiny.build(with_input + without, {"preset": "alpaca"})
    hand = tiny.build(with_input, {"prompt": ALPACA, "answer": "{output}"})
    hand_no_input = tiny.build(without, {"prompt": ALPACA_NO_INPUT, "answer": "{output}"})
    assert sorted(documents(alpaca)) == sorted(documents(hand) + documents(hand_no_input))
    assert report(alpaca)["train"]["documents"] == 9 and report(alpaca)["bad_rows"] == 0


TEXT2CYPHER = """\
question,cypher,type,syntax_error
"Who acted in Heat?","MATCH (p)-[:ACTED_IN]->(m {title: 'Heat'}) RETURN p",simple,False
"Bad one","MATCH (",simple,True
"Films of 1999?","MATCH (m {year: 1999}) RETURN m",complex,False
"No cypher","",simple,False
"Genres?","MATCH (g:Genre) RETURN g",aggregation,False
"Oldest film?","MATCH (m) RETURN m ORDER BY m.year LIMIT 1",complex,False
"Broken","RETURN",complex,True
"Directors?"," ",simple,False
"""


def test_where_keeps_the_rows_whose_columns_match_and_counts_the_rest(tiny, capsys):
    data = tiny.root / "text2cypher.csv"
    data.write_text(TEXT2CYPHER)
    fmt = {"prompt": "### Question\n{question}\n### Cypher\n", "answer": "{cypher}"}
    with pytest.raises(BuildError) as e:  # a CSV's cells are text: a boolean would keep nothing
        tiny.build(data, fmt, {"where": [{"column": "syntax_error", "equals": False}]})
    assert str(e.value) == ("sources[0].where[0]: column 'syntax_error' holds text (e.g. 'False'), and the condition "
                            "compares with a boolean (False); write the value as the column holds it (e.g. 'False')")
    where = [{"column": "syntax_error", "equals": "False"}, {"column": "type", "one_of": ["simple", "complex"]}]
    result = tiny.build(data, fmt, {"where": where})
    source = report(result)["sources"][0]
    # kept by the filter: rows 0, 2, 3, 5, 7; rows 3 and 7 have no cypher (bad rows, named as read)
    assert (source["rows"], source["filtered_rows"], source["documents"], source["bad_rows"]) == (8, 3, 3, 2)
    assert [bad["row"].rsplit(":", 1)[1] for bad in source["first_bad_rows"]] == ["text2cypher.csv#3",
                                                                                   "text2cypher.csv#7"]
    strict = tiny.build(data, fmt, {"where": where + [{"column": "cypher", "not_empty": True}]})
    source = report(strict)["sources"][0]
    assert (source["rows"], source["filtered_rows"], source["documents"], source["bad_rows"]) == (8, 5, 3, 0)
    assert shards(strict) == shards(result) and strict.build_id != result.build_id
    from packtrain.pipeline.pack.report import summary

    assert f"  source {data}: where: dropped 5 of 8 rows" in summary(report(strict)).splitlines()
    with pytest.raises(SourceError) as e:
        tiny.build(data, fmt, {"where": [{"column": "syntax_eror", "equals": False}]})
    assert str(e.value) == (f"{data}: no column 'syntax_eror' (did you mean 'syntax_error'?) (it has: 'question', 'cypher', 'type', 'syntax_error'); "
                            f"sources[0].where names the column 'syntax_eror', which source {data} does not have; "
                            "name one of its columns in the condition")


def test_a_where_condition_needs_exactly_one_test():
    with pytest.raises(ConfigError) as e:
        config_from_dict({"expert": "x", "sources": [{"name": "bundled", "where": [
            {"column": "a"}, {"column": "b", "equals": 1, "not_empty": True}, {"column": "c", "equals": [1]},
            {"column": "d", "one_of": [1.5, float("nan")]}]}]})
    assert str(e.value).splitlines()[1:] == [
        "  - sources[0].where[0]: give exactly one of equals, one_of, not_empty: true (got none)",
        "  - sources[0].where[1]: give exactly one of equals, one_of, not_empty: true (got equals, not_empty)",
        "  - sources[0].where[2]: compare with strings, numbers or booleans (got [[1]]); use not_empty for null",
        "  - sources[0].where[3]: .nan equals no value, not even a NaN in the data, so the condition would keep no row; "
        "use not_empty, or compare with the values the column holds"]


def test_each_new_field_is_part_of_the_build_id_and_configs_without_them_hash_as_before(tiny):
    rows = tiny.root / "ids.jsonl"
    write_jsonl(rows, [{"messages": conversations(False)[0], "completion": [], "q": "a", "i": "b", "a": "c"}])
    chat, template = {"style": "chat", "messages": "messages"}, {"prompt": "{q} {i}\n", "answer": "{a}"}
    variants = [
        (chat, None), ({**chat, "message_property_mappings": {"role": "from"}}, None),
        ({**chat, "roles": {"user": ["human"]}}, None), ({**chat, "completion": "completion"}, None),
        ({**chat, "each_assistant_turn": True}, None), ({**chat, "preset": "sharegpt"}, None),
        ({**chat, "tools": "tools"}, None), ({**chat, "chat_template_kwargs": {"enable_thinking": False}}, None),
        ({**chat, "chat_template_kwargs_column": "kw"}, None),
        (template, None), ({**template, "prompt_no_input": "{q}\n"}, None), ({"preset": "alpaca"}, None),
        (template, {"where": [{"column": "q", "not_empty": True}]}),
    ]
    ids = [plan(tiny.config(rows, fmt, source), tiny.root / "cache", write=False).build_id for fmt, source in variants]
    assert len(set(ids)) == len(ids)
    inputs = plan(tiny.config(rows, template), tiny.root / "cache", write=False).inputs
    assert sorted(inputs["format"]) == ["answer", "messages", "prompt", "style", "system"]
    assert sorted(inputs["sources"][0]) == ["columns", "max_rows", "source", "weight"]


def thinking_conversations() -> list[list[dict]]:
    """Two-exchange conversations whose answers reason in <think> blocks (Qwen3 drops the earlier ones)."""
    return [[{"role": "user", "content": f"Rows in t{i}?"},
             {"role": "assistant", "content": f"<think>\nCount t{i}.\n</think>\n\nSELECT COUNT(*) FROM t{i}"},
             {"role": "user", "content": "Only c > 1?"},
             {"role": "assistant", "content": f"<think>\nAdd a filter.\n</think>\n\nSELECT COUNT(*) FROM t{i} WHERE c > 1"}]
            for i in range(4)]


def test_each_assistant_turn_trains_qwen3_turns_as_apply_chat_template_renders_them(real_builder):
    """Qwen3's template drops earlier turns' <think> blocks, so a conversation is refused whole; one
    document per assistant turn is what ``apply_chat_template`` makes of the conversation up to that
    turn, the mask on the turn's tokens (from the end of the generation prompt) and its <|im_end|>."""
    from transformers import AutoTokenizer

    builder = real_builder("qwen3")
    tokenizer = AutoTokenizer.from_pretrained(str(builder.tokenizer))
    chats = thinking_conversations()
    rows = [{"messages": c} for c in chats]
    with pytest.raises(BuildError, match="does not render assistant turn 1 of 'messages' as a prefix"):
        builder.build(rows, CHAT)
    result = builder.build(rows, {**CHAT, "each_assistant_turn": True})
    expected = []
    for chat in chats:
        for k in (1, 3):
            ids = list(tokenizer.apply_chat_template(chat[: k + 1], tokenize=True, return_dict=True)["input_ids"])
            while tokenizer.decode(ids[-1:]).isspace():  # the newline after <|im_end|>, not trained on
                ids.pop()
            head = len(tokenizer.apply_chat_template(chat[:k], tokenize=True, add_generation_prompt=True,
                                                     return_dict=True)["input_ids"])
            expected.append((ids, [0] * head + [1] * (len(ids) - head)))
    assert sorted(documents(result)) == sorted(expected)
    assert "<think>\nCount t0." not in tokenizer.decode(expected[1][0]) and "Count t0" in tokenizer.decode(expected[0][0])
    assert report(result)["train"]["documents"] == 8 and report(result)["sources"][0]["rows"] == 4


def test_each_assistant_turn_keeps_a_conversation_in_one_split(tiny):
    chat = conversations(multi_turn=True)[0]
    config = tiny.config([{"x": 1}], {**CHAT, "each_assistant_turn": True})
    tokenizer = json.loads((tiny.tokenizer / "tokenizer_config.json").read_text())
    docs = RowFormatter(config.format, chat_template=tokenizer["chat_template"],
                        eos_token=tokenizer["eos_token"]).documents({"messages": chat})
    assert [doc.text[slice(*doc.spans[0])] for doc in docs] == [
        "SELECT COUNT(*) FROM t0<|im_end|>", "SELECT COUNT(*) FROM t0 WHERE c > 0<|im_end|>"]
    assert docs[1].text.startswith(docs[0].text) and docs[0].split_text == docs[1].split_text == docs[1].text
    docs = RowFormatter(config.format, chat_template=tokenizer["chat_template"],
                        eos_token=tokenizer["eos_token"]).documents({"messages": chat[1:]})
    assert [doc.no_system for doc in docs] == [False, True]  # one conversation without a system message


def test_generation_prompts_an_alpaca_expert_with_the_prompt_its_row_would_have():
    from packtrain.core.config_build import FormatConfig
    from packtrain.pipeline.format.generation_prompt import generation_prompt

    fmt = FormatConfig(preset="alpaca")
    turns = [{"role": "user", "content": "Count the rows."}]
    assert generation_prompt(fmt, turns, {}, None, None, None, (7,)).text == \
        ALPACA_NO_INPUT.format(instruction="Count the rows.")
    assert generation_prompt(fmt, turns, {"input": "CREATE TABLE t (a INT)"}, None, None, None, (7,)).text == \
        ALPACA.format(instruction="Count the rows.", input="CREATE TABLE t (a INT)")


def test_a_partitioned_build_with_where_merges_into_the_one_machine_build(tiny):
    data = write_jsonl(tiny.root / "parted" / "rows.jsonl", [{**row, "keep": i % 3 != 0}
                                                              for i, row in enumerate(sql_rows(20))])
    config = tiny.config(data, {"prompt": "{question}\n", "answer": "{answer}"},
                         {"where": [{"column": "keep", "equals": True}]}, batch_rows=4)
    for cache in ("one", "machine0", "machine1"):
        seed_decision(tiny.root / cache, tiny.tokenizer)
    single = build(config, tiny.root / "one", log=quiet, progress=False)
    for i in range(2):
        pretokenize_part(config, tiny.root / f"machine{i}", (i, 2), log=quiet)
        shutil.copytree(tiny.root / f"machine{i}" / "formats" / SOURCES / PARTS,
                        tiny.root / "merged" / "formats" / SOURCES / PARTS, dirs_exist_ok=True)
    merged = merge(config, tiny.root / "merged", 2, log=quiet)
    assert merged.build_id == single.build_id and shards(merged) == shards(single)
    assert [(s["rows"], s["filtered_rows"], s["documents"]) for s in (report(merged)["sources"][0],
                                                                     report(single)["sources"][0])] == [(20, 7, 13)] * 2
