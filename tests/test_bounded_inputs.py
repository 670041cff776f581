"""Issue 46, item 2 (and the template part of item 3): inputs that expand without bound, and messages
that grow with them, are refused in one line naming the file and the bound.

- A line, a CSV row or a JSON array file longer than ``build.read_memory_mb`` / 8 once decompressed.
- No error message grows with the value it quotes (packtrain/core/errors.py).
- Every exception a chat template raises on a row is that row's bad-row reason.
- YAML, wherever packtrain reads it (configs/<expert>.yaml, defaults.yaml, ``--set``, a dataset
  README's header), through one reader whose aliases are bounded (packtrain/core/yaml_reader.py); no
  module calls a YAML loader of its own.

The bounds are set small here, or the inputs made just past them: no test allocates what the bound
protects against, and none measures memory or time.
"""

from __future__ import annotations

import ast
import gzip
import json
import lzma
from pathlib import Path

import numpy as np
import pytest

from packtrain.core.config_sources import SourceConfig
from packtrain.pipeline.read.discover import SourceError, resolve_source

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, stdin: str = ""):
    from inprocess_cli import cli as entry

    return entry(*args, stdin=stdin)


def one_error_line(result, *expected: str) -> str:
    """The command failed with exit 2 and exactly one ``error:`` line, the last, holding ``expected``."""
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert result.stderr.rstrip("\n").split("\n")[-1] == errors[0]
    for text in expected:
        assert text in errors[0], errors[0]
    return errors[0]


# --- YAML: one reader, aliases bounded ----------------------------------------------------------

def laughs(levels: int = 5, width: int = 10, indent: str = "") -> str:
    """A "billion laughs" YAML mapping: ``levels`` anchors, each a list of ``width`` aliases of the one
    before; 10**5 leaves at the defaults (quick to expand without the bound, refused with it)."""
    lines = [f"{indent}l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"{indent}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


EXPANSION = "(more than 10,000 added); write the values out instead of aliasing them"


@pytest.mark.parametrize("where", ["expert", "defaults"])
def test_an_alias_bomb_in_a_config_file_is_one_line_naming_the_file(tmp_path, where):
    configs = tmp_path / "configs"
    configs.mkdir()
    expert = "sources: [{name: bundled}]\n"
    bomb = "format:\n  chat_template_kwargs:\n" + laughs(indent="    ")
    (configs / "x.yaml").write_text(expert + (bomb if where == "expert" else ""))
    (configs / "defaults.yaml").write_text(bomb if where == "defaults" else "{}\n")
    line = one_error_line(cli("config", "x", "--configs-dir", configs),
                          f"error: {configs / ('x' if where == 'expert' else 'defaults')}.yaml cannot be read as "
                          "YAML (YamlExpansionError: its aliases (&name, *name) expand ", f"{EXPANSION}): fix the YAML")
    assert len(line) < 400


def test_an_alias_bomb_in_a_set_value_is_one_line_naming_the_flag():
    value = "[" + ", ".join(f"&l{i} [{', '.join([f'*l{i - 1}' if i else 'lol'] * 10)}]" for i in range(5)) + "]"
    line = one_error_line(cli("config", "sql", "--set", f"format.chat_template_kwargs={{x: {value}}}"),
                          "--set format.chat_template_kwargs=", "the value is not valid YAML (YamlExpansionError: "
                          "its aliases (&name, *name) expand")
    assert len(line) < 600


def test_an_alias_bomb_in_a_dataset_readme_is_one_line_naming_the_readme(tmp_path):
    directory = tmp_path / "ds"
    directory.mkdir()
    (directory / "train.jsonl").write_text('{"prompt": "p", "answer": "a"}\n')
    (directory / "README.md").write_text("---\n" + laughs() + "configs:\n- config_name: c\n  data_files: '*.jsonl'\n"
                                         "---\n# a card\n")
    with pytest.raises(SourceError) as raised:
        resolve_source(SourceConfig(name=str(directory)))
    assert str(raised.value) == f"{directory / 'README.md'}: its YAML header does not parse (its aliases (&name, " \
                                f"*name) expand 28 nodes to 123,468 {EXPANSION})"


@pytest.mark.parametrize("text", ["a: &a [*a]", "a: &a {b: [1, *a]}"])
def test_a_yaml_node_that_holds_itself_is_refused(text):
    from packtrain.core.yaml_reader import YamlExpansionError, load_yaml

    with pytest.raises(YamlExpansionError, match=r"the node anchored at line 1 holds an alias \(\*name\) of itself"):
        load_yaml(text)


@pytest.mark.parametrize("how", ["written", "far too deep", "aliases of aliases"])
def test_yaml_nested_deeper_than_the_bound_is_refused(how):
    """Deeply nested YAML stopped PyYAML's composer (and would stop every recursive reader after it)
    with a RecursionError: a traceback from --set or a README; aliases of aliases deepen a document
    while adding few nodes."""
    from packtrain.core.yaml_reader import YamlExpansionError, load_yaml

    text = {"written": "a: " + "[" * 120 + "]" * 120, "far too deep": "a: " + "[" * 5000 + "]" * 5000,
            "aliases of aliases": "l0: &l0 " + "[" * 60 + "]" * 60 + "\n" + "l1: " + "[" * 60 + "*l0" + "]" * 60}[how]
    with pytest.raises(YamlExpansionError, match=r"^it is nested deeper than 100 levels of lists and mappings"):
        load_yaml(text)
    assert load_yaml("a: " + "[" * 99 + "]" * 99)["a"] is not None


def test_aliases_within_the_bound_and_merge_keys_still_read():
    from packtrain.core.yaml_reader import load_yaml

    assert load_yaml("base: &b {x: 1}\nmine: {<<: *b, y: 2}\nmore: *b\n") == {
        "base": {"x": 1}, "mine": {"x": 1, "y": 2}, "more": {"x": 1}}
    assert len(load_yaml(laughs(levels=3, width=10))["l2"]) == 10  # 1,110 nodes added: under the bound


def yaml_loader_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[0] == "yaml" and \
                "load" in ast.unparse(node.func).split(".")[-1].lower():
            found.append(f"{path.relative_to(ROOT)}: {ast.unparse(node)[:80]}")
    return found


def test_yaml_is_read_by_the_one_bounded_reader_only():
    """Every YAML reader of packtrain is packtrain/core/yaml_reader.py's load_yaml: a new
    ``yaml.safe_load`` anywhere would read without the bound."""
    files = [p for d in ("packtrain", "pipeline", "trainer") for p in (ROOT / d).rglob("*.py")]
    assert len(files) > 50
    calls = [hit for p in files for hit in yaml_loader_calls(p)]
    assert calls == ["packtrain/core/yaml_reader.py: yaml.load(text, Loader=BoundedSafeLoader)"]


# --- A line, a CSV row, a JSON array file: at most build.read_memory_mb / 8, decompressed -----------

MIB = 1 << 20
BOUND_8 = "longer than 1 MiB (build.read_memory_mb 8 / 8) once decompressed, so it is not read; remove it, or " \
          "raise build.read_memory_mb if the data really holds such rows"


def rows_of(path, bound_mb: int = 8) -> list[str]:
    from packtrain.pipeline.read.read_checks import ReadBound
    from packtrain.pipeline.read.sources import iter_batches

    batches = iter_batches(resolve_source(SourceConfig(name=str(path))), ["prompt", "answer"], 2,
                           bound=ReadBound(bound_mb))
    return [p for batch in batches for p in batch.columns["prompt"]]


def json_line(prompt: str) -> str:
    return json.dumps({"prompt": prompt, "answer": "a"}) + "\n"


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.jsonl.gz", "rows.json.xz"])
@pytest.mark.parametrize("at", [1, 3])
def test_a_line_longer_than_the_bound_is_one_line_naming_the_file_and_the_bound(tmp_path, name, at):
    """A 1 MB .jsonl.gz that expands to a 1 GiB line built at 2.27 GB RSS (issue 46): the line is
    refused once the bound's characters are read, whichever reader meets it first (the key search of
    the first line, pyarrow's blocks then the line-by-line read)."""
    lines = [json_line("p0"), json_line("p1"), json_line("x" * (MIB + 10)), json_line("p3")]
    if at == 1:
        lines = lines[2:3] + lines[:2] + lines[3:]
    data = "".join(lines).encode()
    path = tmp_path / name
    path.write_bytes(gzip.compress(data, 1) if name.endswith(".gz") else lzma.compress(data) if name.endswith(".xz")
                     else data)
    with pytest.raises(SourceError) as raised:
        rows_of(path)
    assert str(raised.value) == f"{path}, line {at}: a line {BOUND_8}"
    assert rows_of(path, bound_mb=16)[at - 1] == "x" * (MIB + 10)  # under a larger bound: read


@pytest.mark.parametrize("name", ["rows.csv", "rows.tsv.gz"])
def test_a_csv_row_longer_than_the_bound_is_refused(tmp_path, name):
    """pyarrow's CSV reader holds a row in blocks of at most the bound: a row is refused past the
    bound, at the latest at twice it (one of 2 MiB under a bound of 1 MiB here)."""
    sep = "\t" if ".tsv" in name else ","
    data = f"prompt{sep}answer\np0{sep}a\n{'x' * (2 * MIB + 10)}{sep}a\np2{sep}a\n".encode()
    path = tmp_path / name
    path.write_bytes(gzip.compress(data, 1) if name.endswith(".gz") else data)
    with pytest.raises(SourceError) as raised:
        rows_of(path)
    assert str(raised.value) == f"{path}: a row (after the first 1) {BOUND_8}"
    assert rows_of(path, bound_mb=64) == ["p0", "x" * (2 * MIB + 10), "p2"]


def test_a_json_array_file_longer_than_the_bound_is_refused(tmp_path):
    path = tmp_path / "rows.json.gz"
    path.write_bytes(gzip.compress(json.dumps([{"prompt": f"p{i}" * 30_000, "answer": "a"} for i in range(20)]).encode()))
    with pytest.raises(SourceError) as raised:
        rows_of(path)
    assert str(raised.value) == f"{path}: a JSON array file (parsed whole) {BOUND_8}"
    assert len(rows_of(path, bound_mb=16)) == 20


def test_the_bound_is_the_configs_build_read_memory_mb(tmp_path):
    """``build.read_memory_mb`` reaches the reader: a build over a file with one long line stops in
    one line with the config's bound; the default (2048: 256 MiB lines) reads it."""
    from build_fixtures import make_tokenizer, seed_decision

    from packtrain.core.configfile import load_config
    from packtrain.pipeline.orchestrate.build import build

    model = make_tokenizer(tmp_path / "model")
    seed_decision(tmp_path / "cache", model)  # the fast-encoder decision, proved once per run
    data = tmp_path / "rows.jsonl.gz"
    data.write_bytes(gzip.compress("".join(json_line(f"p{i}") for i in range(20)).encode()
                                   + json_line("x " * (MIB // 2 + 10)).encode(), 1))
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "sql.yaml").write_text(f"sources: [{{name: {data}}}]\nformat: {{prompt: '{{prompt}}', answer: "
                                      f"'{{answer}}'}}\nmodel: {{name: {model}}}\nbuild: {{num_proc: 1}}\n")
    with pytest.raises(SourceError) as raised:
        build(load_config("sql", configs, {"build.read_memory_mb": 8}), tmp_path / "cache", log=lambda *_: None,
              progress=False)
    assert str(raised.value) == f"{data}, line 21: a line {BOUND_8}"
    assert build(load_config("sql", configs), tmp_path / "cache", log=lambda *_: None, progress=False).path.is_dir()


# --- No error message is longer than a few hundred characters ------------------------------------

LONG = "x" * 100_000


@pytest.mark.parametrize("case", ["config-value", "set-value", "set-no-equals", "readme-configs"])
def test_a_long_value_in_an_error_is_cut_with_its_length_said(tmp_path, case):
    """Each quoted a 100,000-character value whole: a 100 kB error line."""
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "x.yaml").write_text("sources: [{name: bundled}]\n")
    if case == "config-value":
        (configs / "x.yaml").write_text(f"sources: [{{name: bundled}}]\npack:\n  block_size: {LONG}\n")
        result, said = cli("config", "x", "--configs-dir", configs), \
            f"pack.block_size: expected int, got '{'x' * 80}'... (100,000 characters)"
    elif case == "set-value":
        result, said = cli("config", "x", "--configs-dir", configs, "--set", f"format.prompt='{LONG}"), \
            "the value is not valid YAML"
    elif case == "set-no-equals":
        result, said = cli("config", "x", "--configs-dir", configs, "--set", LONG), "... (100,000 characters): expected KEY=VALUE"
    else:
        directory = tmp_path / "ds"
        directory.mkdir()
        (directory / "train.jsonl").write_text('{"prompt": "p", "answer": "a"}\n')
        (directory / "README.md").write_text(f"---\nconfigs: {LONG}\n---\n")
        (configs / "x.yaml").write_text(f"sources: [{{name: {directory}}}]\n")
        result, said = cli("pretokenize", "x", "--configs-dir", configs, "--cache-dir", tmp_path / "cache"), \
            f"README.md: 'configs' is '{'x' * 80}'... (100,000 characters), not a list"
    line = one_error_line(result, said)
    assert len(line) <= 700, len(line)


def test_every_packtrain_error_and_the_cli_line_are_bounded():
    from packtrain.core.errors import MAX_LINE, PacktrainError, bounded, cut, describe_error

    error = PacktrainError(f"{LONG}: do this")
    assert len(str(error)) <= MAX_LINE and str(error).endswith("xxx: do this")
    assert "[... 100,009 characters: 99,0" in str(error)
    listed = bounded("\n".join(f"  - problem {i}" for i in range(100)))
    assert listed.count("\n") == 40 and listed.endswith("  ... and 60 more lines")
    assert cut("short", 100) == "short" and bounded("a\nb") == "a\nb"
    assert len(describe_error(ValueError(LONG))) <= MAX_LINE  # rebuild's and status's JSON lines
    result = cli("pretokenize", "x", "--configs-dir", f"/nonexistent/{'d' * 5000}")  # an OSError's message
    assert result.returncode == 2 and result.stderr.startswith("error: [Errno 36] File name too long: '/nonexistent/d")
    assert len(result.stderr) <= len("error: \n") + MAX_LINE and "[... 5,053 characters: " in result.stderr


@pytest.mark.parametrize("on_bad_rows", ["skip", "error"])
def test_a_bad_rows_reason_is_cut_where_it_is_counted(on_bad_rows):
    """A reason may quote the row (a message's field name, a template's error): every one is cut where
    the build counts it, for the report and for the error line of ``on_bad_rows: error``."""
    from types import SimpleNamespace

    from packtrain.core.configfile import config_from_dict
    from packtrain.pipeline.encode.source_caches import count_batch
    from packtrain.pipeline.errors import BuildError
    from packtrain.pipeline.pack.source_stats import Exactness, SourceStats

    config = config_from_dict({"expert": "x", "sources": [{"name": "bundled"}], "build": {"on_bad_rows": on_bad_rows}})
    stats = SourceStats(10, Exactness("tokenizers", False, False))
    encoded = SimpleNamespace(mismatches=[], rows=None, lengths=np.zeros(0, np.int64), tokens=[], filtered=0, no_system=0, by_shortcut=0,
                              special_text=[], checked=0, bad_rows=[(0, f"'messages' message 0 has a field {LONG!r}: remove it")])
    if on_bad_rows == "error":
        with pytest.raises(BuildError) as raised:
            count_batch(config, 0, stats, ("a.jsonl", 0, 0), encoded)
        assert len(str(raised.value)) < 600 and str(raised.value).endswith("to skip and count such rows)")
        return
    count_batch(config, 0, stats, ("a.jsonl", 0, 0), encoded)
    (bad,) = stats.first_bad_rows
    assert len(bad.reason) <= 400 and "[... 100,046 characters: 99,689 cut ...]" in bad.reason and bad.reason.endswith(": remove it")


# --- Every exception a chat template raises while rendering a row is that row's bad-row reason --------

RAISES = ("{% macro down(n) %}{{ down(n + 1) }}{% endmacro %}"
          "{% for m in messages %}"
          "{% if m.content == 'overflow' %}{{ range(100000000) | list }}{% endif %}"
          "{% if m.content == 'zero' %}{{ 1 / 0 }}{% endif %}"
          "{% if m.content == 'recursion' %}{{ down(0) }}{% endif %}"
          "{% if m.content == 'long' %}{{ (messages | length) / 0 }}{% endif %}"
          "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
FAILS = "the chat template fails on this row ({}); fix the row, or use a chat template that renders it"
WHY = {"overflow": "OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).",
       "zero": "ZeroDivisionError: division by zero",
       "recursion": "RecursionError: maximum recursion depth exceeded"}


@pytest.mark.parametrize("style", ["messages", "prompt-answer"])
def test_every_exception_a_chat_template_raises_on_a_row_is_a_bad_row(style):
    """``range(100000000)`` raised OverflowError out of pipeline/format/format.py: a traceback that stopped the
    build (issue 46). Any exception is now the row's reason, counted like the Jinja errors were."""
    from packtrain.core.config_build import FormatConfig
    from packtrain.pipeline.encode.worker import format_rows
    from packtrain.pipeline.format.format import RowFormatter

    cases = ["fine", *WHY]
    if style == "prompt-answer":
        formatter = RowFormatter(FormatConfig(style="chat"), chat_template=RAISES, eos_token="<|im_end|>")
        columns = {"prompt": cases, "answer": ["ok"] * len(cases)}
    else:
        formatter = RowFormatter(FormatConfig(style="chat", messages="messages"), chat_template=RAISES,
                                 eos_token="<|im_end|>")
        columns = {"messages": [[{"role": "user", "content": c}, {"role": "assistant", "content": "ok"}]
                                for c in cases]}
    docs, kept, bad = format_rows(formatter, columns)
    assert kept == [0] and len(docs) == 1
    assert [i for i, _ in bad] == [1, 2, 3]
    for (_, reason), case in zip(bad, WHY):
        # the recursion's text may go on ('... while calling a Python object'): where it hit says so
        assert reason.startswith(FAILS.format(WHY[case]).split(WHY[case])[0] + WHY[case]), reason
        assert reason.endswith("); fix the row, or use a chat template that renders it")


def test_a_template_errors_text_is_cut_with_its_length_said():
    from packtrain.pipeline.format.chat_render import render_conversation
    from packtrain.pipeline.format.format import BadRow

    template = "{% for m in messages %}{{ m[m.content].x }}{% endfor %}"  # names the missing key: 5,000 x
    with pytest.raises(BadRow) as raised:
        render_conversation(template, None, [{"role": "user", "content": "x" * 5000},
                                             {"role": "assistant", "content": "ok"}], "messages")
    reason = str(raised.value)
    assert len(reason) < 400 and "characters:" in reason and " cut ...]" in reason, reason
