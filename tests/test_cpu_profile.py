"""The config's ``cpu`` profile: on a machine without a CUDA GPU it fills in a short run, but only
where the user's own files and overrides left a field unset; and the build, status and rebuild
apply it alike, so they mean the same build."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import packtrain.core.configfile as configfile
from packtrain.core.configfile import load_for_machine
from tests.build_fixtures import ROOT, make_project

PROFILE = "cpu:\n  enabled: true\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    project = make_project(tmp_path, n_rows=60, block_size=128)
    (project["configs"] / "defaults.yaml").write_text(PROFILE + "pack:\n  block_size: 4096\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, whatever this machine has
    return project


def test_the_profile_replaces_shared_defaults_but_keeps_what_the_expert_sets(project):
    config, profiled = load_for_machine("sql", project["configs"])
    assert profiled is True
    assert config.pack.block_size == 128  # written in sql.yaml: kept (defaults.yaml's 4096 is not)
    assert (config.train.max_steps, config.train.per_device_train_batch_size, config.train.gradient_accumulation_steps,
            config.train.max_eval_batches) == (30, 1, 1, 1)

    sql = project["configs"] / "sql.yaml"
    sql.write_text(sql.read_text().replace("  block_size: 128\n", ""))
    assert load_for_machine("sql", project["configs"])[0].pack.block_size == 512  # unset there: the profile's

    chosen, _ = load_for_machine("sql", project["configs"], {"pack.block_size": 256, "train.per_device_train_batch_size": 4,
                                                              "train.gradient_accumulation_steps": 2})
    assert (chosen.pack.block_size, chosen.train.per_device_train_batch_size,
            chosen.train.gradient_accumulation_steps, chosen.train.max_steps) == (256, 4, 2, 30)


def test_a_gpu_or_cpu_enabled_false_trains_the_config_as_written(project, monkeypatch):
    monkeypatch.setattr(configfile, "has_cuda", lambda: True)
    config, profiled = load_for_machine("sql", project["configs"])
    assert (profiled, config.train.max_steps, config.train.per_device_train_batch_size) == (False, None, 8)
    monkeypatch.setattr(configfile, "has_cuda", lambda: False)
    config, profiled = load_for_machine("sql", project["configs"], {"cpu.enabled": False})
    assert (profiled, config.train.max_steps) == (False, None)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "packtrain.cli", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})


def test_pretokenize_status_and_rebuild_mean_the_same_build_on_a_cpu(project):
    sql = project["configs"] / "sql.yaml"
    sql.write_text(sql.read_text().replace("  block_size: 128\n", ""))  # the profile's 512 applies
    where = ("--configs-dir", project["configs"], "--cache-dir", project["cache"])
    built = cli("pretokenize", "sql", *where)
    assert built.returncode == 0, built.stderr
    assert "no CUDA GPU: the cpu profile applies" in built.stderr and "blocks of 512 tokens" in built.stderr
    build_id = json.loads(built.stdout.splitlines()[-1])["build_id"]
    manifest = json.loads((project["cache"] / "sql" / build_id / "manifest.json").read_text())
    assert manifest["inputs"]["pack"]["block_size"] == 512

    status = cli("status", "sql", "--json", *where)
    assert status.returncode == 0, status.stderr
    row = json.loads(status.stdout)
    assert (row["build"], row["inputs_changed"]) == (build_id, False)
    rebuilt = cli("rebuild", "sql", *where)
    assert rebuilt.returncode == 0, rebuilt.stderr
    line = json.loads(rebuilt.stdout)
    assert (line["action"], line["old_build"], line["new_build"]) == ("up-to-date", build_id, build_id)
