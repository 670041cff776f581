"""Every hint matches the mistake (issue 25, item 4): a ``--configs-dir`` without ``defaults.yaml``
still layers over the shipped defaults; a config key from torchtune, axolotl or HF is refused with the
packtrain field to write; a typo in ``--set`` is reported as coming from ``--set``; a missing local
path is said to be missing (relative to which directory), not to be downloaded from the hub; a wrong
``format.messages`` column names the dataset's columns and format.messages."""

from __future__ import annotations

import dataclasses

import pytest
from build_fixtures import ROOT, make_project, write_jsonl
from reuse_fixtures import run_cli

from packtrain.cli.options import resolve
from packtrain.core.config import ConfigError
from packtrain.core.config_sources import SourceConfig
from packtrain.core.config_train import TrainConfig
from packtrain.core.configfile import config_from_dict, load_config
from packtrain.core.resolve import SourceNotFound, resolve_model_dir
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.read.discover import SourceError, resolve_source

SNIPPET = 'sources:\n  - name: bundled\nformat:\n  prompt: "{question}"\n  answer: "{answer}"\n'


def quiet(*_):
    pass


# --- a --configs-dir without defaults.yaml layers over the shipped defaults ------------------------


def test_a_configs_dir_without_defaults_keeps_the_shipped_model(tmp_path, monkeypatch):
    monkeypatch.delenv("PACKTRAIN_MODEL")  # conftest's stand-in for defaults.yaml's model
    (tmp_path / "sql.yaml").write_text(SNIPPET)
    config = load_config("sql", tmp_path)
    assert (config.model.name, config.cpu.enabled) == ("smollm2-135m", True)  # configs/defaults.yaml's
    assert (ROOT / "configs" / "defaults.yaml").read_text().count("name: smollm2-135m") == 1


def test_a_configs_dir_with_its_own_defaults_uses_them(tmp_path, monkeypatch):
    monkeypatch.delenv("PACKTRAIN_MODEL")
    (tmp_path / "sql.yaml").write_text(SNIPPET)
    (tmp_path / "defaults.yaml").write_text("model:\n  name: bundled\n")
    config = load_config("sql", tmp_path)
    assert (config.model.name, config.cpu.enabled) == ("bundled", False)  # its own, not layered over the shipped


# --- names from other tools: refused, with the field to write --------------------------------------


@pytest.mark.parametrize("data, problem", [
    ({"lora": {"rank": 8}}, "lora.rank: unknown key (did you mean r?)"),
    ({"lora": {"lora_r": 8}}, "lora.lora_r: unknown key (did you mean r?)"),
    ({"lora_r": 8}, "lora_r: unknown key (did you mean lora.r?)"),
    ({"rank": 8}, "rank: unknown key (did you mean lora.r?)"),
    ({"lora": {"lora_alpha": 16}}, "lora.lora_alpha: unknown key (did you mean alpha?)"),
    ({"lora_dropout": 0.05}, "lora_dropout: unknown key (did you mean lora.dropout?)"),
    ({"num_epochs": 3}, "num_epochs: unknown key (did you mean train.num_train_epochs?)"),
    ({"train": {"epochs": 3}}, "train.epochs: unknown key (did you mean num_train_epochs?)"),
    ({"max_seq_length": 512}, "max_seq_length: unknown key (did you mean pack.block_size or train.max_seq_length?)"),
    ({"pack": {"sequence_len": 512}}, "pack.sequence_len: unknown key (did you mean block_size or train.max_seq_length?)"),
    ({"train": {"micro_batch_size": 2}}, "train.micro_batch_size: unknown key (did you mean per_device_train_batch_size?)"),
    ({"train": {"lr": 0.001}}, "train.lr: unknown key (did you mean learning_rate?)"),
    ({"base_model": "x"}, "base_model: unknown key (did you mean model.name?)"),
    ({"learning_rate": 0.001}, "learning_rate: unknown key (did you mean train.learning_rate?)"),  # another section's field
    ({"r": 8}, "r: unknown key (did you mean lora.r?)"),
])
def test_names_from_other_tools_are_refused_with_the_field_to_write(data, problem):
    with pytest.raises(ConfigError) as err:
        config_from_dict({"expert": "sql", "sources": [{"name": "bundled"}], **data})
    message = str(err.value)
    assert message.startswith(f"invalid config (<dict>): {problem}; known: "), message
    assert "\n" not in message


@pytest.mark.parametrize("data, problem", [
    ({"train": {"packing": True}}, "train.packing: unknown key (packing has no meaning on packed blocks: packtrain always "
     "packs: the build packs documents into blocks of pack.block_size tokens (pack.strategy picks how); remove it)"),
    ({"sample_packing": True}, "sample_packing: unknown key (sample_packing has no meaning on packed blocks: packtrain "
     "always packs: the build packs documents into blocks of pack.block_size tokens (pack.strategy picks how); remove it)"),
    ({"train": {"group_by_length": True}}, "train.group_by_length: unknown key (group_by_length has no meaning on packed "
     "blocks: every packed block has the same length, so there are no lengths to group batches by; remove it)"),
    ({"train": {"dataloader_drop_last": True}}, "train.dataloader_drop_last: unknown key (dataloader_drop_last has no "
     "meaning on packed blocks: no sequence is dropped and every micro-batch is full: an epoch's last one is filled "
     "with sequences that train nothing (trainer/data/epochs.py); remove it)"),
    ({"pack": {"pad_to_multiple_of": 8}}, "pack.pad_to_multiple_of: unknown key (pad_to_multiple_of has no meaning on "
     "packed blocks: every block has pack.block_size tokens (train.max_seq_length windows of them), so nothing is "
     "padded per batch; remove it)"),
])
def test_flags_with_no_meaning_on_packed_blocks_are_refused_saying_why(data, problem):
    """Before (issue 47): ``unknown key`` with no word on why (group_by_length), a close spelling
    (dataloader_drop_last: did you mean dataloader_num_workers, ...?) or a field that is no answer
    (packing: did you mean pack.strategy?)."""
    with pytest.raises(ConfigError) as err:
        config_from_dict({"expert": "sql", "sources": [{"name": "bundled"}], **data})
    message = str(err.value)
    assert message.startswith(f"invalid config (<dict>): {problem}; known: "), message
    assert "\n" not in message


# --- a typo in --set is reported as coming from --set ----------------------------------------------


def test_a_typo_in_set_is_reported_as_coming_from_set(tmp_path):
    project = make_project(tmp_path)
    with pytest.raises(ConfigError) as err:
        resolve("sql", project["configs"], None, None, None, ("train.learnig_rate=3e-4",))
    known = ", ".join(f.name for f in dataclasses.fields(TrainConfig))
    assert str(err.value) == ("invalid config (--set train.learnig_rate=3e-4): train.learnig_rate: unknown key "
                              f"(did you mean learning_rate?); known: {known}")


def test_problems_of_the_file_and_of_set_each_say_where_they_come_from(tmp_path):
    project = make_project(tmp_path)
    path = project["configs"] / "sql.yaml"
    path.write_text(path.read_text() + "lora:\n  rank: 8\n")
    with pytest.raises(ConfigError) as err:
        resolve("sql", project["configs"], None, None, 0, ("train.lr=1",))
    lines = [line.partition("; known")[0] for line in str(err.value).splitlines()]
    assert lines == [
        f"invalid config ({path}, --set train.lr=1, --num-proc 0):",
        "  - lora.rank: unknown key (did you mean r?)",
        "  - --set train.lr=1: train.lr: unknown key (did you mean learning_rate?)",
        "  - --num-proc 0: build.num_proc: must be in [1, 1024] (tokenizer processes or auto; capped at the number "
        "of batches), got 0",
    ]


def test_the_cli_says_set_in_one_line(tmp_path, monkeypatch, capsys):
    project = make_project(tmp_path)
    code, _, err = run_cli(monkeypatch, capsys, "config", "sql", "--configs-dir", project["configs"],
                           "--set", "train.learnig_rate=3e-4")
    assert code == 2
    assert err.startswith("error: invalid config (--set train.learnig_rate=3e-4): train.learnig_rate: "
                          "unknown key (did you mean learning_rate?); known: seed, ")
    assert len(err.splitlines()) == 1


# --- a missing local path is missing, not a hub download ------------------------------------------


def test_a_missing_local_dataset_file_is_said_to_be_missing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceNotFound) as err:
        resolve_source(SourceConfig(name="data/nope.jsonl"))
    assert str(err.value) == (
        f"dataset 'data/nope.jsonl': {tmp_path}/data/nope.jsonl does not exist (a relative path is read from the "
        f"working directory {tmp_path}); check the path (or give an absolute one) in sources: of "
        "configs/<expert>.yaml / --dataset")
    with pytest.raises(SourceNotFound) as err:
        resolve_source(SourceConfig(name=str(tmp_path / "gone" / "train.csv")))
    assert str(err.value) == (f"dataset '{tmp_path}/gone/train.csv': {tmp_path}/gone/train.csv does not exist; "
                              "check the path (or give an absolute one) in sources: of configs/<expert>.yaml / --dataset")


def test_the_cli_says_a_missing_dataset_file_is_missing(tmp_path, monkeypatch, capsys):
    project = make_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(monkeypatch, capsys, "pretokenize", "sql", "--configs-dir", project["configs"],
                           "--cache-dir", project["cache"], "--dataset", "data/nope.jsonl")
    assert (code, err) == (2, f"error: dataset 'data/nope.jsonl': {tmp_path}/data/nope.jsonl does not exist (a relative "
                              f"path is read from the working directory {tmp_path}); check the path (or give an "
                              "absolute one) in sources: of configs/sql.yaml / --dataset\n")


@pytest.mark.parametrize("name", ["./my-model", "../models/base", "models/a/b"])
def test_a_missing_local_model_directory_is_said_to_be_missing(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceNotFound) as err:
        resolve_model_dir(name)
    where = (tmp_path / name).resolve()
    assert str(err.value) == (
        f"model {name!r}: {where} does not exist (a relative path is read from the working directory {tmp_path}); "
        "check the path, or set model.name / --model to a directory holding config.json and the weights")


def test_an_hf_id_is_still_looked_for_in_the_caches(hf_home):
    with pytest.raises(SourceNotFound, match=r"^dataset 'org/nope' \(split 'train'\) is not on this machine; "):
        resolve_source(SourceConfig(name="org/nope"))


# --- a wrong column: what the dataset has, and the field that names it -----------------------------


def test_a_wrong_messages_column_names_the_columns_and_format_messages(tmp_path):
    project = make_project(tmp_path)
    write_jsonl(project["data"], [{"conversations": [{"role": "user", "content": "hi"}], "id": 1}])
    path = project["configs"] / "sql.yaml"
    path.write_text(path.read_text().split("format:")[0] + "format:\n  style: chat\n  messages: messages\n" +
                    "pack:" + path.read_text().split("pack:")[1])
    config = load_config("sql", project["configs"])
    with pytest.raises(SourceError) as err:
        build(config, project["cache"], log=quiet, progress=False)
    assert str(err.value) == (
        f"{project['data']}: no column 'messages' (it has: 'conversations', 'id'); set format.messages in "
        "configs/<expert>.yaml to the column holding the conversations (a list of {\"role\", \"content\"} messages)")


def test_a_misspelt_column_is_refused_with_the_close_one(tmp_path):
    """Issue 47: ``columns: {question: querry}`` over a dataset whose column is ``query`` names the close
    column, as a misspelt config key does (packtrain/core/config_names.py); several misspelt, each its own."""
    project = make_project(tmp_path)
    write_jsonl(project["data"], [{"query": "q", "contxt": "c", "answer": "a"}])
    path = project["configs"] / "sql.yaml"
    path.write_text(path.read_text().replace(f"  - name: {project['data']}\n",
                                             f"  - name: {project['data']}\n    columns: {{question: querry}}\n"))
    with pytest.raises(SourceError) as err:
        build(load_config("sql", project["configs"]), project["cache"], log=quiet, progress=False)
    assert str(err.value).startswith(
        f"{project['data']}: no column 'context', 'querry' (did you mean 'contxt' for 'context', 'query' for 'querry'?) "
        "(it has: 'answer', 'contxt', 'query'); map the template's fields")
    write_jsonl(project["data"], [{"query": "q", "context": "c", "answer": "a"}])
    with pytest.raises(SourceError) as err:
        build(load_config("sql", project["configs"]), project["cache"], log=quiet, progress=False)
    assert str(err.value).startswith(
        f"{project['data']}: no column 'querry' (did you mean 'query'?) (it has: 'answer', 'context', 'query'); ")


def test_a_wrong_template_field_still_says_to_map_it(tmp_path):
    project = make_project(tmp_path)
    write_jsonl(project["data"], [{"question": "q", "answer": "a"}])
    with pytest.raises(SourceError) as err:
        build(load_config("sql", project["configs"]), project["cache"], log=quiet, progress=False)
    assert str(err.value) == (
        f"{project['data']}: no column 'context' (it has: 'answer', 'question'); map the template's fields to this "
        "dataset's columns with `columns: {field: column}` under the source in configs/<expert>.yaml, or name those "
        "columns in format.prompt / format.answer")
    from packtrain.core import hints

    with hints.given(configs_dir=project["configs"]), pytest.raises(SourceError) as err:  # --configs-dir DIR
        build(load_config("sql", project["configs"]), project["cache"], log=quiet, progress=False)
    assert f"under the source in {project['configs'] / '<expert>.yaml'}, or name those columns" in str(err.value)


# --- hints repeat the user's own options, in the form the user ran packtrain (issue 47, item 8) ---


def test_a_hint_is_the_cli_form_with_the_options_given_or_the_make_form_under_make():
    from packtrain.core import hints

    assert hints.command("pretokenize", "neo4j") == "`packtrain pretokenize neo4j`"
    assert hints.config_file("chatsg") == "configs/chatsg.yaml"
    with hints.given(cache_dir="/data/cache", configs_dir="/data/configs", runs_dir="runs", dataset=None,
                     settings=("pack.block_size=1024",), via_make=False):
        assert hints.command("pretokenize", "neo4j") == ("`packtrain pretokenize neo4j --configs-dir /data/configs "
                                                         "--cache-dir /data/cache --set pack.block_size=1024`")
        assert hints.command("verify", "neo4j.stage1") == "`packtrain verify neo4j --cache-dir /data/cache`"
        assert hints.config_file("chatsg") == "/data/configs/chatsg.yaml"
    with hints.given(cache_dir="/data/cache", model="Qwen/Qwen2.5-0.5B", via_make=True):
        assert hints.command("pretokenize", "neo4j") == ("`make pretokenize EXPERT=neo4j CACHE_DIR=/data/cache "
                                                         "MODEL=Qwen/Qwen2.5-0.5B`")
        assert hints.command("prepare-model", "neo4j") == "`packtrain prepare-model neo4j --model Qwen/Qwen2.5-0.5B`"
    with hints.given(configs_dir="/data/configs", via_make=True):  # make has no variable for it: the CLI
        assert hints.command("pretokenize", "neo4j") == "`packtrain pretokenize neo4j --configs-dir /data/configs`"
    with hints.given(runs_dir="/data/runs"):  # train writes where train.output_dir says
        assert hints.command("train", "sql") == "`packtrain train sql --set train.output_dir=/data/runs`"
    assert hints.command("pretokenize", "neo4j") == "`packtrain pretokenize neo4j`"  # nothing left behind


def test_train_without_a_build_names_the_build_the_user_needs(tmp_path, monkeypatch, capsys):
    """`train neo4j --cache-dir DIR` answered `run make pretokenize EXPERT=neo4j first` (a build into
    ./cache); it answers with the command that builds into DIR, as the user ran packtrain."""
    cache = tmp_path / "my cache"
    monkeypatch.delenv("PACKTRAIN_VIA_MAKE", raising=False)
    code, _, err = run_cli(monkeypatch, capsys, "train", "neo4j", "--cache-dir", cache, "--dataset", "data/neo4j.jsonl")
    assert code == 2
    assert err == (f"error: no build for expert 'neo4j' in {cache / 'neo4j'} (no CURRENT file); run "
                   f"`packtrain pretokenize neo4j --cache-dir '{cache}' --dataset data/neo4j.jsonl` first\n")
    monkeypatch.setenv("PACKTRAIN_VIA_MAKE", "1")  # what the Makefile's targets set
    code, _, err = run_cli(monkeypatch, capsys, "train", "neo4j", "--cache-dir", cache, "--dataset", "data/neo4j.jsonl")
    assert err == (f"error: no build for expert 'neo4j' in {cache / 'neo4j'} (no CURRENT file); run "
                   f"`make pretokenize EXPERT=neo4j CACHE_DIR='{cache}' DATASET=data/neo4j.jsonl` first\n")


def test_a_config_from_configs_dir_is_named_where_it_is(tmp_path, monkeypatch, capsys):
    """A hint about an expert's config names the file under --configs-dir (it said configs/chatsg.yaml)."""
    configs = tmp_path / "mine"
    configs.mkdir()
    (configs / "chatsg.yaml").write_text(SNIPPET)
    code, _, err = run_cli(monkeypatch, capsys, "pretokenize", "chatsg", "--configs-dir", configs,
                           "--cache-dir", tmp_path / "cache")
    assert code == 2
    assert (f"add one there, or set sources: in {configs / 'chatsg.yaml'} to a dataset or local file") in err, err


def test_a_build_hint_leaves_out_the_training_settings():
    from packtrain.core import hints

    with hints.given(settings=("train.output_dir=/data/runs", "pack.block_size=64", "lora.r=8")):
        assert hints.command("pretokenize", "sql") == "`packtrain pretokenize sql --set pack.block_size=64`"
        assert hints.command("train", "sql") == ("`packtrain train sql --set train.output_dir=/data/runs "
                                                 "--set pack.block_size=64 --set lora.r=8`")
    with hints.given(cache_dir="/data/cache", settings=("train.max_steps=5",), via_make=True):  # make has no --set
        assert hints.command("pretokenize", "sql") == "`make pretokenize EXPERT=sql CACHE_DIR=/data/cache`"


def test_the_makefile_runs_the_cli_so_that_hints_are_make_targets():
    import subprocess

    planned = subprocess.run(["make", "-n", "train", "EXPERT=neo4j", "CACHE_DIR=/data/cache"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.splitlines()
    assert "PACKTRAIN_VIA_MAKE=1 .venv/bin/packtrain pretokenize neo4j --cache-dir /data/cache" in [
        line.strip() for line in planned]
    assert "PACKTRAIN_VIA_MAKE=1 .venv/bin/packtrain train neo4j --cache-dir /data/cache" in [
        line.strip() for line in planned]


def test_the_makefile_test_passes_under_make_test_latest(tmp_path):
    """`make test-latest` runs the suite as `make test VENV=.venv-latest LOCK_DIR=.venv-latest`; make hands those
    variables to everything below it (the environment, MAKEFLAGS): the test above then planned
    .venv-latest/bin/packtrain and failed (2026-12-07). Here it runs under a make given those and PART (the plan
    would say --part 0/2); the tests' own makes read the Makefile alone (tests/conftest.py)."""
    import subprocess
    import sys

    test = f"{__file__}::test_the_makefile_runs_the_cli_so_that_hints_are_make_targets"
    (tmp_path / "Makefile").write_text(f"suite:\n\t{sys.executable} -m pytest -q -p no:cacheprovider {test}\n")
    run = subprocess.run(["make", "-s", "-C", str(tmp_path), "suite", "VENV=.venv-latest", "LOCK_DIR=.venv-latest",
                          "PART=0/2"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:]
