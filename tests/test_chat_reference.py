"""Conversations through the build's worker (pipeline/encode/worker.py ``encode_rows``: the chat template
rendered once and turn by turn, fastokens and the HF tokenizer) against transformers'
``apply_chat_template`` with the real tokenizers' own chat templates (SmolLM2, Qwen3 with and without
thinking, Qwen2-Instruct's) and synthetic ones: the same text, the same ids, and the assistant mask that
transformers gives the template with ``{% generation %}`` markers. The cases of the differential harness
bench/chat_reference_check.py (docs/BUILD.md, Conversations) that guard a rule or found a bug."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import chat_reference_check as harness  # noqa: E402
from bench.chat_reference_setups import setups as all_setups  # noqa: E402
from bench.chat_reference_check import A, S, U  # noqa: E402
from build_fixtures import chat_configs, packed_documents  # noqa: E402

from packtrain.pipeline.format.chat_render import render_conversation  # noqa: E402
from packtrain.pipeline.format.format import BadRow  # noqa: E402
from packtrain.pipeline.format.format_messages import render_each_turn  # noqa: E402

QWEN3 = (ROOT / "tests" / "chat_templates" / "qwen3.jinja").read_text()
CASES = ("plain", "system + 2 exchanges", "system in the middle", "tool call + result", "content parts",
         "reasoning_content twice", "<think> earlier turn", "whitespace assistant", "injection", "combining marks",
         "NUL", "ends on user", "starts with assistant")
# the build's outcome for each of CASES, in the default build (one render, fastokens: the first letter) and
# with both off (the second), data's special-token text encoded as text: = text, ids and mask are the
# reference's; R a bad row with its reason (x: apply_chat_template fails too); m the mask differs only as
# docs/BUILD.md says (Qwen3 without thinking: the empty reasoning block is the generation prompt's)
EXPECTED = {
    "smollm2": "== == == RR xx RR == RR == == == == RR",
    "qwen3": "== RR RR RR xx RR RR RR == == == RR RR",
    "qwen3 thinking off": "mm RR RR RR xx RR RR RR == mm mm RR RR",
    # one document per assistant turn: Qwen3's reasoning, under either name, trained in the turn's own document
    "qwen3 each turn": "== == == == xx == == RR == == == == RR",
    "qwen2": "== == == RR xx RR == RR == == == == RR",
    "qwen2 + format.system": "== == == RR xx RR == RR == == == == ==",
    "llama3-style": "== == == RR RR RR == RR == == == == RR",
    # DeepSeek-V3's generation prompt ends in <think>, its turns do not: the turn's header is supervised, as TRL's
    # deepseekv3_training marks it (the mask reference); its system messages gather at the start
    "deepseekv3": "== == RR xx xx RR == RR == == == == RR",
}


@pytest.fixture(scope="module")
def setups(real_tokenizer, tmp_path_factory):
    made = {name: real_tokenizer(name) for name in ("smollm2", "qwen3", "qwen2")}
    return {setup.name: setup for setup in all_setups(made, tmp_path_factory.mktemp("synthetic"))}


@pytest.mark.parametrize("name", EXPECTED)
def test_hostile_conversations_build_apply_chat_templates_text_ids_and_mask(setups, name):
    modes = ((True, True, "text"), (False, False, "text"))
    conversations = {case: harness.CONVERSATIONS[case] for case in CASES}
    outcomes, problems = harness.check(setups[name], conversations, modes, alone=False)  # one batch: the harness does both
    assert not problems
    assert " ".join(outcomes.values()) == EXPECTED[name]


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


@pytest.mark.parametrize("shortcuts", ["on", "off"])
def test_a_build_of_hostile_conversations_counts_every_refused_row_and_writes_the_references_tokens(
        setups, tmp_path, shortcuts):
    """The whole build (``build()``, as ``packtrain pretokenize`` runs it) over SmolLM2, one render and
    fastokens on or off: each conversation is a document whose ids and mask are apply_chat_template's (the
    marked template's mask, without the newline after the last ``<|im_end|>``), or a bad row counted in
    the report with its reason; none is dropped silently."""
    from packtrain.core.configfile import load_config
    from packtrain.pipeline.orchestrate.build import build
    from transformers import AutoTokenizer

    setup = setups["smollm2"]
    cases = [case for case in CASES if case not in ("content parts", "injection")]
    configs = chat_configs(tmp_path, [{"messages": harness.CONVERSATIONS[case]} for case in cases], setup.directory,
                           block_size=512)
    overrides = {} if shortcuts == "on" else {"build.render_once": False, "build.fast_encoder": False}
    result = build(load_config("chat", configs, overrides), tmp_path / "cache", log=lambda *_: None, progress=False)
    report = json.loads((result.path / "report.json").read_text())["sources"][0]
    refused = ["tool call + result", "reasoning_content twice", "whitespace assistant", "starts with assistant"]
    assert report["bad_rows"] == len(refused)
    assert [row["reason"][:60] for row in report["first_bad_rows"]] == [
        "'messages' message 1 (assistant) has a field 'tool_calls' th",
        "'messages' message 1 (assistant) has a field 'reasoning_cont",
        "'messages' message 1 (assistant) is empty, and an empty answ",
        "the chat template does not render assistant turn 0 of 'messa"]
    tokenizer = AutoTokenizer.from_pretrained(str(setup.directory))
    want = []
    for case in cases:
        if case not in refused:
            marked = tokenizer.apply_chat_template(harness.CONVERSATIONS[case], chat_template=setup.marked,
                                                   return_dict=True, return_assistant_tokens_mask=True)
            assert tokenizer.decode(marked["input_ids"][-1:]) == "\n"
            want.append((marked["input_ids"][:-1], marked["assistant_masks"][:-1]))
    assert sorted(packed_documents(result)) == sorted(want)


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
