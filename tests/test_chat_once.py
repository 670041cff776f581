"""One render per conversation (pipeline/format/chat_once.py): the same text and spans as rendering turn by
turn, admitted per template by probe conversations, and a template it gets wrong on some rows only is
caught by the build's check, never published, and remembered."""

from __future__ import annotations

import json
import random

import pytest

from build_fixtures import make_project, write_jsonl
from hostile_text import hostile_texts
from packtrain.core.configfile import load_config
from packtrain.core.contract import Manifest
from packtrain.pipeline.orchestrate.build import build
from packtrain.core.config_build import FormatConfig
from packtrain.pipeline.format.chat_once import chatml_system, render_once, turn_end, unmark
from packtrain.pipeline.format.chat_render import render_conversation
from packtrain.pipeline.format.format import BadRow, RowFormatter
from real_tokenizers import CHATML

# Qwen3's way: earlier turns' reasoning dropped, so a turn renders differently once a later turn follows
DROPS_REASONING = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' and not loop.last %}{{ message['content'].split('</think>')[-1] }}"
    "{% else %}{{ message['content'] }}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3_LIKE = ("{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + "
               "message['content'] + '<|eot_id|>' }}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
# Qwen2.5's way with tool results: rendered as a user turn, which string joins would write as a tool turn
TOOL_AS_USER = ("{% for message in messages %}{% if message['role'] == 'tool' %}"
                "{{ '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}"
                "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
                "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TRIMS = CHATML.replace("message['content']", "message['content'] | trim")
# right on every probe, wrong where an answer starts with "X" (the marker hides the X from the test)
WRONG_ON_X = CHATML.replace("message['content']",
                            "(message['content'] if not message['content'].startswith('X') else 'x' + message['content'])")
# of the 400 hostile conversations below, those with a blank assistant turn (a bad row, as an empty answer is)
EMPTY_ANSWERS = 43


def conversation(rng: random.Random, texts: list[str]) -> list[dict]:
    turns = [{"role": "system", "content": texts[0]}] if rng.random() < 0.5 else []
    for k in range(rng.randint(1, 4)):
        turns += [{"role": "user", "content": texts[2 * k + 1]}, {"role": "assistant", "content": texts[2 * k + 2]}]
        if rng.random() < 0.3:  # a tool result, then the assistant again
            turns += [{"role": "tool", "content": texts[2 * k + 1][::-1]}, {"role": "assistant", "content": "ok"}]
    return turns


def smollm2_template(real_tokenizer) -> str:
    return (real_tokenizer("smollm2") / "chat_template.jinja").read_text()


def test_unmark_finds_each_turn_between_its_markers():
    assert unmark("a\U000f0000bc\U000f0001d\U000f0000e\U000f0001", 2) == ("abcde", [(1, 3), (4, 5)])
    assert unmark("a\U000f0001b\U000f0000", 1) is None  # closing before opening
    assert unmark("a\U000f0000b\U000f0001", 2) is None  # a turn the template did not render


def test_the_turn_end_is_learned_where_rendering_once_is_exact(real_tokenizer):
    assert turn_end(CHATML, None, "<|im_end|>") == "<|im_end|>"
    assert turn_end(smollm2_template(real_tokenizer), None, "<|im_end|>") == "<|im_end|>"
    assert turn_end(TRIMS, None, "<|im_end|>") is None  # trimming moves the spans off the content's edges
    needs_tools = CHATML.replace("{% for message in messages %}", "{{ tools[0]['name'] }}{% for message in messages %}")
    assert turn_end(needs_tools, None, "<|im_end|>") is None  # it fails on the probes: rendered the exact way
    # dropping earlier reasoning: right on the probes, and a row with reasoning loses its marker, so it is
    # left to the exact way (which refuses it: the turn does not render as a prefix)
    assert turn_end(DROPS_REASONING, None, "<|im_end|>") == "<|im_end|>"
    reasoning = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>r</think>b"},
                 {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    assert chatml_system(DROPS_REASONING, None, "<|im_end|>") == (False, None)  # not by string joins: Jinja
    assert render_once(DROPS_REASONING, reasoning, None, "<|im_end|>") is None
    assert render_once(DROPS_REASONING, reasoning[2:], None, "<|im_end|>") is not None


@pytest.mark.parametrize("template, plain", [("chatml", (True, None)), ("llama3", (False, None)),
                                             ("tool_as_user", (False, None)), (
    "smollm2", (True, "You are a helpful AI assistant named SmolLM, trained by Hugging Face"))])
def test_one_render_gives_the_text_and_spans_of_rendering_turn_by_turn(real_tokenizer, template, plain):
    """ChatML templates by string joins (SmolLM2's with its default system prompt), others by Jinja
    with markers: the same text and spans as rendering turn by turn, on hostile conversations."""
    template = {"chatml": CHATML, "llama3": LLAMA3_LIKE, "tool_as_user": TOOL_AS_USER}.get(template) or \
        smollm2_template(real_tokenizer)
    assert chatml_system(template, None, "<|im_end|>") == plain
    rng = random.Random(3)
    texts = hostile_texts(seed=9, count=9 * 400, max_pieces=12)
    once, empty = 0, 0
    for i in range(400):
        messages = conversation(rng, texts[9 * i : 9 * i + 9])
        try:
            exact = render_conversation(template, None, messages, "m", None, "<|im_end|>")
        except BadRow as e:  # a blank answer (the hostile texts hold some): refused both ways, with one reason
            with pytest.raises(BadRow) as refused:
                render_conversation(template, None, messages, "m", None, "<|im_end|>", once=True)
            assert str(refused.value) == str(e) and " (assistant) is empty, " in str(e)
            empty += 1
            continue
        got = render_once(template, messages, None, "<|im_end|>")
        if got is not None:
            once += 1
            assert (got.text, got.spans) == (exact.text, exact.spans) and got.rendered_once, messages
    assert (once, empty) == (400 - EMPTY_ANSWERS, EMPTY_ANSWERS)


def test_a_template_wrong_on_some_rows_is_caught_by_the_build_and_remembered(tmp_path):
    project = make_project(tmp_path, n_rows=10)
    rows = [{"messages": [{"role": "user", "content": f"q{i}"},
                          {"role": "assistant", "content": ("X" if i % 7 == 3 else "") + f"SELECT {i}"}]}
            for i in range(40)]
    write_jsonl(project["data"], rows)
    tokenizer_config = project["model"] / "tokenizer_config.json"
    config_json = json.loads(tokenizer_config.read_text())
    tokenizer_config.write_text(json.dumps({**config_json, "chat_template": WRONG_ON_X}))
    assert turn_end(WRONG_ON_X, config_json.get("bos_token"), config_json.get("eos_token")) is not None
    (project["configs"] / "sql.yaml").write_text(
        f"sources:\n  - name: {project['data']}\nformat:\n  style: chat\n  messages: messages\n"
        f"pack:\n  block_size: 128\nbuild:\n  num_proc: 1\n  batch_rows: 16\nmodel:\n  name: {project['model']}\n")
    settings: dict = {}
    off = build(load_config("sql", project["configs"], {**settings, "build.render_once": False}), tmp_path / "off",
                log=lambda *_: None, progress=False)
    lines: list[str] = []
    config = load_config("sql", project["configs"], settings)
    on = build(config, project["cache"], log=lines.append, progress=False)
    said = [line for line in lines if line.startswith("exactness check: chat render once")]
    assert len(said) == 1 and "differs from the HF tokenizer on row " in said[0]
    assert said[0].endswith("not using it for this chat template again, tokenizing again without it")
    assert {p.name: p.read_bytes() for p in on.path.glob("*.arrow")} == \
        {p.name: p.read_bytes() for p in off.path.glob("*.arrow")}
    assert Manifest.load(on.path, full=True).outputs["exactness"]["render_once"] is False
    assert len(list((project["cache"] / ".render-once").glob("*.json"))) == 1
    lines = []
    write_jsonl(project["data"], rows + rows[:1])
    build(config, project["cache"], log=lines.append, progress=False)
    assert [line for line in lines if line.startswith("chat render once:")] == [
        "chat render once: off (an earlier build's check found a difference: " +
        said[0].removeprefix("exactness check: ").removesuffix(
            "; not using it for this chat template again, tokenizing again without it") + ")"]


# rows the string joins leave to the checks and the exact way: each is refused, or rendered, as before
EDGE_ROWS = [
    '[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]',  # JSON text: parsed by the checks
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "name": None}],  # a null key, dropped
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": None, "tool_calls": [{"f": 1}]}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": " \n"}],  # a blank answer
    [{"role": "user", "content": "a"}],  # no answer
    [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}],
    [{"role": "user", "content": 3}, {"role": "assistant", "content": "b"}],
    [["user", "a"], {"role": "assistant", "content": "b"}],
    [], None, "not json",
]


@pytest.mark.parametrize("system", [None, "", "You write SQL."])
def test_plain_rows_are_joined_straight_from_the_row_as_the_exact_way_renders_them(real_tokenizer, system):
    """RowFormatter renders a row of plain messages by string joins straight from the row
    (chat_once.plain_chatml), skipping the per-message checks it passes: the exact way's text and
    spans, with or without format.system and the template's default system prompt (SmolLM2's); any
    other row goes through the checks, refused with the same reason."""
    rng = random.Random(5)
    texts = hostile_texts(seed=4, count=9 * 150, max_pieces=12)
    rows = [conversation(rng, texts[9 * i : 9 * i + 9]) for i in range(150)] + EDGE_ROWS
    for template in (CHATML, smollm2_template(real_tokenizer)):
        fmt = FormatConfig(style="chat", messages="messages", system=system)
        once = RowFormatter(fmt, (("messages", "m"),), template, None, "<|im_end|>", render_once=True)
        exact = RowFormatter(fmt, (("messages", "m"),), template, None, "<|im_end|>")
        assert once.plain_chatml is not None and exact.plain_chatml is None
        joined = refused = 0
        for messages in rows:
            try:
                want = exact({"m": messages})
            except BadRow as e:
                with pytest.raises(BadRow) as got:
                    once({"m": messages})
                assert str(got.value) == str(e)
                refused += 1
                continue
            got = once({"m": messages})
            assert (got.text, got.spans) == (want.text, want.spans) and got.rendered_once, messages
            joined += once.plain_chatml(messages) is not None
        assert (joined, refused) == (150 - 16, 16 + 9)  # 16 hostile rows with a blank answer; 9 edge rows refused


# a turn rendered otherwise where it is followed by another (earlier answers' trailing newlines
# stripped), and a turn end that changes with the turn's index: no probe of before showed either
EARLIER_STRIPPED = CHATML.replace("message['content']", "(message['content'] if loop.last or message['role'] != "
                                  "'assistant' else message['content'].rstrip('\\n'))")
HEADED_EARLIER_STRIPPED = EARLIER_STRIPPED.replace("<|im_start|>", "### ").replace("<|im_end|>", "</turn>")
LATE_TURNS_MARKED = CHATML.replace("'<|im_end|>", "('!' if loop.index0 > 10 else '') + '<|im_end|>")


@pytest.mark.parametrize("template", [EARLIER_STRIPPED, HEADED_EARLIER_STRIPPED, LATE_TURNS_MARKED])
def test_a_turn_rendered_by_its_position_is_never_rendered_once_otherwise_than_turn_by_turn(template):
    """A template that renders a turn by where it stands (last or not, its index) renders once, from the
    row or from the markers, exactly what it renders turn by turn, or is left to the exact way: the
    markers hide the content's edges from the template's strip, and a probe must see the index."""
    rows = [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}" + "\n" * (i % 2)}]
            for i in range(6)]
    for n in (2, 6):
        messages = [m for row in rows[:n] for m in row]
        formatter = RowFormatter(FormatConfig(style="chat", messages="messages"), (), template, None, "<|im_end|>",
                                 render_once=True)
        outcomes = []
        for once in (False, True):
            try:
                doc = formatter({"messages": messages}) if once else render_conversation(
                    template, None, messages, "messages", None, "<|im_end|>")
                outcomes.append((doc.text, doc.spans))
            except BadRow as e:
                outcomes.append(str(e))
        assert outcomes[0] == outcomes[1], n


# Cohere2's way: every system message gathered before the conversation, wherever it stands in it
GATHERS_SYSTEM = ("{% for m in messages if m['role'] == 'system' %}{{ m['content'] + '\n' }}{% endfor %}"
                  "{% for m in messages if m['role'] != 'system' %}{{ '<|' + m['role'] + '|>' + m['content'] + '</t>' }}"
                  "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}")


def test_a_template_that_moves_a_late_system_message_is_never_rendered_once():
    """A system message in the middle moves before the conversation: the turns before it do not render
    as prefixes (refused turn by turn), so the probes leave every row of the template to the exact way."""
    assert turn_end(GATHERS_SYSTEM, None, None) is None
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "system", "content": "s"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    for once in (False, True):
        with pytest.raises(BadRow, match="set format.each_assistant_turn"):
            render_conversation(GATHERS_SYSTEM, None, messages, "m", None, None, once=once)
