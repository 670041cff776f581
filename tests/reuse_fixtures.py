"""Helpers of the class 2 tests (test_reliability_reuse.py, test_reliability_readback.py): a small
build project with a runs directory, its config and build, the CLI run in-process, a flipped byte."""

from __future__ import annotations

import sys
from pathlib import Path

import packtrain.cli.commands
from build_fixtures import make_project
from packtrain.core.configfile import load_config
from packtrain.pipeline.orchestrate.build import build


def reuse_project(tmp_path: Path) -> dict:
    project = make_project(tmp_path)
    project["runs"] = tmp_path / "runs"
    return project


def config_of(project, **overrides):
    overrides.setdefault("train.output_dir", str(project["runs"]))
    return load_config("sql", project["configs"], overrides)


def run_build(project, **overrides):
    lines = []
    result = build(config_of(project, **overrides), project["cache"], log=lines.append, progress=False)
    return result, lines


def build_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.glob("*.arrow"))} | {"manifest": (path / "manifest.json").read_bytes()}


def run_cli(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    """The real entry point (``packtrain.cli.commands.run``) in this process: exit code, stdout, stderr."""
    monkeypatch.setattr(sys, "argv", ["packtrain", *map(str, args)])
    try:
        packtrain.cli.commands.run()
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def flip_byte(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0x01
    path.write_bytes(bytes(data))
