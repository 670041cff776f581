"""Conversational datasets: a ``messages`` column, format.style chat, loss on every assistant turn."""

from __future__ import annotations

import json

import pytest
from build_fixtures import make_project, write_jsonl
from tokenizers import Tokenizer

from packtrain.core.config import ConfigError
from packtrain.core.configfile import load_config
from packtrain.core.shardfile import open_shard
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.errors import BuildError
from packtrain.pipeline.format.chat_render import render_conversation
from packtrain.pipeline.format.format import BadRow
from packtrain.pipeline.review.inspect import inspect_build

# A tiny ChatML-style template that renders tool calls and tool results, as Qwen's and SmolLM2's do.
TOOL_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] %}{{ m['content'] }}{% endif %}"
    "{% for call in m.get('tool_calls', []) %}<tool_call>{{ call['function'] | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The same with transformers' generation markers around the assistant's text.
MARKED_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Earlier assistant turns rendered differently from the last one (as Qwen3 drops old <think> blocks).
LAST_TURN_DIFFERS = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m['role'] == 'assistant' and not loop.last %} (earlier){% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CONFIG = """\
sources:
  - name: {data}
format:
  style: chat
  messages: messages
pack:
  block_size: 256
  val_fraction: 0.0
build:
  num_proc: 1
  batch_rows: 16
model:
  name: {model}
"""

CONVERSATION = [
    {"role": "system", "content": "You write SQL."},
    {"role": "user", "content": "How many rows in t1?"},
    {"role": "assistant", "content": "SELECT COUNT(*) FROM t1"},
    {"role": "user", "content": "And in t2?"},
    {"role": "assistant", "content": "SELECT COUNT(*) FROM t2"},
]


def quiet(*_):
    pass


@pytest.fixture
def chat_project(tmp_path):
    project = make_project(tmp_path)
    (project["configs"] / "sql.yaml").write_text(CONFIG.format(data=project["data"], model=project["model"]))
    return project


def set_template(project, template: str) -> None:
    path = project["model"] / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "chat_template": template}))


def build_conversations(project, conversations: list, **overrides):
    write_jsonl(project["data"], [{"messages": c} for c in conversations])
    return build(load_config("sql", project["configs"], overrides), project["cache"], log=quiet, progress=False)


def supervised_and_not(project, result) -> tuple[list[str], str]:
    """The supervised runs of the first document, decoded, and the whole document."""
    tokenizer = Tokenizer.from_file(str(project["model"] / "tokenizer.json"))
    ids, mask, doc_lens = open_shard(result.path / "train-00000.arrow", 256).arrays()
    n = doc_lens[0][0]
    ids, mask = ids[0, :n].tolist(), mask[0, :n].tolist()
    runs, current = [], []
    for token, supervised in zip(ids, mask):
        if supervised:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    runs.append(current) if current else None
    decode = lambda t: tokenizer.decode(t, skip_special_tokens=False)
    return [decode(r) for r in runs], decode(ids)


def test_every_assistant_turn_and_its_end_of_turn_token_is_supervised_nothing_else(chat_project):
    result = build_conversations(chat_project, [CONVERSATION])
    runs, text = supervised_and_not(chat_project, result)
    assert text == ("<|im_start|>system\nYou write SQL.<|im_end|>\n<|im_start|>user\nHow many rows in t1?<|im_end|>\n"
                    "<|im_start|>assistant\nSELECT COUNT(*) FROM t1<|im_end|>\n<|im_start|>user\nAnd in t2?<|im_end|>\n"
                    "<|im_start|>assistant\nSELECT COUNT(*) FROM t2<|im_end|>\n<|endoftext|>")
    # the last turn's newline is not supervised, so neither is the EOS after it
    assert runs == ["SELECT COUNT(*) FROM t1<|im_end|>", "SELECT COUNT(*) FROM t2<|im_end|>"]


def test_tool_calls_are_supervised_tool_results_are_not(chat_project):
    set_template(chat_project, TOOL_CHATML)
    call = {"name": "run_sql", "arguments": {"query": "SELECT 1"}}
    conversation = [
        {"role": "user", "content": "Check the database."},
        {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": call}]},
        {"role": "tool", "content": "1"},
        {"role": "assistant", "content": "It answers 1."},
    ]
    runs, text = supervised_and_not(chat_project, build_conversations(chat_project, [conversation]))
    assert runs == ['<tool_call>{"arguments": {"query": "SELECT 1"}, "name": "run_sql"}</tool_call><|im_end|>',
                    "It answers 1.<|im_end|>"]
    assert "<|im_start|>tool\n1<|im_end|>" in text


def test_a_template_with_generation_markers_gives_the_same_spans(chat_project):
    plain = supervised_and_not(chat_project, build_conversations(chat_project, [CONVERSATION]))
    set_template(chat_project, MARKED_CHATML)
    assert supervised_and_not(chat_project, build_conversations(chat_project, [CONVERSATION])) == plain


def test_a_template_whose_turns_are_not_prefixes_fails_with_the_reason(chat_project):
    set_template(chat_project, LAST_TURN_DIFFERS)
    with pytest.raises(BuildError, match=r"no training blocks: 1 of 1 rows were bad .*does not render assistant "
                                         r"turn 2 of 'messages' as a prefix of the whole conversation"):
        build_conversations(chat_project, [CONVERSATION])


def test_bad_conversations_are_counted_with_a_reason(chat_project):
    result = build_conversations(chat_project, [CONVERSATION, [{"role": "user", "content": "hi"}],
                                                [{"role": "robot", "content": "x"}], "not json", []])
    report = json.loads((result.path / "report.json").read_text())
    assert [row["reason"] for row in report["sources"][0]["first_bad_rows"]] == [
        "the conversation in 'messages' has no assistant turn, so nothing to train on",
        "'messages' message 0 has no role among system, user, assistant, tool (got {'content': 'x', 'role': 'robot'}); "
        "map the data's keys and roles with format.message_property_mappings and format.roles (ShareGPT's: "
        "format.preset: sharegpt)",
        "'messages' is text but not JSON; expected a list of {\"role\", \"content\"} messages",
        "'messages' is empty, expected a non-empty list of {\"role\", \"content\"} messages",
    ]
    assert report["train"]["documents"] == 1


def test_render_conversation_without_a_template_is_a_bad_row():
    with pytest.raises(BadRow, match="needs the tokenizer's chat_template"):
        render_conversation(None, None, CONVERSATION, "messages")


def test_inspect_shows_the_supervised_spans_of_a_multi_turn_block(chat_project):
    result = build_conversations(chat_project, [CONVERSATION])
    shown = inspect_build(result.path, chat_project["model"] / "tokenizer.json", "train", 1, color=False)
    assert ("<|im_start|>assistant\n⟦SELECT COUNT(*) FROM t1<|im_end|>⟧\n<|im_start|>user\nAnd in t2?<|im_end|>\n"
            "<|im_start|>assistant\n⟦SELECT COUNT(*) FROM t2<|im_end|>⟧\n<|endoftext|>") in shown


def test_messages_needs_chat_style_and_no_prompt_or_answer(chat_project):
    with pytest.raises(ConfigError) as e:
        load_config("sql", chat_project["configs"], {"format.style": "template", "format.answer": "{x}"})
    assert "format.messages: a conversation column needs style: chat" in str(e.value)
    assert "format.prompt/answer: not used with messages" in str(e.value)


def test_a_parquet_conversation_keeps_only_the_keys_each_message_has(chat_project):
    import pyarrow as pa
    import pyarrow.parquet as pq

    set_template(chat_project, "{% for m in messages %}<|im_start|>{{ m['role'] }}{% if m.name is defined %} "
                               "({{ m.name }}){% endif %}{{ '\\n' }}{{ m['content'] }}<|im_end|>\n{% endfor %}"
                               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    path = chat_project["data"].with_suffix(".parquet")  # Arrow gives the assistant message name: null
    pq.write_table(pa.Table.from_pylist([{"messages": [{"role": "user", "content": "hi", "name": "ann"},
                                                       {"role": "assistant", "content": "ok"}]}]), path)
    chat_project["data"].unlink()
    config = load_config("sql", chat_project["configs"], {"sources": [{"name": str(path)}]})
    result = build(config, chat_project["cache"], log=quiet, progress=False)
    runs, text = supervised_and_not(chat_project, result)
    assert text == "<|im_start|>user (ann)\nhi<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n<|endoftext|>"
    assert runs == ["ok<|im_end|>"]


def test_a_turn_opening_with_newlines_is_a_bad_row_saying_to_strip_them(real_tokenizer, tmp_path):
    """Qwen's tokenizer makes one token of the template's ``<|im_start|>assistant\\n`` newline and a turn's
    opening one, so the turn starts inside a token: the reason shows the token and says to strip the
    whitespace (it said to end format.prompt with a newline, which a conversation has none of, or to use
    another chat template)."""
    from build_fixtures import chat_configs, seed_decision
    from real_tokenizers import CHATML

    tokenizer = tmp_path / "qwen3-chatml"  # Qwen3's vocabulary, the ChatML template of Qwen2 (no <think> blocks)
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_bytes((real_tokenizer("qwen3") / "tokenizer.json").read_bytes())
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "chat_template": CHATML}))
    rows = [{"messages": [{"role": "user", "content": "Rows?"}, {"role": "assistant", "content": "\nSELECT 1"}]},
            {"messages": CONVERSATION[:3] + [{"role": "user", "content": "More"},
                                             {"role": "assistant", "content": "\n\nSELECT 2"}]},
            {"messages": CONVERSATION}]
    configs = chat_configs(tmp_path, rows, tokenizer, 256)
    seed_decision(tmp_path / "cache", tokenizer)
    result = build(load_config("chat", configs), tmp_path / "cache", log=quiet, progress=False)
    report = json.loads((result.path / "report.json").read_text())
    joined = ("starts inside a token: the tokenizer encodes '\\n' (the end of the chat template's text before the "
              "turn) and {!r} (the turn's first characters) as one token, so its tokens would not be the ones the "
              "model generates after its prompt; remove the whitespace at the start of the turn's content in the data")
    assert [row["reason"] for row in report["sources"][0]["first_bad_rows"]] == [
        "the assistant turn starting '\\nSELECT 1<|im_end|>' " + joined.format("\n"),
        "the assistant turn starting '\\n\\nSELECT 2<|im_end|>' " + joined.format("\n\n"),
    ]
    assert report["train"]["documents"] == 1
