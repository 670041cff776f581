"""Real models' chat templates (tests/chat_templates/, as the models ship them) rendered by the build
as transformers' ``apply_chat_template`` renders them, on hostile conversations: the same text, one
render or turn by turn; refused (a one-line bad row) where the template raises or renders a turn
differently once it is followed by another.

tests/chat_templates/: llama3_1, llama3_2, phi3, gemma, qwen2_5, qwen3 and deepseekv3 as TRL 1.16 stores
the models' own (trl/chat_templates/, compared weekly with the Hub's); mistral_v0_3 (with its tools
block), mixtral_v0_1 and zephyr (TinyLlama's too) written out from the models' tokenizer_config.json."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from build_fixtures import chat_configs, make_tokenizer, packed_documents, seed_decision, write_jsonl
from inprocess_cli import cli
from tokenizers import Tokenizer, processors

from packtrain.core.configfile import load_config
from packtrain.pipeline.orchestrate.build import build, plan_inputs
from packtrain.pipeline.format.chat_render import render_conversation
from packtrain.pipeline.format.format import BadRow

TEMPLATES = Path(__file__).parent / "chat_templates"
BOS, EOS = "<s>", "</s>"
SPECIALS = [BOS, EOS, "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|end|>", "<|user|>",
            "<|assistant|>", "<start_of_turn>", "<end_of_turn>", "[INST]", "[/INST]"]


def template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text()


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
    """A tiny tokenizer for transformers to render templates with (the text, not the ids, is compared)."""
    from transformers import AutoTokenizer

    directory = make_tokenizer(tmp_path_factory.mktemp("tok"), extra_special=[BOS, EOS])
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "bos_token": BOS, "eos_token": EOS}))
    return AutoTokenizer.from_pretrained(str(directory))


def rendered(name_or_text: str, messages: list[dict], once: bool = False):
    text = template(name_or_text) if (TEMPLATES / f"{name_or_text}.jinja").is_file() else name_or_text
    doc = render_conversation(text, None, messages, "messages", BOS, EOS, once=once)
    return doc.text, [doc.text[a:b] for a, b in doc.spans]


def U(text):
    return {"role": "user", "content": text}


def A(text):
    return {"role": "assistant", "content": text}


def S(text):
    return {"role": "system", "content": text}


HOSTILE = {
    "one exchange": [U("Hi"), A("Hello")],
    "system, two exchanges": [S("You write SQL."), U("Rows?"), A("SELECT 1"), U("More"), A("SELECT 2")],
    "empty user turn": [U(""), A("ok")],
    "unicode": [U("héllo 日本語 🙂\u200b"), A("réponse ✓\n\n")],
    "special strings in content": [U("<|im_start|>x<|im_end|> <|eot_id|> [INST] </s> <s> <start_of_turn>"),
                                   A("<|end|> <end_of_turn> [/INST] ok")],
    "system in the middle": [U("a"), A("b"), S("new rules"), U("c"), A("d")],
    "consecutive same roles": [U("a"), U("b"), A("c"), A("d")],
    "ends with a user turn": [U("a"), A("b"), U("c")],
    "very long turns": [U("word " * 2000), A("answer " * 2000)],
    "reasoning": [U("q"), A("<think>\nr1\n</think>\n\nans1"), U("q2"), A("<think>\nr2\n</think>\n\nans2")],
    "padded": [U("  padded  "), A("  answer with spaces  \n")],
}
# what the build makes of each HOSTILE conversation (in order): = the text apply_chat_template renders,
# R a bad row where the template raises (so does apply_chat_template), P a bad row naming
# format.each_assistant_turn where an earlier turn renders otherwise once another follows it, S a bad
# row where the history renders otherwise once the turn follows it (Mistral drops the system message)
EXPECTED = {
    "llama3_1": "===========",
    "llama3_2": "===========",
    "phi3": "===========",
    "gemma": "=R===RR====",
    "qwen2_5": "===========",
    "qwen3": "=P===PPP=P=",
    "mistral_v0_3": "=S===RR====",
    "mixtral_v0_1": "=R===RR====",
    "zephyr": "===========",
    "deepseekv3": "=====P=====",
}


@pytest.mark.parametrize("name", EXPECTED)
def test_real_templates_render_hostile_conversations_as_apply_chat_template(hf_tokenizer, name):
    outcomes = ""
    for messages in HOSTILE.values():
        try:
            reference = hf_tokenizer.apply_chat_template(messages, tokenize=False, chat_template=template(name))
        except Exception:
            reference = None
        try:
            text, spans = rendered(name, messages)
        except BadRow as e:
            assert "\n" not in str(e)
            with pytest.raises(BadRow):
                rendered(name, messages, once=True)
            start = "so its start cannot be found, turn by turn or with format.each_assistant_turn" in str(e)
            if reference is not None and not start:
                assert "set format.each_assistant_turn" in str(e) or "open the conversation" in str(e), str(e)
            outcomes += "R" if reference is None else "S" if start else "P"
            continue
        assert rendered(name, messages, once=True) == (text, spans)  # the one-render shortcut, where taken
        assert text == reference or text == reference.rstrip() and text.endswith(EOS)  # no newline after EOS
        answers = [m["content"] for m in messages if m["role"] == "assistant"]
        assert len(spans) == len(answers)
        assert all(a.split()[-1] in s for a, s in zip(answers, spans) if a.strip())
        outcomes += "="
    assert outcomes == EXPECTED[name]


def test_the_template_sees_tools_documents_and_tojson_as_apply_chat_template_gives_them(hf_tokenizer):
    """``tools`` and ``documents`` are defined as none, and ``tojson`` takes transformers' arguments."""
    probing = ("{% if tools is not none %}[TOOLS]{% endif %}{% if documents is defined and documents is none %}"
               "[no documents]{% endif %}{% for m in messages %}{{ m | tojson(separators=(',', ':'), sort_keys=true) }}"
               "{{ '\\n' }}{% endfor %}")
    messages = [U("é <b>"), A("ok")]
    text, spans = rendered(probing, messages)
    assert text == hf_tokenizer.apply_chat_template(messages, tokenize=False, chat_template=probing) == \
        '[no documents]{"content":"é <b>","role":"user"}\n{"content":"ok","role":"assistant"}\n'
    assert spans == ['{"content":"ok","role":"assistant"}']


def test_llama_3_2_is_dated_today_as_apply_chat_template_dates_it(hf_tokenizer):
    text, _ = rendered("llama3_2", HOSTILE["one exchange"])
    assert f"Today Date: {datetime.now():%d %b %Y}\n" in text


def test_phi3_turns_end_before_the_eos_that_closes_the_conversation():
    text, spans = rendered("phi3", HOSTILE["system, two exchanges"])
    assert text == ("<|system|>\nYou write SQL.<|end|>\n<|user|>\nRows?<|end|>\n<|assistant|>\nSELECT 1<|end|>\n"
                    "<|user|>\nMore<|end|>\n<|assistant|>\nSELECT 2<|end|>\n</s>")
    assert spans == ["SELECT 1<|end|>", "SELECT 2<|end|>\n</s>"]


def test_deepseek_turns_start_after_the_history_where_the_generation_prompt_is_not_their_start():
    """DeepSeek-V3's generation prompt ends in ``<think>\\n``, which its turns do not have: the turn's
    header is supervised with it (as TRL's training template marks it)."""
    text, spans = rendered("deepseekv3", HOSTILE["system, two exchanges"])
    assert text == ("<s>You write SQL.<｜User｜>Rows?<｜Assistant｜>SELECT 1<｜end▁of▁sentence｜><｜User｜>More"
                    "<｜Assistant｜>SELECT 2<｜end▁of▁sentence｜>")
    assert spans == ["<｜Assistant｜>SELECT 1<｜end▁of▁sentence｜>", "<｜Assistant｜>SELECT 2<｜end▁of▁sentence｜>"]


def llama_project(tmp_path: Path, rows: list[dict]) -> Path:
    """configs/chat.yaml over ``rows`` and a tiny tokenizer with Llama 3.2's template and eos
    ``<|eot_id|>``, whose post-processor adds BOS (as Llama's does): the template writes its own."""
    directory = make_tokenizer(tmp_path / "tok", extra_special=SPECIALS)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[
        (BOS, tokenizer.token_to_id(BOS))])
    tokenizer.save(str(directory / "tokenizer.json"))
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {**config, "bos_token": BOS, "eos_token": "<|eot_id|>", "chat_template": template("llama3_2")}))
    return chat_configs(tmp_path, rows, directory, block_size=4096)


def test_llama_3_2_documents_are_apply_chat_template_ids_with_one_bos_whatever_the_shortcuts(tmp_path):
    """The build's documents are ``apply_chat_template(tokenize=True)``'s ids (one BOS: the template's,
    not the post-processor's too), the mask its assistant mask with the turns marked, and the shards the
    same bytes with every shortcut on or off; the build id changes with the date the template renders."""
    from transformers import AutoTokenizer

    conversations = [c for name, c in HOSTILE.items() if name != "very long turns"]
    configs = llama_project(tmp_path, [{"messages": c} for c in conversations])
    config = load_config("chat", configs)
    assert plan_inputs(config)[2]["chat_date"] == f"{datetime.now():%Y-%m-%d}"
    # the conversations hold the template's special-token strings: apply_chat_template encodes them as the special
    # tokens (split_special_tokens=False), which build.special_tokens_in_text: special does (text: test_special_text.py)
    for mode in ("text", "special"):
        shards = []
        for overrides in ({}, {"build.fast_encoder": False, "build.line_cache": False, "build.render_once": False}):
            cache = tmp_path / mode / f"cache{len(shards)}"
            if not overrides:
                seed_decision(cache, tmp_path / "tok")
            result = build(load_config("chat", configs, {**overrides, "build.special_tokens_in_text": mode}), cache,
                           log=lambda *_: None, progress=False)
            shards.append({p.name: p.read_bytes() for p in result.path.glob("*.arrow")})
        assert shards[0] == shards[1], mode
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    marked = template("llama3_2").replace(
        "'<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}",
        "'<|end_header_id|>\\n\\n' }}{% if message.role == 'assistant' %}{% generation %}{{ message['content'] | trim "
        "+ '<|eot_id|>' }}{% endgeneration %}{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}")
    expected = []
    for messages in conversations:
        reference = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, chat_template=marked,
                                                  return_assistant_tokens_mask=True)
        assert reference["input_ids"] == tokenizer.apply_chat_template(messages, tokenize=True)["input_ids"]
        assert reference["input_ids"][0] == tokenizer.bos_token_id != reference["input_ids"][1]  # one BOS
        expected.append((reference["input_ids"], reference["assistant_masks"]))
    assert sorted(packed_documents(result)) == sorted(expected)


def test_the_next_day_renders_the_sources_again_with_its_date(tmp_path, monkeypatch):
    """The date is part of each source's tokens' identity, not only the build id's: a build on the next
    day renders its date, never the day before's tokens cached under a new build id."""
    import packtrain.pipeline.format.chat_template as chat_template

    configs = llama_project(tmp_path, [{"messages": HOSTILE["one exchange"]}])
    seed_decision(tmp_path / "cache", tmp_path / "tok")
    texts = []
    for day in (datetime(2026, 11, 26, 23, 59), datetime(2026, 11, 27, 0, 1)):
        monkeypatch.setattr(chat_template, "datetime", type("Clock", (), {"now": staticmethod(lambda day=day: day)}))
        result = build(load_config("chat", configs), tmp_path / "cache", log=lambda *_: None, progress=False)
        texts.append(Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json")).decode(
            packed_documents(result)[0][0], skip_special_tokens=False))
    assert "Today Date: 26 Nov 2026" in texts[0] and "Today Date: 27 Nov 2026" in texts[1]


@pytest.mark.parametrize("num_proc", [1, 2])
def test_a_build_running_past_midnight_renders_every_row_with_the_day_its_id_names(tmp_path, monkeypatch, num_proc):
    """The clock says 23:59 on 1 Jan 2020 when the build plans (its id's chat_date), the next day from then
    on in this process (num_proc 2: the spawned workers read the real clock, years later): every row is
    rendered with the planned day, in the main process and in the workers."""
    import packtrain.pipeline.format.chat_template as chat_template

    times = iter([datetime(2020, 1, 1, 23, 59)])
    clock = staticmethod(lambda: next(times, datetime(2020, 1, 2, 0, 1)))
    monkeypatch.setattr(chat_template, "datetime", type("Clock", (), {"now": clock}))
    configs = llama_project(tmp_path, [{"messages": [U(f"question {i}"), A(f"answer {i}")]} for i in range(8)])
    seed_decision(tmp_path / "cache", tmp_path / "tok")
    config = load_config("chat", configs, {"build.num_proc": num_proc, "build.batch_rows": 2})
    result = build(config, tmp_path / "cache", log=lambda *_: None, progress=False)
    decode = Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json")).decode
    texts = [decode(ids, skip_special_tokens=False) for ids, _ in packed_documents(result)]
    assert len(texts) == 8 and all("Today Date: 01 Jan 2020" in text for text in texts), texts
    assert plan_inputs(config)[2]["chat_date"] == "2020-01-02"  # the clock had moved on


def test_a_template_that_refuses_every_row_is_one_line_naming_rows_and_fix_and_keeps_the_last_build(tmp_path):
    """Gemma's template raises on a system message: ``packtrain pretokenize`` says so in one line naming
    the rows and the fix, and the build published before stays the current one."""
    configs = llama_project(tmp_path, [{"messages": HOSTILE["one exchange"]}] * 3)
    seed_decision(tmp_path / "cache", tmp_path / "tok")
    run = lambda: cli("pretokenize", "chat", "--configs-dir", configs, "--cache-dir", tmp_path / "cache")
    assert run().returncode == 0
    current = (tmp_path / "cache" / "chat" / "CURRENT").read_text()
    path = tmp_path / "tok" / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "chat_template": template("gemma")}))
    write_jsonl(tmp_path / "chat.jsonl", [{"messages": HOSTILE["system, two exchanges"]}] * 3)
    result = run()
    assert result.returncode != 0 and "Traceback" not in result.stderr
    error = result.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("error: ") and "chat.jsonl#0" in error[0], result.stderr
    assert "the chat template refuses this conversation (System role not supported)" in error[0]
    assert "point model.tokenizer at a tokenizer whose chat_template renders them" in error[0]
    assert (tmp_path / "cache" / "chat" / "CURRENT").read_text() == current



@pytest.mark.parametrize("key", ["reasoning", "thinking"])
def test_an_answers_reasoning_under_any_of_its_names_is_rendered_as_apply_chat_template_renders_it(hf_tokenizer, key):
    """transformers passes a message's ``reasoning`` or ``thinking`` to the template as
    ``reasoning_content`` too (Qwen3 reads that one), as the build does."""
    messages = [U("q"), {"role": "assistant", "content": "ans", key: "because"}]
    text, spans = rendered("qwen3", messages)
    assert text == hf_tokenizer.apply_chat_template(messages, tokenize=False, chat_template=template("qwen3"))
    assert spans == ["<think>\nbecause\n</think>\n\nans<|im_end|>"]


def test_mistral_drops_the_system_message_before_an_answer_so_no_turn_start_is_found_either_way():
    """Mistral v0.3's template renders the system message only before a final user turn: the history
    renders otherwise once the answer follows it, turn by turn or one document per turn."""
    from packtrain.pipeline.format.format_messages import render_each_turn

    messages = [S("Be brief."), U("Hi"), A("Hello")]
    for render in (lambda: rendered("mistral_v0_3", messages), lambda: render_each_turn(
            template("mistral_v0_3"), None, messages, "messages", BOS, EOS)):
        with pytest.raises(BadRow) as e:
            render()
        assert str(e.value) == (
            "the chat template renders the conversation through assistant turn 2 of 'messages' with other text before "
            "the turn than its generation prompt, so its start cannot be found, turn by turn or with "
            "format.each_assistant_turn; change the rows (Mistral v0.3's template renders a system message only "
            "before a final user turn: put its text in the first user message), or use another chat template")


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}
TOOL_CONVERSATIONS = {
    "one exchange": [U("Weather in Paris?"), A("Sunny, 21 degrees.")],
    "system, one exchange": [S("Be brief."), U("Weather in Paris?"), A("Sunny.")],
    "a call and its result": [U("Weather in Paris?"), {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "{\"sky\": \"sunny\"}"}, A("Sunny.")],
}
# what the build makes of each TOOL_CONVERSATIONS conversation, with the tools: = apply_chat_template's text
# (tools=[WEATHER]), T a bad row saying the template does not render tools, F one saying it does not
# render the tool call, or the bad row the conversation is without tools too (R, P, S as in EXPECTED)
TOOLS_EXPECTED = {
    "llama3_1": "===",
    "llama3_2": "===",
    "qwen2_5": "===",
    "qwen3": "==P",
    "mistral_v0_3": "=SR",
    "phi3": "TTF",
    "gemma": "TRR",
    "zephyr": "TTF",
    "deepseekv3": "TTR",
    "mixtral_v0_1": "TRR",
}


@pytest.mark.parametrize("name", TOOLS_EXPECTED)
def test_a_rows_tools_reach_the_template_as_apply_chat_template_passes_them(hf_tokenizer, name):
    """``format.tools``: every render of the row gets its tools (the spans are found with them), the text
    is apply_chat_template's with ``tools=``; a template that renders no tools refuses the row in one
    line instead of dropping them."""
    outcomes = ""
    for messages in TOOL_CONVERSATIONS.values():
        try:
            reference = hf_tokenizer.apply_chat_template(messages, tools=[WEATHER], tokenize=False,
                                                         chat_template=template(name))
        except Exception:
            reference = None
        try:
            doc = render_conversation(template(name), None, messages, "messages", BOS, EOS, once=True,
                                      variables={"tools": [WEATHER]})
        except BadRow as e:
            assert "\n" not in str(e)
            if "does not render the row's tools" in str(e):
                assert str(e) == ("the chat template does not render the row's tools (format.tools), so they would be "
                                  "dropped silently; use a chat template that renders tools, or remove format.tools")
                outcomes += "T"
            elif "that the chat template does not render" in str(e):
                outcomes += "F"  # a message field it does not render (the tool call), said first
            else:
                outcomes += "R" if reference is None else "S" if "its start cannot be found" in str(e) else "P"
            continue
        assert doc.text == reference or doc.text == reference.rstrip() and doc.text.endswith(EOS)
        assert "get_weather" in doc.text.split("Weather in Paris?")[0] or name.startswith("llama3")
        assert "get_weather" in doc.text
        answers = [m["content"] for m in messages if m["role"] == "assistant" and m["content"]]
        assert answers[-1] in doc.text[doc.spans[-1][0]:doc.spans[-1][1]]
        assert "The weather in a city" not in "".join(doc.text[a:b] for a, b in doc.spans)  # tools: never trained on
        outcomes += "="
    assert outcomes == TOOLS_EXPECTED[name]


def test_generate_prompts_with_the_chat_template_kwargs_the_build_rendered_with(hf_tokenizer):
    """``packtrain generate``/``chat`` make the prompt with format.chat_template_kwargs, as the documents
    were made: Qwen3 with enable_thinking false ends the prompt with the empty <think> block."""
    from packtrain.core.config_build import FormatConfig
    from packtrain.pipeline.format.generation_prompt import generation_prompt

    kwargs = {"enable_thinking": False}
    for fmt in (FormatConfig(style="chat", messages="messages", chat_template_kwargs=kwargs),
                FormatConfig(style="chat", prompt="{q}", answer="{a}", chat_template_kwargs=kwargs)):
        prompt = generation_prompt(fmt, [U("Hi")], {}, template("qwen3"), BOS, EOS, ())
        assert prompt.text == hf_tokenizer.apply_chat_template([U("Hi")], tokenize=False, add_generation_prompt=True,
                                                               chat_template=template("qwen3"), **kwargs)
        assert prompt.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
