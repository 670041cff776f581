"""The encoder is part of a build's identity (pipeline/encode/fast/exactness.py ``encoder_identity``): the
tokenizers, fastokens, tiktoken and (for chat) jinja2 versions and the shortcuts allowed change the
build id and every source-cache key; merge refuses parts made with another encoder; builds from
before the identity existed are still read."""

from __future__ import annotations

import json

from build_fixtures import make_project
from packtrain.core.configfile import load_config
from packtrain.core.contract import Manifest
from packtrain.pipeline.orchestrate.build import build, plan
from packtrain.pipeline.encode.fast import exactness
from packtrain.pipeline.errors import BuildError

SHORTCUTS_OFF = {"build.line_cache": False, "build.fast_encoder": False}


def quiet(*_):
    pass


def test_the_tokenizers_version_and_the_shortcuts_are_part_of_the_identity(tmp_path, monkeypatch):
    project = make_project(tmp_path)
    config = load_config("sql", project["configs"])
    first = plan(config, project["cache"])
    assert first.inputs["encoder"] == {"tokenizers": exactness.library_version("tokenizers"),
                                       "fastokens": exactness.library_version("fastokens"),
                                       "tiktoken": exactness.library_version("tiktoken"), "jinja2": None,
                                       "shortcuts": ["fast_encoder", "line_cache"]}
    chat = plan(load_config("sql", project["configs"], {"format.style": "chat"}), project["cache"])
    assert chat.inputs["encoder"]["jinja2"] == exactness.library_version("jinja2")  # it renders the chat template
    only_tiktoken = plan(load_config("sql", project["configs"], {"build.fast_encoder": "tiktoken"}), project["cache"])
    assert only_tiktoken.inputs["encoder"]["fastokens"] is None
    no_line_cache = plan(load_config("sql", project["configs"], {"build.line_cache": False}), project["cache"])
    assert no_line_cache.inputs["encoder"]["shortcuts"] == ["fast_encoder"]
    off = plan(load_config("sql", project["configs"], SHORTCUTS_OFF), project["cache"])
    assert off.inputs["encoder"] == {"tokenizers": exactness.library_version("tokenizers"), "fastokens": None,
                                     "tiktoken": None, "jinja2": None, "shortcuts": []}
    real = exactness.library_version
    monkeypatch.setattr(exactness, "library_version", lambda name: "0.3.6" if name == "fastokens" else real(name))
    new_fastokens = plan(config, project["cache"])
    monkeypatch.setattr(exactness, "library_version", lambda name: "1.0.0" if name == "tokenizers" else real(name))
    upgraded = plan(config, project["cache"])
    ids = {first.build_id, only_tiktoken.build_id, no_line_cache.build_id, off.build_id, new_fastokens.build_id,
           upgraded.build_id}
    assert len(ids) == 6
    result = build(config, project["cache"], log=quiet, progress=False)
    assert result.build_id == upgraded.build_id
    assert Manifest.load(result.path, full=True).inputs["encoder"]["tokenizers"] == "1.0.0"


def test_merge_refuses_parts_made_with_another_encoder(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from packtrain.cli.commands import main

    project = make_project(tmp_path)
    args = ["--configs-dir", str(project["configs"]), "--cache-dir", str(project["cache"])]
    runner = CliRunner()
    assert runner.invoke(main, ["pretokenize", "sql", "--part", "0/2", *args]).exit_code == 0
    real = exactness.library_version
    monkeypatch.setattr(exactness, "library_version", lambda name: "1.0.0" if name == "tokenizers" else real(name))
    assert runner.invoke(main, ["pretokenize", "sql", "--part", "1/2", *args]).exit_code == 0
    result = runner.invoke(main, ["merge-parts", "sql", "--parts", "2", *args])
    assert isinstance(result.exception, BuildError)  # the entry point prints it as one line, exit 2
    line = str(result.exception)
    assert "\n" not in line and line.startswith("cannot merge 'sql': part(s) 0-of-2 of source")
    assert (f"tokenized with tokenizers {real('tokenizers')} + fastokens {real('fastokens')} + tiktoken "
            f"{real('tiktoken')}") in line
    assert "this machine uses tokenizers 1.0.0 + fastokens" in line


def test_pruning_reads_a_manifest_from_before_the_encoder_identity(tmp_path):
    """rebuild prunes old builds after every build: one written by an older packtrain (no inputs.encoder)
    is read, not a KeyError."""
    from packtrain.pipeline.orchestrate.rebuild import prune_builds

    project = make_project(tmp_path)
    result = build(load_config("sql", project["configs"]), project["cache"], log=quiet, progress=False)
    manifest = json.loads((result.path / "manifest.json").read_text())
    del manifest["inputs"]["encoder"]
    (result.path / "manifest.json").write_text(json.dumps(manifest))
    assert prune_builds(project["cache"], "sql", keep=3, runs_dir=tmp_path / "runs") == []
