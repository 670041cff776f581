"""Issue 12, classes 4 and 6.

Class 4, runs never overwrite finished work: a finished run (summary.json, adapter/ or merged/) is
never resumed into nor written to; ``--resume auto`` takes only unfinished runs' checkpoints, an
explicit ``--resume`` of a finished run continues in a new run directory; checksums.json covers
state.json; a full disk during a save removes the partial files and says so in one line.

Class 6, every bad input is a one-line error naming the file and the fix: run through the real CLI,
each case must exit 2 with one line on stderr naming the file, and no traceback."""

from __future__ import annotations

import errno
import json
import re
import shutil
from pathlib import Path

import pytest

import packtrain.trainer.run.checkpoint
import packtrain.trainer.loop
import packtrain.trainer.run.run_end
from packtrain.core.diskfull import DiskFullError
from packtrain.trainer.run.checkpoint import CheckpointError, check_not_finished, find_checkpoint, save_checkpoint
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build

ROOT = Path(__file__).resolve().parents[1]


class Crash(Exception):
    pass


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of a run, by relative path (train.log aside: only appended to by a reader's message)."""
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def steps_of(run_dir: Path) -> list[int]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in lines if "loss" in r]


def crash_before_first_checkpoint(monkeypatch):
    def crash(*args, **kwargs):
        raise Crash("interrupted before the first checkpoint")

    monkeypatch.setattr(packtrain.trainer.loop, "save_checkpoint", crash)


# ----------------------------------------------------------------------------------------------
# Class 4: runs never overwrite finished work


def test_resume_auto_after_a_new_run_died_early_never_touches_the_finished_run(tmp_path, model_dir, monkeypatch):
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    old = run(make_config(model_dir, tmp_path / "runs", max_steps=2, save_steps=1, run_name="old"), tmp_path / "cache")
    before = snapshot(old)
    assert {"summary.json", "adapter/adapter_model.safetensors", "config.json", "checkpoint-2/state.json"} <= set(before)

    new = make_config(model_dir, tmp_path / "runs", max_steps=3, save_steps=1, learning_rate=5e-3)
    crash_before_first_checkpoint(monkeypatch)
    with pytest.raises(Crash):
        run(new, tmp_path / "cache")
    monkeypatch.undo()
    assert find_checkpoint("auto", tmp_path / "runs" / "sql") is None  # old is finished, the new one has none

    resumed = run(new, tmp_path / "cache", resume="auto")
    assert resumed.parent == old.parent and resumed.name not in ("old", "old-from-2")
    assert json.loads((resumed / "config.json").read_text())["train"]["learning_rate"] == 5e-3
    assert steps_of(resumed) == [1, 2, 3]
    after = snapshot(old)
    after.pop("train.log"), before.pop("train.log")
    assert after == before  # adapter, config, summary, metrics and checkpoints: byte for byte


def test_resume_auto_on_a_finished_run_keeps_its_summary(tmp_path, model_dir):
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=2, save_steps=1)
    done = run(config, tmp_path / "cache")
    summary = (done / "summary.json").read_bytes()
    assert json.loads(summary)["steps"] == 2 and json.loads(summary)["final_loss"] is not None

    again = run(config, tmp_path / "cache", resume="auto")
    assert again != done
    assert (done / "summary.json").read_bytes() == summary
    assert steps_of(done) == [1, 2]


def test_an_explicit_resume_of_a_finished_run_continues_in_a_new_run(tmp_path, model_dir):
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    done = run(make_config(model_dir, tmp_path / "runs", max_steps=2, save_steps=1, run_name="r"), tmp_path / "cache")
    before = snapshot(done)
    longer = make_config(model_dir, tmp_path / "runs", max_steps=4, save_steps=1, run_name="r")
    forked = run(longer, tmp_path / "cache", resume=str(done / "checkpoint-1"))
    assert forked == tmp_path / "runs" / "sql" / "r-from-1"
    assert steps_of(forked) == [1, 2, 3, 4]  # its history up to step 1 comes with it
    assert json.loads((forked / "summary.json").read_text())["steps"] == 4
    after = snapshot(done)
    log = after.pop("train.log").decode()
    before.pop("train.log")
    assert after == before  # checkpoint-2 was not discarded either: it belongs to the finished run
    assert "r-from-1" not in log
    second = run(longer, tmp_path / "cache", resume=str(done / "checkpoint-1"))
    assert second == tmp_path / "runs" / "sql" / "r-from-1-2"  # never into the first fork either


@pytest.mark.parametrize("artifact", ["summary.json", "adapter", "merged"])
def test_any_final_artifact_makes_a_run_finished(tmp_path, artifact):
    run_dir = tmp_path / "runs" / "sql" / "r"
    (run_dir / "checkpoint-1" / "adapter").mkdir(parents=True)
    for name in ("state.json", "trainer_state.pt"):
        (run_dir / "checkpoint-1" / name).write_text("{}")
    assert find_checkpoint("auto", tmp_path / "runs" / "sql") == run_dir / "checkpoint-1"
    (run_dir / artifact).mkdir() if artifact != "summary.json" else (run_dir / artifact).write_text("{}")
    assert find_checkpoint("auto", tmp_path / "runs" / "sql") is None
    with pytest.raises(CheckpointError) as err:
        check_not_finished(run_dir, "save checkpoint-2")
    assert str(err.value) == (f"run {run_dir} is finished ({artifact} written): refusing to save checkpoint-2 "
                              f"there; continue it into a new run with --resume {run_dir}, or start a new run")
    with pytest.raises(CheckpointError, match="is finished"):  # the save itself checks, before writing anything
        save_checkpoint(packtrain.trainer.run.checkpoint.RunInfo(run_dir, {}, tmp_path), packtrain.trainer.run.checkpoint.TrainState(step=2),
                        None, None, None, None)
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(["checkpoint-1", artifact])


def unfinished_run(tmp_path, model_dir, monkeypatch) -> Path:
    """A run killed after checkpoint-2 (of 4): what --resume auto continues."""
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    save = packtrain.trainer.loop.save_checkpoint

    def save_then_crash(run_info, state, *args):
        path = save(run_info, state, *args)
        if state.step == 2:
            raise Crash("killed")
        return path

    monkeypatch.setattr(packtrain.trainer.loop, "save_checkpoint", save_then_crash)
    with pytest.raises(Crash):
        run(make_config(model_dir, tmp_path / "runs", max_steps=4, save_steps=1, run_name="r"), tmp_path / "cache")
    monkeypatch.undo()
    return tmp_path / "runs" / "sql" / "r"


def test_state_json_is_covered_by_the_checksums(tmp_path, model_dir, monkeypatch):
    run_dir = unfinished_run(tmp_path, model_dir, monkeypatch)
    checkpoint = run_dir / "checkpoint-2"
    sums = json.loads((checkpoint / "checksums.json").read_text())
    assert "state.json" in sums and sorted(sums) == sorted(
        p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file() and p.name != "checksums.json")
    state = checkpoint / "state.json"
    good = state.read_text()
    assert '"position": 4' in good
    state.write_text(good.replace('"position": 4', '"position": 5'))  # one character: still valid JSON
    config = make_config(model_dir, tmp_path / "runs", max_steps=4, save_steps=1, run_name="r")
    with pytest.raises(CheckpointError) as err:
        run(config, tmp_path / "cache", resume="auto")
    assert f"{state} (sha256 differs)" in str(err.value) and "--resume PATH" in str(err.value)

    state.write_text(good)  # a checksums.json that leaves state.json out is refused as well
    del sums["state.json"]
    (checkpoint / "checksums.json").write_text(json.dumps(sums))
    with pytest.raises(CheckpointError, match="does not cover state.json"):
        run(config, tmp_path / "cache", resume="auto")


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"),
                                     RuntimeError("[enforce fail at inline_container.cc:783] . PytorchStreamWriter "
                                                  "failed writing file data/0: file write failed")])
def test_disk_full_during_a_checkpoint_save(tmp_path, model_dir, monkeypatch, failure):
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    real_save = packtrain.trainer.run.checkpoint.torch.save
    calls = []

    def full_disk(obj, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 2:  # the second checkpoint's trainer_state.pt
            raise failure
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(packtrain.trainer.run.checkpoint.torch, "save", full_disk)
    config = make_config(model_dir, tmp_path / "runs", max_steps=4, save_steps=1, run_name="r")
    with pytest.raises(DiskFullError) as err:
        run(config, tmp_path / "cache")
    monkeypatch.undo()
    run_dir = tmp_path / "runs" / "sql" / "r"
    free = re.search(r" \(\S+ \S+ free\) ", str(err.value)).group(0)  # the line says the device's free space
    assert str(err.value) == (f"no space left on the device of {run_dir / 'checkpoint-2'}{free}while writing "
                              f"checkpoint-2 of run {run_dir}: the partial files were removed; free space (or set "
                              "train.output_dir elsewhere) and continue with --resume auto")
    assert sorted(p.name for p in run_dir.iterdir() if p.is_dir()) == ["checkpoint-1"]  # no .tmp-checkpoint-2-*
    assert run(config, tmp_path / "cache", resume="auto") == run_dir  # unfinished: auto continues it
    assert steps_of(run_dir) == [1, 2, 3, 4]


def test_disk_full_while_writing_the_final_adapter(tmp_path, model_dir, monkeypatch):
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    real = packtrain.trainer.run.run_end.save_adapter

    def full_disk(model, directory, *args, **kwargs):
        real(model, directory, *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device", str(directory / "adapter_model.safetensors"))

    monkeypatch.setattr(packtrain.trainer.run.run_end, "save_adapter", full_disk)
    config = make_config(model_dir, tmp_path / "runs", max_steps=2, save_steps=1, run_name="r")
    with pytest.raises(DiskFullError, match="^no space left on the device of .* while writing the final adapter"):
        run(config, tmp_path / "cache")
    monkeypatch.undo()
    run_dir = tmp_path / "runs" / "sql" / "r"
    assert not (run_dir / "adapter").exists() and not (run_dir / "summary.json").exists()
    assert not [p.name for p in run_dir.iterdir() if p.name.startswith(".tmp-")]
    assert run(config, tmp_path / "cache", resume="auto") == run_dir  # still unfinished: finishes in place
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file() and (run_dir / "summary.json").is_file()


# ----------------------------------------------------------------------------------------------
# Class 6: every bad input is a one-line error naming the file and the fix (the real CLI)


def run_cli(*args):
    """The real entry point, in this process (tests/inprocess_cli.py: a subprocess adds only the
    imports, ~10 CPU s where the command imports torch)."""
    from inprocess_cli import cli

    return cli(*args)


def assert_one_line_error(result, *expected: str) -> str:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert result.stderr.rstrip("\n").split("\n")[-1] == errors[0], "the error is the last line"
    for text in expected:
        assert text in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize("value", ["pack.block_size=[1024", "train.learning_rate={a: b", "format.prompt='x",
                                   "train.max_steps=a: b: c"])
def test_malformed_yaml_in_set(value, tmp_path):
    result = run_cli("config", "sql", "--set", value)
    assert_one_line_error(result, f"--set {value}: the value is not valid YAML", "quote it")


CONFIG_CASES = {
    "unclosed-list": ("sources: [\n  bad\n", "cannot be read as YAML"),
    "tab-indent": ("format:\n\tprompt: x\n", "cannot be read as YAML"),
    "not-utf8": (b"format:\n  prompt: \xff\xfe\n", "cannot be read as YAML (UnicodeDecodeError"),
    "no-fields": ('sources: [{name: bundled}]\nformat:\n  prompt: "Question"\n  answer: "Answer"\n',
                  "format.prompt/answer: no field at all"),
    "positional-field": ('sources: [{name: bundled}]\nformat:\n  prompt: "{}"\n  answer: "{answer}"\n',
                         "field {} is not a column name"),
    "top-level-list": ("- a\n- b\n", "the top level must be a mapping"),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_a_bad_config_file(case, tmp_path):
    text, expected = CONFIG_CASES[case]
    configs = tmp_path / "configs"
    configs.mkdir()
    path = configs / "x.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    result = run_cli("pretokenize", "x", "--configs-dir", configs, "--cache-dir", tmp_path / "cache")
    assert_one_line_error(result, str(path), expected)
    assert not (tmp_path / "cache").exists()


SAVED_DATASET_CASES = {
    "dict-garbage": ("saved_dd", "dataset_dict.json", b"{\"splits\": [\"tr", "cannot be read as a saved DatasetDict"),
    "dict-empty": ("saved_dd", "dataset_dict.json", b"", "cannot be read as a saved DatasetDict"),
    "dict-not-utf8": ("saved_dd", "dataset_dict.json", b"\xff\xfe{}", "UnicodeDecodeError"),
    "dict-a-list": ("saved_dd", "dataset_dict.json", b"[\"train\"]", "the top level is list, expected dict"),
    "dict-splits-a-number": ("saved_dd", "dataset_dict.json", b"{\"splits\": 3}", "'splits' is 3"),
    "state-garbage": ("saved_ds", "state.json", b"{\"_data_files\": [", "cannot be read as a saved dataset's state.json"),
    "state-a-string": ("saved_ds", "state.json", b"\"x\"", "the top level is str, expected dict"),
    "state-files-wrong-shape": ("saved_ds", "state.json", b"{\"_data_files\": [\"data.arrow\"]}",
                                "'_data_files' is ['data.arrow']"),
    "state-file-escapes": ("saved_ds", "state.json", b"{\"_data_files\": [{\"filename\": \"../../etc/passwd\"}]}",
                           "not a list of {\"filename\": ...} in this directory"),
    "dd-split-state-garbage": ("saved_dd", "train/state.json", b"nonsense", "cannot be read as a saved dataset's"),
}


@pytest.mark.parametrize("case", list(SAVED_DATASET_CASES))
def test_a_corrupt_saved_dataset(case, saved_datasets, hf_home, tmp_path):
    which, name, content, expected = SAVED_DATASET_CASES[case]
    root = getattr(saved_datasets, "dataset_dict" if which == "saved_dd" else "dataset")
    path = root / name
    path.write_bytes(content)
    result = run_cli("pretokenize", "sql", "--dataset", root, "--cache-dir", tmp_path / "cache", "--num-proc", 1)
    assert_one_line_error(result, str(path), expected, "save the dataset again with `save_to_disk`")


def demo_model_copy(tmp_path) -> Path:
    model = tmp_path / "model"
    shutil.copytree(ROOT / "packtrain" / "core" / "assets" / "demo-model", model)
    return model


TOKENIZER_CASES = {
    "tokenizer-truncated": ("tokenizer.json", lambda b: b[: len(b) // 2], "cannot be read as a tokenizers file"),
    "tokenizer-empty": ("tokenizer.json", lambda b: b"", "cannot be read as a tokenizers file"),
    "tokenizer-not-a-tokenizer": ("tokenizer.json", lambda b: b"{\"a\": 1}", "cannot be read as a tokenizers file"),
    "config-invalid-json": ("tokenizer_config.json", lambda b: b[:-5], "cannot be read as a tokenizer config"),
    "config-a-list": ("tokenizer_config.json", lambda b: b"[1, 2]", "the top level is list, expected dict"),
    "config-eos-a-number": ("tokenizer_config.json", lambda b: b"{\"eos_token\": 5}", "eos_token is 5"),
    "config-template-a-number": ("tokenizer_config.json",
                                 lambda b: b"{\"eos_token\": \"<|endoftext|>\", \"chat_template\": 3}",
                                 "chat_template is int"),
}


@pytest.mark.parametrize("case", list(TOKENIZER_CASES))
def test_a_damaged_tokenizer(case, hf_home, tmp_path):
    name, damage, expected = TOKENIZER_CASES[case]
    model = demo_model_copy(tmp_path)
    path = model / name
    path.write_bytes(damage(path.read_bytes()))
    result = run_cli("pretokenize", "sql", "--model", model, "--cache-dir", tmp_path / "cache", "--num-proc", 1)
    assert_one_line_error(result, str(path), expected, "copy it again")
    assert not any((tmp_path / "cache").rglob("manifest.json"))


MODEL_CASES = {
    "weights-truncated": ("model.safetensors", lambda b: b[: len(b) // 2], "the tensors need"),
    "weights-short-by-one": ("model.safetensors", lambda b: b[:-1], "the tensors need"),
    "weights-header-cut": ("model.safetensors", lambda b: b[:20], "the header claims"),
    "weights-empty": ("model.safetensors", lambda b: b"", "shorter than a safetensors header"),
    "config-invalid-json": ("config.json", lambda b: b[: len(b) // 2], "cannot be read as a transformers config.json"),
}


@pytest.mark.parametrize("case", list(MODEL_CASES))
def test_a_damaged_model(case, tmp_path):
    model = tiny_model_dir(tmp_path / "model")
    cache = tmp_path / "cache"
    write_build(cache, "sql", random_blocks(6, 32, 0), [], 32, model)
    name, damage, expected = MODEL_CASES[case]
    path = model / name
    path.write_bytes(damage(path.read_bytes()))
    result = run_cli("train", "sql", "--model", model, "--cache-dir", cache, "--max-steps", 1,
                       "--set", f"train.output_dir={tmp_path / 'runs'}", "--set", "train.dataloader_num_workers=0")
    assert_one_line_error(result, str(path), expected, "copy it again")
    assert not (tmp_path / "runs").exists()  # refused before a run directory exists


def test_the_intact_inputs_work(saved_datasets, hf_home, tmp_path):
    """The control for the cases above: the same inputs, undamaged, build."""
    model = demo_model_copy(tmp_path)
    for dataset in (saved_datasets.dataset, saved_datasets.dataset_dict):
        result = run_cli("pretokenize", "sql", "--dataset", dataset, "--model", model, "--cache-dir",
                           tmp_path / "cache", "--num-proc", 1, "--set", "pack.val_fraction=0")
        assert result.returncode == 0, result.stderr[-3000:]


def test_resume_auto_of_a_finished_curriculum_keeps_every_stage(hf_home, tmp_path):
    """A curriculum resumed with --resume auto skips the stages that finished (their runs stay as they
    were) and goes on from their adapters, instead of resuming into them or training them again."""
    from inprocess_cli import cli
    from test_stages import curriculum

    common = curriculum(tmp_path, """
stages:
  - name: basics
    sources: [{name: bundled, max_rows: 200}]
  - name: all
    sources: [{name: bundled, max_rows: 300}]
""")
    assert cli("pretokenize", "sql", *common).returncode == 0
    first = cli("train", "sql", *common, "--max-steps", 1)
    assert first.returncode == 0, first.stderr[-2000:]
    runs = [Path(json.loads(line)["run_dir"]) for line in first.stdout.splitlines() if line.startswith("{")]
    before = [snapshot(r) for r in runs]
    again = cli("train", "sql", *common, "--max-steps", 1, "--resume", "auto")
    assert again.returncode == 0, again.stderr[-2000:]
    assert [Path(json.loads(line)["run_dir"]) for line in again.stdout.splitlines() if line.startswith("{")] == runs
    assert f"resume auto: stage sql.basics finished in {runs[0]}; going on from its adapter" in again.stderr
    assert [snapshot(r) for r in runs] == before
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["sql.all", "sql.basics"]
    assert [len(list((tmp_path / "runs" / s).iterdir())) for s in ("sql.basics", "sql.all")] == [1, 1]
