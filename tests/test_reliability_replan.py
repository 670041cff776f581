"""A tokenizer file written while planning reads it (issue 12, class 1, continued).

Planning hashes each input file (the build id), then reads the tokenizer's files as the bytes it
hashed (pipeline/errors.read_as_hashed); other bytes are ``ContentChanged``. ``plan()`` then hashes and
plans once more, for every caller (build, rebuild, --ray, the parts commands), and refuses a file that
changes again with ``InputsChanged``: one line, nothing published.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from packtrain.core.contract import read_current
from packtrain.pipeline.orchestrate.build import build, plan
from packtrain.pipeline.errors import InputsChanged
from packtrain.pipeline.orchestrate.rebuild import rebuild_expert
from test_reliability_inputs_identity import builds, config_of, project, quiet  # noqa: F401 (project: its fixture)


def edit_after_hashing(monkeypatch, name: str, edit, times: int) -> list:
    """Run ``edit()`` right after ``name`` is hashed (planning's StatCache), the first ``times`` times:
    between the hash the build id takes and planning's own read of the file."""
    import packtrain.pipeline.hashcache

    hashed = []
    real = packtrain.pipeline.hashcache.StatCache.sha256

    def hooked(self, file):
        digest = real(self, file)
        if Path(file).name == name:
            hashed.append(digest)
            if len(hashed) <= times:
                edit()
        return digest

    monkeypatch.setattr(packtrain.pipeline.hashcache.StatCache, "sha256", hooked)
    return hashed


def test_tokenizer_file_edited_while_planning_is_planned_again(project, monkeypatch):
    """tokenizer_config.json edited between planning's hash of it and planning's read (its eos and
    pad ids, its template): the read is refused as other bytes (ContentChanged). Before 2026-11-27 the
    build then stopped with that one line; it now plans once more, as for an edit after planning,
    and refuses (InputsChanged, one line) only a file that changes again."""
    config_path = project["model"] / "tokenizer_config.json"

    def edit():  # a new value every time
        cfg = json.loads(config_path.read_text())
        cfg["model_max_length"] = cfg.get("model_max_length", 100) + 1
        config_path.write_text(json.dumps(cfg))

    hashed = edit_after_hashing(monkeypatch, "tokenizer_config.json", edit, times=1)
    logs: list[str] = []
    result = build(config_of(project), project["cache"], log=logs.append, progress=False)
    said = [line for line in logs if "changed while 'sql' was planned" in line]
    assert len(said) == 1 and str(config_path) in said[0]
    assert sum(line.startswith("source: ") for line in logs) == 1  # the sources are said once
    assert len(hashed) >= 2 and hashed[0] != hashed[1]
    now = hashlib.sha256(config_path.read_bytes()).hexdigest()
    assert result.build_id == plan(config_of(project), project["cache"]).build_id
    manifest = json.loads((result.path / "manifest.json").read_text())
    assert manifest["inputs"]["tokenizer"]["files"]["tokenizer_config.json"] == now  # the file as it is now
    assert builds(project["cache"]) == [result.build_id]

    (project["cache"] / "sql" / "CURRENT").unlink()
    edit_after_hashing(monkeypatch, "tokenizer_config.json", edit, times=2)
    with pytest.raises(InputsChanged) as e:
        build(config_of(project), project["cache"], log=quiet, progress=False)
    assert "\n" not in str(e.value) and "tokenizer_config.json changed while the build read it" in str(e.value)
    assert builds(project["cache"]) == [result.build_id]  # the earlier build is untouched
    assert read_current(project["cache"], "sql") is None

    # planning is where every caller meets it: rebuild (cron) plans before it builds
    edit_after_hashing(monkeypatch, "tokenizer_config.json", edit, times=1)
    outcome = rebuild_expert(config_of(project), project["cache"], keep=3, log=quiet)
    assert outcome.error is None and outcome.action == "rebuilt", outcome
    assert read_current(project["cache"], "sql") == outcome.new_build == plan(config_of(project), project["cache"]).build_id
