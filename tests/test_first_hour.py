"""A new user's first hour (docs/reliability-history.md, "A new user's first hour (user 54)"): the
mistakes of a first contact get a message that names the user's own expert file and the right fix:
an expert name with a typo (or a new one with no file yet), a split the cached dataset does not have
(not "download it"), a misspelt column under the CLI (configs/<that expert>.yaml, not a placeholder),
and a num_proc far above the CPUs (said: the processes take turns on them)."""

from __future__ import annotations

import json
import os
import re

import pytest
from build_fixtures import make_project, write_jsonl
from reuse_fixtures import run_cli

from packtrain.core import hints
from packtrain.core.config import ConfigError
from packtrain.core.config_build import BuildConfig
from packtrain.core.config_sources import SourceConfig
from packtrain.core.configfile import load_config
from packtrain.core.resolve import SourceNotFound
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.read.discover import resolve_source


def test_an_expert_name_with_a_typo_names_the_close_one_and_how_to_add_a_new_expert(tmp_path):
    for name in ("sql", "neo4j"):
        (tmp_path / f"{name}.yaml").write_text("sources:\n  - name: bundled\n")
    with pytest.raises(ConfigError) as err:
        load_config("sqll", tmp_path)
    assert str(err.value) == (
        f"no config for expert 'sqll': {tmp_path}/sqll.yaml does not exist (did you mean 'sql'?) (known experts: "
        f"neo4j, sql); a new expert is a file of its own: write {tmp_path}/sqll.yaml (its sources: and format:, "
        "docs/CONFIG.md)")
    with pytest.raises(ConfigError) as err:  # a new expert's name is close to none: no guess
        load_config("text2sql", tmp_path)
    assert str(err.value).startswith(f"no config for expert 'text2sql': {tmp_path}/text2sql.yaml does not exist "
                                     "(known experts: neo4j, sql); a new expert")


def test_a_split_the_cached_dataset_lacks_is_said_and_not_to_be_downloaded(hub_cache):
    """It said 'dataset 'org/parquet-ds' (split 'validation') is not on this machine (did you mean
    'org/parquet-ds'?)' and to download it, of a dataset in the cache with its train and test splits."""
    with hints.given(expert="t2s", via_make=True), pytest.raises(SourceNotFound) as err:
        resolve_source(SourceConfig(name="org/parquet-ds", split="validation"))
    assert str(err.value) == (
        f"dataset 'org/parquet-ds' has no split 'validation' on this machine: hub cache snapshot {hub_cache.parquet}: "
        "no data file for split 'validation' among ['data/test-00000-of-00001.parquet', "
        "'data/train-00000-of-00001.parquet'] (its splits: train, test); set split: under the source in "
        "configs/t2s.yaml to one of them")


def test_the_cli_names_the_running_experts_config_file_in_a_hint(tmp_path, monkeypatch, capsys):
    """A misspelt messages column said 'set format.messages in configs/<expert>.yaml'."""
    project = make_project(tmp_path)
    write_jsonl(project["data"], [{"messages": [{"role": "user", "content": "hi"}]}])
    text = (project["configs"] / "sql.yaml").read_text()
    (project["configs"] / "t2s.yaml").write_text(
        text.split("format:")[0] + "format:\n  style: chat\n  messages: mesages\npack:" + text.split("pack:")[1])
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(monkeypatch, capsys, "pretokenize", "t2s", "--cache-dir", project["cache"])
    assert (code, err.splitlines()[-1]) == (2, (
        f"error: {project['data']}: no column 'mesages' (did you mean 'messages'?) (it has: 'messages'); set "
        "format.messages in configs/t2s.yaml to the column holding the conversations (a list of "
        "{\"role\", \"content\"} messages)"))
    assert hints.config_file() == "configs/<expert>.yaml"  # outside a command: the placeholder again


def test_a_num_proc_far_above_the_cpus_is_said(tmp_path, monkeypatch):
    project = make_project(tmp_path, n_rows=60)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    lines: list[str] = []
    config = load_config("sql", project["configs"], overrides={"build.num_proc": 3, "build.batch_rows": 20})
    build(config, project["cache"], log=lines.append, progress=False)
    assert ("num_proc 3 > the 1 CPU this build may use: its processes take turns on them (slower than one a "
            "CPU); --num-proc 1 (build.num_proc) is usually fastest") in lines


@pytest.mark.parametrize(("setting", "cpus", "processes"), [("auto", 2, 2), ("auto", 1, 1), ("auto", 64, 8), (5, 2, 5)])
def test_num_proc_auto_is_one_process_a_cpu_this_process_may_use_at_most_eight(monkeypatch, setting, cpus, processes):
    """The default was 8 whatever the machine: a 2-CPU box or CI started 8 processes, each with a tokenizer."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    assert BuildConfig().num_proc == "auto"
    assert BuildConfig(num_proc=setting).processes() == processes


def test_a_default_num_proc_is_never_said_to_be_above_the_cpus(tmp_path, monkeypatch):
    project = make_project(tmp_path, n_rows=60)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)  # a 2-CPU box: 8 was said
    lines: list[str] = []
    config = load_config("sql", project["configs"], overrides={"build.num_proc": "auto", "build.batch_rows": 20})
    build(config, project["cache"], log=lines.append, progress=False)
    assert not [line for line in lines if "num_proc" in line and "CPU" in line]
    assert "tokenizing with num_proc=2\n" in "\n".join(lines)  # the summary's first line ends there


def test_the_resume_hint_repeats_the_steps_and_options_the_run_was_started_with():
    """After `make train EXPERT=tnew MAX_STEPS=4` and a Ctrl-C the line said `make train EXPERT=tnew
    RESUME=auto`, which resumed a 30-step run (the cpu profile's) with another lr schedule."""
    with hints.given(max_steps=4, via_make=True, expert="tnew"):
        assert hints.command("train", "tnew", resume="auto") == "`make train EXPERT=tnew MAX_STEPS=4 RESUME=auto`"
        assert hints.command("pretokenize", "tnew") == "`make pretokenize EXPERT=tnew`"  # a build takes no steps
    with hints.given(max_steps=4, cache_dir="/data/cache", settings=("train.learning_rate=1e-4",)):
        assert hints.command("train", "tnew", resume="auto") == (
            "`packtrain train tnew --cache-dir /data/cache --set train.learning_rate=1e-4 --max-steps 4 --resume auto`")


def test_make_export_without_out_says_out_in_makes_words():
    """`make export EXPERT=sql` ran `packtrain export sql --out` and said "Option '--out' requires an
    argument. (see `packtrain export --help`)": the CLI's option, not the make variable to set."""
    import subprocess

    from build_fixtures import ROOT

    planned = subprocess.run(["make", "-n", "export", "EXPERT=sql"], cwd=ROOT, capture_output=True, text=True)
    assert planned.returncode == 2
    assert ("*** make export needs OUT=dir (a new or empty directory for the adapter): make export EXPERT=sql "
            "OUT=exports/sql.  Stop.") in planned.stderr


def test_a_new_run_beside_an_unfinished_one_says_how_to_continue_that_one(tmp_path, caplog):
    """`make train` again after a Ctrl-C started a new run without a word of the stopped run's checkpoint."""
    import logging
    import shutil

    from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build

    from packtrain.core.rundir import FINAL_ARTIFACTS
    from packtrain.trainer.run.train import run

    model_dir = tiny_model_dir(tmp_path / "model")
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    stopped = run(make_config(model_dir, tmp_path / "runs", run_name="a", max_steps=2, save_steps=1), tmp_path / "cache")
    for name in FINAL_ARTIFACTS:  # as a run stopped after its checkpoint-2
        shutil.rmtree(stopped / name) if (stopped / name).is_dir() else (stopped / name).unlink(missing_ok=True)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="packtrain.train"):
        run(make_config(model_dir, tmp_path / "runs", run_name="b", max_steps=1), tmp_path / "cache")
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("a new run:")]
    assert said == [f"a new run: {stopped} is an unfinished run with checkpoint-2 (stopped or killed), kept as it is; "
                    "`packtrain train sql --resume auto` continues it instead"]
    # the summary's JSON (700 characters of unrounded floats on the console) goes to train.log only
    done = [r for r in caplog.records if r.getMessage().startswith("done:")]
    assert [getattr(r, "file_only", False) for r in done] == [True, False]
    assert re.fullmatch(r"done: 1 step, 63 tokens \(\d+ supervised\) in \d+ s; .*/runs/sql/b/summary.json holds the "
                        r"metrics", done[1].getMessage()), done[1].getMessage()


def test_no_makefile_recipe_echoes_a_comment():
    """A first `make train` printed the install recipe's comments ('# real tokenizers for the exactness tests
    ... TRL, the reference packer of tests/test_pack.py'): a recipe line is echoed unless it starts with @."""
    from build_fixtures import ROOT

    echoed = [line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("\t#")]
    assert echoed == []


def test_rebuild_all_names_each_experts_own_config_file(tmp_path, monkeypatch, capsys):
    """`make rebuild` over several experts: a failed one's line named configs/<expert>.yaml."""
    project = make_project(tmp_path)
    text = (project["configs"] / "sql.yaml").read_text()
    (project["configs"] / "t2s.yaml").write_text(
        text.split("format:")[0] + "format:\n  style: chat\n  messages: mesages\npack:" + text.split("pack:")[1])
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(monkeypatch, capsys, "rebuild", "t2s", "--cache-dir", project["cache"])
    line = json.loads(out.splitlines()[-1])
    assert (code, line["expert"], line["action"]) == (1, "t2s", "failed")
    assert "set format.messages in configs/t2s.yaml to the column" in line["error"], line["error"]
