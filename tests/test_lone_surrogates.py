"""A lone surrogate in the data: a bad row with its reason, never a traceback.

JSON may escape half of a UTF-16 pair (``"\\ud800"``) and ``json.loads`` keeps it as a code point
UTF-8 has no bytes for, so no tokenizer encodes it: before 2026-11-27 such a row stopped the whole
build with a traceback (fastokens' UnicodeEncodeError, the HF tokenizer's TypeError), shortcuts on or
off, in template and chat style (found by a hostile-text sweep). A whole pair (``"\\ud83d\\ude00"``,
one emoji) is text like any other.
"""

from __future__ import annotations

import json

import pytest

from build_fixtures import make_project, rows
from packtrain.core.configfile import load_config
from packtrain.pipeline.orchestrate.build import build
from test_conversations import CONFIG as CHAT

REASON = "the formatted text holds a lone surrogate '\\ud800' at character "


def build_and_bad_rows(project, overrides: dict) -> tuple[dict, list[dict]]:
    """Build the project's sql expert with ``overrides``: (its report, the first bad rows of its source)."""
    config = load_config("sql", project["configs"], overrides)
    result = build(config, project["cache"], log=lambda *_: None, progress=False)
    report = json.loads((result.path / "report.json").read_text())
    return report, report["sources"][0]["first_bad_rows"]


def write_lines(path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines))  # escapes as written: json.dumps would pair-check nothing


@pytest.mark.parametrize("fast", [True, False], ids=["shortcuts on", "shortcuts off"])
@pytest.mark.parametrize("num_proc", [1, 2])
def test_template_rows(tmp_path, fast, num_proc):
    project = make_project(tmp_path, n_rows=20)
    good = [json.dumps(r) for r in rows(20)]
    lone = json.dumps({**rows(1, 100)[0], "answer": "SELECT 1 -- "}).replace('-- "', '-- \\ud800"')
    pair = json.dumps({**rows(1, 200)[0], "answer": "SELECT 2 -- "}).replace('-- "', '-- \\ud83d\\ude00"')
    write_lines(project["data"], good[:5] + [lone] + good[5:] + [pair])
    report, bad = build_and_bad_rows(project, {"build.fast_encoder": fast, "build.line_cache": fast,
                                               "build.num_proc": num_proc})
    assert len(bad) == 1 and bad[0]["reason"].startswith(REASON) and bad[0]["at"] == 5, bad
    assert report["train"]["documents"] + report["val"]["documents"] == 21  # the pair is an emoji, kept


@pytest.mark.parametrize("fast", [True, False], ids=["shortcuts on", "shortcuts off"])
@pytest.mark.parametrize("num_proc", [1, 2])
def test_chat_rows(tmp_path, fast, num_proc):
    project = make_project(tmp_path, n_rows=4)
    (project["configs"] / "sql.yaml").write_text(CHAT.format(data=project["data"], model=project["model"]))
    chat = lambda answer: json.dumps({"messages": [{"role": "user", "content": "q"},  # noqa: E731
                                                   {"role": "assistant", "content": answer}]})
    lines = [chat(f"SELECT {i}") for i in range(12)]
    lines[3] = chat("SELECT x").replace('x"', 'x\\ud800"')
    write_lines(project["data"], lines)
    report, bad = build_and_bad_rows(project, {"build.fast_encoder": fast, "build.render_once": fast,
                                               "build.num_proc": num_proc})
    assert len(bad) == 1 and bad[0]["reason"].startswith(REASON) and bad[0]["at"] == 3, bad
    assert report["train"]["documents"] == 11


def test_a_lone_surrogate_in_the_config_is_one_line(tmp_path):
    """In a config value (YAML's "\\ud800" escape) or an override (an undecodable byte of a command-line
    argument reaches Python as one): the build id's hash failed with a traceback (found 2026-11-27)."""
    from packtrain.core.config import ConfigError

    project = make_project(tmp_path, n_rows=4)
    path = project["configs"] / "sql.yaml"
    original = path.read_text()
    assert "format:\n" in original
    path.write_text(original.replace("format:\n", 'format:\n  system: "You are \\ud800 helpful"\n'))
    with pytest.raises(ConfigError) as e:
        load_config("sql", project["configs"])
    assert str(e.value) == (f"{path}: format.system holds a lone surrogate ('\\ud800' at character 8), which is not "
                            "Unicode text: write the character itself, or both halves of its UTF-16 pair")
    path.write_text(original)
    with pytest.raises(ConfigError, match=r"^--set format.system=x: format.system holds a lone surrogate"):
        load_config("sql", project["configs"], {"format.system": "x\udcff"}, {"format.system": "--set format.system=x"})
