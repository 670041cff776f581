"""A build removed under a training run that reads it with DataLoader workers (attack 52, 2026-12-06): the run
stops in one line naming the missing shard, and no worker process is left (before: torch's multi-line
"Caught ContractError in DataLoader worker process 0. Original Traceback ...", then the process hung for ever
at exit, joining workers that ignore SIGTERM; trainer/data/data.py ``Loader``, ``stop_workers``)."""

from __future__ import annotations

import multiprocessing
import shutil

import pytest

import packtrain.trainer.loop
from packtrain.core.contract import expert_dir
from packtrain.core.errors import ContractError
from packtrain.core.rundir import complete_checkpoints
from packtrain.trainer.data.data import raised_message
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build


def test_a_build_removed_while_workers_read_it_is_one_line_and_leaves_no_worker(tmp_path, monkeypatch):
    model_dir = tiny_model_dir(tmp_path / "model")
    build_id = write_build(tmp_path / "cache", "sql", random_blocks(9, 32, 0), random_blocks(2, 32, 1), 32, model_dir,
                           rows_per_shard=2)  # 5 train shards, each opened when first read
    build_dir = expert_dir(tmp_path / "cache", "sql") / build_id
    forward, calls = packtrain.trainer.loop.forward_loss, []

    def remove_the_build_in_step_2(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # epoch 0's workers have read it; epoch 1's (new processes) open its shards again
            shutil.rmtree(build_dir)
        return forward(*args, **kwargs)

    monkeypatch.setattr(packtrain.trainer.loop, "forward_loss", remove_the_build_in_step_2)
    config = make_config(model_dir, tmp_path / "runs", run_name="r", max_steps=8, save_steps=2,
                         dataloader_num_workers=1)
    with pytest.raises(ContractError) as raised:
        run(config, tmp_path / "cache")
    assert str(raised.value) == (
        f"shard {build_dir / 'train-00004.arrow'} is missing: its build was removed or changed after it was checked "
        "(keep a build while a run trains on it); rebuild it (the same inputs give the same build id), then "
        "continue a stopped run with --resume auto")
    assert multiprocessing.active_children() == []  # the failed epoch's workers ended, not left to the exit
    assert [p.name for p in complete_checkpoints(tmp_path / "runs" / "sql" / "r")] == ["checkpoint-2", "checkpoint-4"]


def test_the_message_a_worker_raised_is_read_back_from_its_traceback():
    text = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
            "packtrain.core.errors.ContractError: shard a.arrow is missing\n")
    assert raised_message(text, ContractError) == "shard a.arrow is missing"
    assert raised_message("Traceback ...\nFileNotFoundError: [Errno 2] gone\n", FileNotFoundError) == "[Errno 2] gone"
    assert raised_message("Traceback ...\nValueError: other\n", ContractError) is None
