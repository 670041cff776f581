"""``packtrain generate`` and ``packtrain chat``: talk to a finished run's adapter (or its base model).

The prompt is made by the run's own format (its config.json: template, chat template and system
prompt), so the model is prompted with what it trained on; a prompt the format cannot make (a
missing ``--field``) fails before torch is imported. ``chat`` keeps the conversation's history for
experts trained on conversations (``format.messages``); the other experts answer each line alone.
On a terminal ``chat`` is an interactive loop (``you>``) that ``exit``, ``quit``, ``/exit``, ``/quit``,
an empty line or Ctrl-D ends (its first line says so); otherwise it answers one line of stdin at a
time, one answer per line, until the input ends.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import click

from packtrain.cli.options import FiniteRange, Remembered
from packtrain.core.errors import quote

# The sampling options are checked by their types (packtrain/cli/options.py FiniteRange), as the command line is
# read: before the run is looked for or anything loads. Counts and seeds have the bounds torch takes.
MAX_NEW_TOKENS = 2**31 - 1

EXIT_WORDS = ("exit", "quit", "/exit", "/quit")
"""What typed alone at ``chat``'s prompt ends the chat (any case), as Ctrl-D or an empty line does."""
CHAT_BANNER = "chat: type a message and press Enter; exit, quit, /exit, an empty line or Ctrl-D ends the chat"


def talk_options(function):
    """The options ``generate`` and ``chat`` share: which run, base or adapter, how to generate."""
    options = [
        click.option("--run", "run_dir", default=None,
                     help="The run to use (default: EXPERT's newest finished run under --runs-dir)."),
        click.option("--runs-dir", default="runs", show_default=True, type=click.Path(file_okay=False),
                     help="Where runs live (train.output_dir): <runs-dir>/<expert>/<run>/."),
        click.option("--base", is_flag=True, help="Answer with the base model (the adapter disabled)."),
        click.option("--max-new-tokens", type=click.IntRange(min=1, max=MAX_NEW_TOKENS), default=256,
                     show_default=True),
        click.option("--temperature", type=FiniteRange(min=0), default=0.0, show_default=True,
                     help="0: greedy; above 0: sampled."),
        click.option("--top-p", type=FiniteRange(min=0, max=1, min_open=True), default=1.0, show_default=True,
                     help="Nucleus sampling: the smallest set of tokens whose probability adds up to this."),
        click.option("--seed", type=click.IntRange(min=0, max=2**64 - 1), default=0, show_default=True,
                     help="For sampling."),
        click.option("--field", "fields", multiple=True, metavar="NAME=VALUE",
                     help="A field of the expert's prompt template (repeatable); the text fills the one left."),
        click.option("--tools", "tools_file", default=None, type=click.Path(dir_okay=False),
                     help="A JSON file of tool definitions (a list of JSON schemas) to prompt an expert trained "
                          "with format.tools with, as its rows gave them."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


@dataclass
class Prompter:
    """Prompt texts for a run, by its own format (no torch)."""

    run_path: Path
    expert_config: object
    tokenizer: object  # packtrain.pipeline.encode.tokenizer_info.TokenizerInfo
    fields: dict
    tools: list | None = None

    @classmethod
    def of(cls, expert: str, run_dir: str | None, runs_dir: str, fields: tuple[str, ...],
           tools_file: str | None = None) -> "Prompter":
        from packtrain.core.resolve import resolve_tokenizer_dir
        from packtrain.pipeline.encode.tokenizer_info import load_tokenizer_info

        tools = read_tools(tools_file) if tools_file else None
        run_path, config = finished_run(expert, run_dir, runs_dir)
        if tools is not None and config.format.tools is None:
            raise click.UsageError(f"--tools: {run_path} was not trained with tools (its format.tools is not set); "
                                   "leave --tools out")
        return cls(run_path, config, load_tokenizer_info(resolve_tokenizer_dir(config.model)), parse_fields(fields),
                   tools)

    @property
    def remembers(self) -> bool:
        from packtrain.pipeline.format.generation_prompt import is_conversation

        return is_conversation(self.expert_config.format)

    def prompt(self, turns: list[dict]):
        from packtrain.pipeline.format.generation_prompt import PromptError, generation_prompt

        from packtrain.pipeline.format.chat_template import template_for

        tok = self.tokenizer
        template = template_for(tok.chat_template, tok.tool_chat_template, self.tools)
        try:
            return generation_prompt(self.expert_config.format, turns, self.fields, template, tok.bos_token,
                                     tok.eos_token, tok.prefix_ids, self.tools)
        except PromptError as e:
            raise click.UsageError(str(e)) from None


def finished_run(expert: str, run_dir: str | None, runs_dir: str):
    """The finished run of ``expert`` to use (``--run``, else its newest) and its config (no torch); the
    model it names converted if it is an embedded one not converted yet."""
    from packtrain.cli.prepare import ensure_converted
    from packtrain.core.configfile import config_from_dict
    from packtrain.core.inputs import read_json
    from packtrain.core.rundir import RunError, find_run

    run_path = find_run(expert, run_dir, runs_dir)
    config_file = run_path / "config.json"
    config = config_from_dict(read_json(config_file, "not a packtrain run directory, or damaged: name another "
                                        "with --run", "a run config"), str(config_file))
    if config.expert != expert and not config.expert.startswith(f"{expert}."):
        raise RunError(f"--run {run_path} is a run of expert {config.expert!r}, not {expert!r}: name a run of "
                       f"{expert} with --run, or use {config.expert} instead")
    ensure_converted(config)
    return run_path, config


def read_tools(path: str) -> list:
    """``--tools FILE``: a JSON list of tool definitions, checked as the build checks a row's."""
    from packtrain.pipeline.format.chat_messages import check_tools
    from packtrain.pipeline.format.format import BadRow

    try:
        text = Path(path).read_text(encoding="utf-8")
        tools = check_tools(text, "--tools")
    except (OSError, UnicodeDecodeError) as e:
        raise click.BadParameter(f"{path}: cannot be read ({e})", param_hint="--tools") from None
    except BadRow as e:
        raise click.BadParameter(f"{path}: {e}", param_hint="--tools") from None
    if tools is None:
        raise click.BadParameter(f"{path}: holds no tool definitions (null or nothing); write a JSON list of them, "
                                 "or leave --tools out", param_hint="--tools")
    return tools


def parse_fields(fields: tuple[str, ...]) -> dict[str, str]:
    """``("context=CREATE TABLE t (a INT)",)`` as ``{"context": "CREATE TABLE t (a INT)"}``."""
    parsed = {}
    for item in fields:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise click.UsageError(f"--field {quote(item)}: write NAME=VALUE, e.g. --field context='CREATE TABLE ...'")
        parsed[name] = value
    return parsed


def open_talker(prompter: Prompter, base: bool, max_new_tokens: int, temperature: float, top_p: float, seed: int):
    """The run loaded (torch, transformers, peft imported here), ready to answer."""
    from packtrain.trainer.eval.eval_run import open_run
    from packtrain.trainer.eval.talk import Sampling, Talker
    from packtrain.trainer.run.runlog import ensure_log_handler

    ensure_log_handler()
    click.echo(f"{prompter.run_path}: loading {'the base model' if base else 'the adapter'} ...", err=True)
    run = open_run(prompter.run_path, None)  # its refusals are PacktrainErrors: one line from the CLI
    return Talker(run, Sampling(max_new_tokens, temperature, top_p, seed), base=base,
                  on_note=lambda line: click.echo(line, err=True))


def answer(talker, prompter: Prompter, turns: list[dict]) -> str:
    """Stream the answer to ``turns`` to stdout, then a newline; returns it."""
    made = prompter.prompt(turns)

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    reply = talker.reply(made.text, made.prefix_ids, on_text=show)
    sys.stdout.write("\n")
    sys.stdout.flush()
    return reply


@click.command(cls=Remembered)
@click.argument("expert")
@click.argument("prompt")
@talk_options
def generate(expert, prompt, run_dir, runs_dir, base, max_new_tokens, temperature, top_p, seed, fields, tools_file):
    """Answer PROMPT with EXPERT's trained adapter (its newest finished run, or --run), streamed to stdout."""
    prompter = Prompter.of(expert, run_dir, runs_dir, fields, tools_file)
    prompter.prompt([{"role": "user", "content": prompt}])  # a prompt the format cannot make fails before torch
    talker = open_talker(prompter, base, max_new_tokens, temperature, top_p, seed)
    answer(talker, prompter, [{"role": "user", "content": prompt}])


@click.command(cls=Remembered)
@click.argument("expert")
@talk_options
def chat(expert, run_dir, runs_dir, base, max_new_tokens, temperature, top_p, seed, fields, tools_file):
    """Talk to EXPERT's trained adapter: a loop on a terminal (exit, quit, /exit, an empty line or Ctrl-D
    ends it), one answer per line of stdin otherwise. Experts trained on conversations remember the chat."""
    from packtrain.trainer.eval.talk import PromptTooLong

    prompter = Prompter.of(expert, run_dir, runs_dir, fields, tools_file)
    talker = open_talker(prompter, base, max_new_tokens, temperature, top_p, seed)
    if sys.stdin.isatty():
        click.echo(CHAT_BANNER, err=True)
        lines = typed_lines(lambda: click.prompt("you", default="", show_default=False, prompt_suffix="> "))
    else:
        lines = piped_lines(sys.stdin)
    turns: list[dict] = []
    for line in lines:
        history = turns if prompter.remembers else []
        asked = [*history, {"role": "user", "content": line}]
        try:
            reply = answer(talker, prompter, asked)
        except PromptTooLong as e:  # this line is refused, in one line; the chat goes on (one answer a line)
            click.echo(f"error: {e}{'; or start a new chat' if history else ''}", err=True)
            sys.stdout.write("\n")
            sys.stdout.flush()
            continue
        turns = [*asked, {"role": "assistant", "content": reply}]


def typed_lines(ask: Callable[[], str]) -> Iterator[str]:
    """The lines typed at the chat's prompt (``ask``), until one ends the chat: an :data:`EXIT_WORDS` word
    alone (any case, spaces around it), an empty line, or Ctrl-D (the end of input: ``click.prompt``
    raises ``Abort`` there, as at a Ctrl-C at the prompt). Before (issue 47), ``exit`` went to the model.

    >>> list(typed_lines(iter(["SELECT 1?", "  Exit ", "never read"]).__next__))
    ['SELECT 1?']
    """
    while True:
        try:
            line = ask()
        except click.Abort:  # Ctrl-D: end the chat (exit code 0), on a line of its own
            click.echo(err=True)
            return
        if not line.strip() or line.strip().lower() in EXIT_WORDS:
            return
        yield line


def piped_lines(stream: Iterable[str]) -> Iterator[str]:
    """The lines of a piped stdin, each one prompt, blank ones skipped, until the input ends (an ``exit``
    line is a prompt like any other)."""
    for line in stream:
        line = line.rstrip("\n")
        if line.strip():
            yield line
