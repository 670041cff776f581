"""Issue 46 (round three), items 3 and 4 in part: the last unchecked values. A build under
``cache/<expert>/`` that is another expert's is refused by ``verify`` as by ``train`` (one check,
packtrain/core/contract.py ``check_build_expert``). The sampling options of ``generate``/``chat``:
tests/test_talk.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from packtrain.core.contract import read_current, write_current
from build_fixtures import make_project
from test_reliability_runs_inputs import assert_one_line_error, run_cli


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """A real build of the tiny project's expert sql (block_size 128); configs/json.yaml is the same expert
    under another name (no build)."""
    project = make_project(tmp_path_factory.mktemp("checked"))
    configs = project["configs"]
    (configs / "json.yaml").write_text((configs / "sql.yaml").read_text())
    done = run_cli("pretokenize", "sql", "--configs-dir", configs, "--cache-dir", project["cache"], "--no-progress")
    assert done.returncode == 0, done.stderr
    return project


def test_verify_refuses_another_experts_build_as_train_does(built, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(built["cache"], cache)
    build_id = read_current(cache, "sql")
    copy = cache / "json" / build_id
    shutil.copytree(cache / "sql" / build_id, copy)  # sql's build placed under cache/json/
    write_current(cache, "json", build_id)
    said = (f"error: build {copy} is a build of expert 'sql', not 'json' (its manifest.json says so): it belongs in "
            f"{cache / 'sql'}/; build json's own with `make pretokenize EXPERT=json`")
    verified = run_cli("verify", "json", "--cache-dir", cache)
    assert assert_one_line_error(verified) == said
    assert "checksums match" not in verified.stdout + verified.stderr
    trained = run_cli("train", "json", "--configs-dir", built["configs"], "--cache-dir", cache)  # before torch
    assert assert_one_line_error(trained) == said
    assert run_cli("verify", "sql", "--cache-dir", cache).returncode == 0  # the build itself is good
