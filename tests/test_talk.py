"""``packtrain generate`` and ``packtrain chat``: the prompt is what the run trained on, token for token,
and the adapter answers.

- The prompt made from a row's fields (pipeline/format/generation_prompt.py, tokenized by
  trainer/eval/talk.py) equals the prompt ids the build wrote for that row, for every validation
  document of the bundled sql sample, on each real tokenizer, in template and chat style.
- A tiny adapter that memorized four documents answers their prompts with their answers through the
  command line (``generate``, and ``chat`` one answer per stdin line); ``--base`` does not.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from packtrain.core.config_build import FormatConfig
from packtrain.core.configfile import load_config
from packtrain.core.contract import Manifest
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.encode.tokenizer_info import load_tokenizer_info
from packtrain.pipeline.format.generation_prompt import PromptError, generation_prompt, template_values
from packtrain.trainer.eval.talk import TextStream, prompt_ids
from packtrain.trainer.eval.task_eval import val_examples
from build_fixtures import sample_lines, seed_decision
from real_tokenizers import CHATML, REAL_TOKENIZERS, hf_tokenizer

ROOT = Path(__file__).resolve().parents[1]
SQL_PROMPT = "### Schema\n{context}\n\n### Question\n{question}\n\n### SQL\n"


def test_the_text_fills_the_field_left():
    fmt = FormatConfig(prompt=SQL_PROMPT)
    assert template_values(fmt, "How many?", {"context": "CREATE TABLE t (a INT)"}) == {
        "context": "CREATE TABLE t (a INT)", "question": "How many?"}
    assert template_values(FormatConfig(), "hello", {}) == {"prompt": "hello"}
    with pytest.raises(PromptError, match=r"needs \{context\}, \{question\}: give all but one with --field"):
        template_values(fmt, "How many?", {})
    with pytest.raises(PromptError, match=r"--field table: format.prompt has no \{table\} \(its fields: context, "):
        template_values(fmt, "How many?", {"table": "t"})
    with pytest.raises(PromptError, match="the text has no field to fill"):
        template_values(fmt, "How many?", {"context": "c", "question": "q"})


def test_prompts_by_style():
    template = generation_prompt(FormatConfig(prompt=SQL_PROMPT), [{"role": "user", "content": "How many?"}],
                                 {"context": "CREATE TABLE t (a INT)"}, None, None, "<eos>", (2,))
    assert (template.text, template.prefix_ids) == (
        "### Schema\nCREATE TABLE t (a INT)\n\n### Question\nHow many?\n\n### SQL\n", (2,))
    chat = generation_prompt(FormatConfig(style="chat", prompt="Q: {question}", system="Be brief."),
                             [{"role": "user", "content": "How many?"}], {}, CHATML, None, "<|im_end|>", (2,))
    assert (chat.text, chat.prefix_ids) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ: How many?<|im_end|>\n<|im_start|>assistant\n", ())
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
             {"role": "user", "content": "and now?"}]
    conversation = generation_prompt(FormatConfig(style="chat", messages="messages"), turns, {}, CHATML, None,
                                     "<|im_end|>", ())
    assert conversation.text == ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"
                                 "<|im_start|>user\nand now?<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(PromptError, match="no chat_template"):
        generation_prompt(FormatConfig(style="chat", messages="messages"), turns, {}, None, None, None, ())


def test_an_expert_trained_with_tools_is_prompted_with_the_tools_given():
    """``--tools FILE``: the tools reach the chat template as each row's did in the build; an expert
    trained without format.tools refuses them."""
    lists_tools = CHATML.replace("{% for", "{% if tools is not none %}<tools>{{ tools | tojson }}</tools>\n{% endif %}"
                                           "{% for", 1)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    turns = [{"role": "user", "content": "hi"}]
    fmt = FormatConfig(style="chat", messages="messages", tools="tools")
    assert generation_prompt(fmt, turns, {}, lists_tools, None, "<|im_end|>", (), tools).text == (
        '<tools>[{"type": "function", "function": {"name": "f", "parameters": {}}}]</tools>\n'
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert generation_prompt(fmt, turns, {}, lists_tools, None, "<|im_end|>", ()).text.startswith("<|im_start|>user")
    with pytest.raises(PromptError, match=r"--tools: this expert was not trained with tools"):
        generation_prompt(FormatConfig(style="chat", messages="messages"), turns, {}, lists_tools, None, None, (), tools)
    assert generation_prompt(fmt, turns, {}, lists_tools, None, "<|im_end|>", (), []).text.startswith(
        "<tools>[]</tools>\n<|im_start|>user")  # [] reaches the template as [], as a row's does
    # the template for a prompt with tools: the tokenizer's tool_use one where it has one, as for a row
    from packtrain.pipeline.format.chat_template import template_for
    assert template_for("default", "tool_use", tools) == template_for("default", "tool_use", []) == "tool_use"
    assert template_for("default", "tool_use", None) == template_for("default", None, tools) == "default"


@pytest.mark.parametrize("style", ["template", "chat"])
@pytest.mark.parametrize("name", REAL_TOKENIZERS)
def test_the_prompt_is_the_one_the_build_wrote_for_every_validation_row(real_tokenizer, tmp_path, name, style):
    directory = real_tokenizer(name)
    config = load_config("sql", ROOT / "configs", {"model.name": str(directory), "build.num_proc": 1,
                                                   "format.style": style})
    seed_decision(tmp_path / "cache", directory)
    result = build(config, tmp_path / "cache", log=lambda *_: None, progress=False)
    manifest = Manifest.load(result.path)
    examples = val_examples(result.path, manifest, 10 ** 6)
    info = load_tokenizer_info(directory)
    tokenizer = hf_tokenizer(directory)
    rows = [json.loads(line) for line in sample_lines("sql")]
    by_prompt = {(row["context"], row["question"]): row for row in rows}  # a question can come with two schemas
    assert len(examples) >= 40  # the validation documents the build holds whole
    for example in examples:
        text = tokenizer.decode(example.prompt_ids, skip_special_tokens=False)
        schema, rest = text.split("### Schema\n", 1)[1].split("\n\n### Question\n", 1)
        question = rest.split("\n\n### SQL\n", 1)[0]
        row = by_prompt[schema, question]
        made = generation_prompt(config.format, [{"role": "user", "content": row["question"]}],
                                 {"context": row["context"]}, info.chat_template, info.bos_token, info.eos_token,
                                 info.prefix_ids)
        assert prompt_ids(tokenizer, made.text, made.prefix_ids) == example.prompt_ids, question


def test_the_stream_shows_each_piece_once_and_stops_at_the_eos():
    shown = []
    words = {5: "a", 6: "é", 7: "b"}
    stream = TextStream(lambda ids: " ".join(words[i] for i in ids), eos_id=0, on_text=shown.append)
    stream.put(__import__("torch").tensor([[9, 9, 9]]))  # the prompt: skipped
    for token in (5, 6, 0, 7):
        stream.put(__import__("torch").tensor([token]))
    stream.end()
    assert "".join(shown) == "a é" and shown == ["a", " é"]


# --- the command line, on a tiny run that memorized its documents ----------------------------------

@pytest.fixture(scope="module")
def memorized(tmp_path_factory):
    from test_task_eval import memorization_build
    from trainer_fixtures import make_config, tiny_model_dir

    from packtrain.trainer.run.train import run

    root = tmp_path_factory.mktemp("talk")
    model_dir = tiny_model_dir(root / "model")
    docs = memorization_build(root / "cache", model_dir)
    config = make_config(model_dir, root / "runs", expert="neo4j", max_steps=60, per_device_train_batch_size=8,
                         learning_rate=1e-2, logging_steps=20, max_new_tokens=8, sample_prompts=0, plots=False)
    run_dir = run(config, root / "cache")
    words = lambda ids: " ".join(f"w{i}" for i in ids)  # noqa: E731  (the tiny word-level tokenizer's text)
    return run_dir, [(words(ids[:4]), words(ids[4:9])) for ids, _ in docs]


def packtrain(*args: str, stdin: str = "", tty: bool = False) -> subprocess.CompletedProcess:
    """The real entry point in this process (tests/inprocess_cli.py): a subprocess per command only added
    the import of torch, transformers and peft (5 commands: ~40 CPU s)."""
    from inprocess_cli import cli

    return cli(*args, stdin=stdin, tty=tty)


def test_generate_and_chat_answer_with_the_adapter(memorized):
    run_dir, pairs = memorized
    (prompt, answer), (prompt2, answer2) = pairs[0], pairs[1]
    done = packtrain("generate", "neo4j", prompt, "--run", str(run_dir), "--max-new-tokens", "8")
    assert done.returncode == 0, done.stderr
    assert done.stdout == answer + "\n"
    base = packtrain("generate", "neo4j", prompt, "--run", str(run_dir), "--max-new-tokens", "8", "--base")
    assert base.returncode == 0 and base.stdout.strip() != answer
    chatted = packtrain("chat", "neo4j", "--run", str(run_dir), "--max-new-tokens", "8", stdin=f"{prompt}\n\n{prompt2}\n")
    assert chatted.returncode == 0, chatted.stderr
    assert chatted.stdout == f"{answer}\n{answer2}\n"
    sampled = packtrain("generate", "neo4j", prompt, "--run", str(run_dir), "--max-new-tokens", "8",
                        "--temperature", "1.5", "--seed", "3")
    again = packtrain("generate", "neo4j", prompt, "--run", str(run_dir), "--max-new-tokens", "8",
                      "--temperature", "1.5", "--seed", "3")
    assert sampled.returncode == 0 and sampled.stdout == again.stdout  # seeded


def test_chat_on_a_terminal_says_how_to_end_it_and_exit_or_ctrl_d_ends_it(memorized):
    """Issue 47: ``exit`` was sent to the model, and Ctrl-D ended the chat as ``Aborted!``, exit code 1."""
    from packtrain.cli.talk import CHAT_BANNER

    run_dir, pairs = memorized
    (prompt, answer), (prompt2, answer2) = pairs[0], pairs[1]
    for word in ("exit", "quit", "/exit", " Quit "):
        chatted = packtrain("chat", "neo4j", "--run", str(run_dir), "--max-new-tokens", "8", tty=True,
                            stdin=f"{prompt}\n{word}\n{prompt2}\n")
        assert chatted.returncode == 0, chatted.stderr
        assert CHAT_BANNER in chatted.stderr.splitlines()
        assert answer in chatted.stdout and answer2 not in chatted.stdout  # nothing after the word is read
        assert chatted.stdout.count("you> ") == 2
    ended = packtrain("chat", "neo4j", "--run", str(run_dir), "--max-new-tokens", "8", tty=True, stdin=f"{prompt}\n")
    assert ended.returncode == 0 and "Aborted" not in ended.stderr + ended.stdout  # Ctrl-D: the input ends
    assert answer in ended.stdout
    piped = packtrain("chat", "neo4j", "--run", str(run_dir), "--max-new-tokens", "8", stdin=f"exit\n{prompt}\n")
    assert piped.returncode == 0 and CHAT_BANNER not in piped.stderr  # off a terminal every line is a prompt
    assert piped.stdout.endswith(f"{answer}\n") and len(piped.stdout.splitlines()) == 2


def test_a_prompt_the_format_cannot_make_fails_before_the_model_loads(memorized):
    run_dir, _ = memorized
    done = packtrain("generate", "neo4j", "w5", "--run", str(run_dir), "--field", "table=t")
    assert done.returncode == 2
    assert done.stderr.startswith("error: --field table: format.prompt has no {table} (its fields: prompt)")
    wrong = packtrain("generate", "sql", "w5", "--run", str(run_dir))
    assert wrong.returncode == 2 and "is a run of expert 'neo4j', not 'sql'" in wrong.stderr


def test_tools_given_to_an_expert_trained_without_them_or_unreadable_fail_before_the_model_loads(memorized, tmp_path):
    run_dir, _ = memorized
    good, bad = tmp_path / "tools.json", tmp_path / "bad.json"
    good.write_text('[{"type": "function", "function": {"name": "f"}}]')
    bad.write_text('{"type": "function"}')
    done = packtrain("generate", "neo4j", "w5", "--run", str(run_dir), "--tools", str(good))
    assert done.returncode == 2 and "loading" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        f"error: --tools: {run_dir} was not trained with tools (its format.tools is not set); leave --tools out")
    done = packtrain("generate", "neo4j", "w5", "--run", str(run_dir), "--tools", str(bad))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{bad}: '--tools' is dict, expected a list of tool definitions" in done.stderr


def test_a_prompt_longer_than_the_models_context_is_refused_and_a_long_one_gets_the_room_left(memorized):
    """The tiny model has 1,024 positions. Before (issue 46), a prompt far past them was generated on
    without a word (a 125 kB prompt: 108 s on a 4,096-position model)."""
    run_dir, pairs = memorized
    prompt, answer = pairs[0]
    refused = ("the prompt is 1,100 tokens, and the model's context is 1,024 positions (max_position_embeddings): it "
               "leaves no room for an answer, so it is refused; shorten it to under 1,024 tokens")
    done = packtrain("generate", "neo4j", " ".join(["w5"] * 1100), "--run", str(run_dir), "--max-new-tokens", "8")
    assert (done.returncode, done.stdout) == (2, "") and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"error: {refused}"
    done = packtrain("generate", "neo4j", " ".join(["w5"] * 1020), "--run", str(run_dir), "--max-new-tokens", "8")
    assert done.returncode == 0, done.stderr
    assert ("the prompt is 1,020 tokens: 4 new tokens fit the model's context of 1,024 positions "
            "(max_position_embeddings), not --max-new-tokens 8; the answer stops there") in done.stderr.splitlines()
    assert len(done.stdout.split()) <= 4
    chatted = packtrain("chat", "neo4j", "--run", str(run_dir), "--max-new-tokens", "8",
                        stdin=f"{' '.join(['w5'] * 1100)}\n{prompt}\n")
    assert chatted.returncode == 0, chatted.stderr
    assert chatted.stdout == f"\n{answer}\n" and f"error: {refused}" in chatted.stderr.splitlines()


@pytest.mark.parametrize("option, value, said", [
    ("--temperature", "nan", "'nan' is not a finite number in the range x>=0"),
    ("--temperature", "inf", "'inf' is not a finite number in the range x>=0"),
    ("--temperature", "-0.5", "-0.5 is not in the range x>=0."),
    ("--top-p", "nan", "'nan' is not a finite number in the range 0<x<=1"),
    ("--top-p", "0", "0.0 is not in the range 0<x<=1."),
    ("--top-p", "1.5", "1.5 is not in the range 0<x<=1."),
    ("--max-new-tokens", "0", "0 is not in the range 1<=x<=2147483647."),
    ("--seed", "18446744073709551616", "18446744073709551616 is not in the range 0<=x<=18446744073709551615."),
])
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_sampling_values_out_of_range_or_not_finite_are_refused_in_one_line(tmp_path, command, option, value, said):
    """Issue 46 C: ``--temperature nan`` was taken (greedy output, no word). Each option is checked by its
    type as the command line is read: no run is looked for (there is none here), nothing loads."""
    args = [command, "neo4j", *(["w5"] if command == "generate" else []), "--runs-dir", str(tmp_path), option, value]
    done = packtrain(*args)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1  # one line; in-process, the program is named after pytest
    assert done.stderr.startswith(f"error: Invalid value for '{option}': {said} (see `")
    assert done.stderr.endswith(f"packtrain {command} --help`)\n")
