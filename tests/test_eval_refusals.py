"""`packtrain eval` on runs it must refuse, each with a one-line message naming the run and the fix,
and an evaluation that is never overwritten (eval.json is kept; an interrupted eval.jsonl is redone)."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from packtrain.cli.commands import main
from packtrain.trainer.eval.task_eval import TaskEvalError, _write_new
from packtrain.trainer.run.train import run
from test_task_eval import memorization_build
from trainer_fixtures import make_config, tiny_model_dir


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-step sql run (cache and runs under one module directory)."""
    root = tmp_path_factory.mktemp("eval")
    model_dir = tiny_model_dir(root / "model")
    memorization_build(root / "cache", model_dir, expert="sql")
    config = make_config(model_dir, root / "runs", max_steps=2, max_new_tokens=4, plots=False, sample_prompts=0)
    return run(config, root / "cache")


def copy_run(finished, tmp_path):
    return shutil.copytree(finished, tmp_path / "run")


def refused(*args) -> str:
    result = CliRunner().invoke(main, ["eval", *args])
    assert result.exit_code != 0 and result.exception is not None
    message = str(result.exception)
    assert "\n" not in message
    return message


def test_run_that_is_a_file_or_missing(tmp_path):
    (tmp_path / "afile").write_text("x")
    assert refused("sql", "--run", str(tmp_path / "afile")) == (
        f"--run {tmp_path / 'afile'} is a file, not a run directory: name a run directory (runs/sql/<run>) with --run")
    assert refused("sql", "--run", str(tmp_path / "nope")) == (
        f"--run {tmp_path / 'nope'} does not exist: name a run directory (runs/sql/<run>) with --run")


def test_unfinished_run_and_run_without_adapter(finished, tmp_path):
    run_dir = copy_run(finished, tmp_path)
    shutil.rmtree(run_dir / "adapter")
    assert refused("sql", "--run", str(run_dir)) == (
        f"--run {run_dir} has no adapter/ (moved or deleted): put it back, or name another run with --run")
    (run_dir / "summary.json").unlink()
    assert refused("sql", "--run", str(run_dir)) == (
        f"--run {run_dir} is not a finished run (no summary.json): finish it with "
        f"`packtrain train sql --resume {run_dir}`, or name another run with --run")


def test_run_of_another_expert_is_refused(finished):
    assert refused("json", "--run", str(finished)) == (
        f"--run {finished} is a run of expert 'sql', not 'json': run `packtrain eval sql --run {finished}`, or "
        "name a run of json with --run")


def test_run_whose_build_was_deleted(finished, tmp_path):
    run_dir = copy_run(finished, tmp_path)
    info = json.loads((run_dir / "run.json").read_text())
    info["build_dir"] = str(tmp_path / "gone" / "sql" / "abc")
    (run_dir / "run.json").write_text(json.dumps(info))
    assert "the build this run trained on is gone" in refused("sql", "--run", str(run_dir))
    assert "rebuild it with `packtrain pretokenize sql`" in refused("sql", "--run", str(run_dir))
    (run_dir / "run.json").write_text("{}")
    assert refused("sql", "--run", str(run_dir)) == (
        f"{run_dir / 'run.json'} names no build_dir (damaged): name another run with --run")


@pytest.mark.parametrize("damage, fragment", [
    (lambda a: (a / "adapter_config.json").write_text("x"), "cannot be loaded as this run's adapter (JSONDecodeError"),
    (lambda a: (a / "adapter_model.safetensors").write_bytes(b"\x01" * 100),
     "cannot be loaded as this run's adapter (SafetensorError"),
    (lambda a: (a / "adapter_model.safetensors").unlink(), "has no adapter_model.safetensors (moved or deleted)"),
])
def test_damaged_adapter(finished, tmp_path, damage, fragment):
    run_dir = copy_run(finished, tmp_path)
    damage(run_dir / "adapter")
    message = refused("sql", "--run", str(run_dir))
    assert message.startswith(str(run_dir / "adapter")) and fragment in message
    assert not (run_dir / "eval.json").exists()


def test_an_evaluation_is_kept_and_an_interrupted_one_redone(finished, tmp_path):
    run_dir = copy_run(finished, tmp_path)
    (run_dir / "eval.jsonl").write_text('{"torn": ')  # an eval killed between its two files
    result = CliRunner().invoke(main, ["eval", "sql", "--run", str(run_dir), "--max-examples", "2"])
    assert result.exit_code == 0, result.output
    rows = (run_dir / "eval.jsonl").read_text().splitlines()
    assert len(rows) == 2 and json.loads(rows[0])["prompt"]
    before = (run_dir / "eval.json").read_bytes(), (run_dir / "eval.jsonl").read_bytes()
    assert refused("sql", "--run", str(run_dir), "--max-examples", "1") == (
        f"{run_dir / 'eval.json'} exists: this run was evaluated already; move it away to evaluate again")
    assert ((run_dir / "eval.json").read_bytes(), (run_dir / "eval.jsonl").read_bytes()) == before


def test_a_second_writer_never_replaces_eval_json(tmp_path):
    (tmp_path / "eval.json").write_text("first\n")
    with pytest.raises(TaskEvalError, match="this run was evaluated already"):
        _write_new(tmp_path / "eval.json", "second\n", replace=False)
    assert (tmp_path / "eval.json").read_text() == "first\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.json"]  # no temporary file left
