"""The config's ``cpu`` profile: on a machine without a CUDA GPU it fills in a short training run (shorter
sequences cut from the same blocks, few steps), but only where the user's own files and overrides left a
field unset; and it never touches the build: pretokenize, status and rebuild mean the same build on a
CPU and on a GPU."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

import packtrain.core.configfile as configfile
from packtrain.cli.commands import main
from packtrain.core.configfile import load_config, load_for_machine
from tests.build_fixtures import make_project

PROFILE = "cpu:\n  enabled: true\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The shipped shape: defaults.yaml turns the profile on, sql.yaml leaves pack.block_size to the default (2048)."""
    project = make_project(tmp_path, n_rows=60, block_size=128)
    (project["configs"] / "defaults.yaml").write_text(PROFILE)
    sql = project["configs"] / "sql.yaml"
    sql.write_text(sql.read_text().replace("  block_size: 128\n", ""))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, whatever this machine has
    return project


def test_the_profile_changes_training_only_and_keeps_what_the_expert_sets(project):
    written = load_config("sql", project["configs"])
    config, profiled = load_for_machine("sql", project["configs"])
    assert profiled is True
    assert config.pack.block_size == written.pack.block_size == 2048  # the build is the one a GPU trains
    assert {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name != "train"} == \
        {f.name: getattr(written, f.name) for f in dataclasses.fields(written) if f.name != "train"}
    assert (config.train.max_seq_length, config.train.max_steps, config.train.per_device_train_batch_size,
            config.train.gradient_accumulation_steps, config.train.max_eval_batches) == (512, 30, 1, 1, 1)

    chosen, _ = load_for_machine("sql", project["configs"], {"train.max_seq_length": 256,
                                                              "train.per_device_train_batch_size": 4,
                                                              "train.gradient_accumulation_steps": 2})
    assert (chosen.pack.block_size, chosen.train.max_seq_length, chosen.train.per_device_train_batch_size,
            chosen.train.gradient_accumulation_steps, chosen.train.max_steps) == (2048, 256, 4, 2, 30)

    short, _ = load_for_machine("sql", project["configs"], {"pack.block_size": 512})
    assert (short.pack.block_size, short.train.max_seq_length) == (512, None)  # blocks that short are trained whole


def test_a_gpu_or_cpu_enabled_false_trains_the_config_as_written(project, monkeypatch):
    monkeypatch.setattr(configfile, "has_cuda", lambda: True)
    config, profiled = load_for_machine("sql", project["configs"])
    assert (profiled, config.train.max_seq_length, config.train.max_steps,
            config.train.per_device_train_batch_size) == (False, None, None, 8)
    monkeypatch.setattr(configfile, "has_cuda", lambda: False)
    config, profiled = load_for_machine("sql", project["configs"], {"cpu.enabled": False})
    assert (profiled, config.train.max_seq_length, config.train.max_steps) == (False, None, None)


def test_a_max_seq_length_longer_than_the_block_is_refused(project):
    with pytest.raises(configfile.ConfigError, match=r"train.max_seq_length: 4096 is longer than pack.block_size "
                                                     r"2048: the trainer cuts blocks"):
        load_config("sql", project["configs"], {"train.max_seq_length": 4096})


def test_pretokenize_status_and_rebuild_mean_the_same_build_on_a_cpu_and_a_gpu(project, monkeypatch):
    where = ["--configs-dir", str(project["configs"]), "--cache-dir", str(project["cache"])]

    def invoke(*args):
        result = CliRunner().invoke(main, [*args, *where], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout

    def built(*args) -> dict:
        return json.loads(invoke("pretokenize", "sql", *args).strip().splitlines()[-1])

    on_cpu = built()  # no CUDA: the cpu profile is on for training
    manifest = json.loads((project["cache"] / "sql" / on_cpu["build_id"] / "manifest.json").read_text())
    assert manifest["inputs"]["pack"]["block_size"] == 2048
    assert built("--set", "cpu.enabled=false") == {**on_cpu, "up_to_date": True}
    monkeypatch.setattr(configfile, "has_cuda", lambda: True)  # a GPU machine
    assert built() == {**on_cpu, "up_to_date": True}
    monkeypatch.setattr(configfile, "has_cuda", lambda: False)

    row = json.loads(invoke("status", "sql", "--json"))
    assert (row["build"], row["inputs_changed"]) == (on_cpu["build_id"], False)
    line = json.loads(invoke("rebuild", "sql"))
    assert (line["action"], line["old_build"], line["new_build"]) == ("up-to-date", on_cpu["build_id"],
                                                                      on_cpu["build_id"])


def test_the_profile_is_said_in_one_short_line(project):
    config, _ = load_for_machine("sql", project["configs"])
    assert config.cpu_note() == (
        "no CUDA GPU: the cpu profile (configs/defaults.yaml cpu:) trains 512-token windows of the 2048-token blocks, "
        "30 steps of 1 sequence(s), evaluation on 1 batch(es) of 2, end-of-run answers within 768 tokens a model; "
        "cpu.enabled: false trains the full config")
    assert config.cpu_note(5) == (  # train --max-steps 5: the steps that will run
        "no CUDA GPU: the cpu profile (configs/defaults.yaml cpu:) trains 512-token windows of the 2048-token blocks, "
        "5 steps (--max-steps) of 1 sequence(s), evaluation on 1 batch(es) of 2, end-of-run answers within 768 tokens "
        "a model; cpu.enabled: false trains the full config")
    assert "1 step (--max-steps)" in config.cpu_note(1)
    built = CliRunner().invoke(main, ["pretokenize", "sql", "--configs-dir", str(project["configs"]),
                                      "--cache-dir", str(project["cache"])], catch_exceptions=False)
    assert built.exit_code == 0 and "cpu profile" not in built.output  # the build is the same everywhere


def test_config_prints_the_config_itself_and_says_on_stderr_what_the_profile_changes_here(project, tmp_path):
    """`packtrain config` is safe to paste back: on a CPU it printed the profile's values (max_steps: 30,
    max_seq_length: 512), which would then bind on a GPU too. It prints the config as written, the same
    on every machine; the profile's changes on this machine are one comment line on stderr."""
    import yaml

    def shown(*args):
        result = CliRunner().invoke(main, ["config", "sql", "--configs-dir", str(project["configs"]), *args],
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result

    on_cpu = shown()
    printed = yaml.safe_load(on_cpu.stdout)
    assert printed == load_config("sql", project["configs"]).to_dict()
    assert (printed["train"]["max_steps"], printed["train"]["max_seq_length"]) == (None, None)
    assert on_cpu.stderr == (
        "# no CUDA GPU: `packtrain train` here applies the cpu profile (configs/defaults.yaml cpu:; cpu.enabled: false "
        "turns it off), which trains with train.max_steps: 30 (null in the config), train.max_seq_length: 512 (null "
        "in the config), train.per_device_train_batch_size: 1 (8 in the config), train.per_device_eval_batch_size: 2 (8 "
            "in the config), train.max_eval_batches: 1 (null in "
        "the config), train.save_minutes: 1.0 (10.0 in the config)\n")
    assert json.loads(shown("--json").stdout) == printed
    pasted = tmp_path / "pasted"  # pasted back as an expert's file, it resolves to the same config
    pasted.mkdir()
    (pasted / "defaults.yaml").write_text(PROFILE)
    (pasted / "sql.yaml").write_text(on_cpu.stdout)
    assert load_config("sql", pasted).to_dict() == printed
    configfile_has_cuda = configfile.has_cuda
    try:
        configfile.has_cuda = lambda: True  # a GPU machine: the same config, nothing on stderr
        on_gpu = shown()
    finally:
        configfile.has_cuda = configfile_has_cuda
    assert (on_gpu.stdout, on_gpu.stderr) == (on_cpu.stdout, "")
