"""The train command's own inputs refused in one line naming what to change (attack 52, 2026-12-06): a
train.output_dir where no run directory can be made (before: `error: [Errno 20] Not a directory: ...`, naming
no setting, after the model had loaded), `--max-steps 0` (before: a two-line `invalid config:` list from the
trainer, after torch was imported)."""

from __future__ import annotations

import pytest

from inprocess_cli import QUICK_END, cli
from packtrain.trainer.run.run_checks import TrainError
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build


def test_an_output_dir_where_no_run_directory_can_be_made_is_one_line(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "model")
    write_build(tmp_path / "cache", "sql", random_blocks(4, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    (tmp_path / "taken").write_text("a file, not a directory")
    with pytest.raises(TrainError) as refused:
        run(make_config(model_dir, tmp_path / "taken", run_name="r"), tmp_path / "cache")
    assert str(refused.value) == (
        f"cannot create the run directory {tmp_path / 'taken' / 'sql' / 'r'} (Not a directory: "
        f"{tmp_path / 'taken' / 'sql' / 'r'}): set train.output_dir (now {tmp_path / 'taken'}) to a directory this "
        "user can write")
    assert (tmp_path / "taken").read_text() == "a file, not a directory"


@pytest.mark.parametrize("steps", ["0", "-3"])
def test_max_steps_below_one_is_refused_as_the_command_line_is_read(steps):
    result = cli("train", "sql", "--max-steps", steps, *QUICK_END)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()  # (the program's name in the hint is the test runner's here)
    assert line.startswith(f"error: Invalid value for '--max-steps': {steps} is not in the range x>=1. (see `")


def test_a_config_made_in_code_with_one_problem_is_one_line(tmp_path):
    config = make_config(tmp_path / "model", tmp_path / "runs")
    config.train.max_steps = 0
    with pytest.raises(Exception) as refused:
        run(config, tmp_path / "cache")
    assert str(refused.value) == ("invalid config: train.max_steps: must be in [1, 1000000000000] (or unset: "
                                  "num_train_epochs decides), got 0")
