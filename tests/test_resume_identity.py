"""What a checkpoint is, checked before it is resumed (attack 52, 2026-12-06): the base model it was trained
on (trainer/run/resume_checks.py ``check_same_base``; before, `--resume auto --model <another base with the same
tokenizer>` continued the adapter on the other base's weights without a word) and the step its directory is
named for."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from packtrain.trainer.run.checkpoint import CheckpointError
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build


def tree(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def unfinished_run(tmp_path: Path, model_dir: Path) -> Path:
    """runs/sql/open: a run stopped after its step-2 checkpoint (a finished run's files, its end left out)."""
    finished = run(make_config(model_dir, tmp_path / "runs", max_steps=2, save_steps=1, run_name="done"),
                   tmp_path / "cache")
    unfinished = finished.with_name("open")
    unfinished.mkdir()
    for name in ("checkpoint-1", "checkpoint-2", "config.json", "run.json", "metrics.jsonl", "train.log"):
        (shutil.copytree if (finished / name).is_dir() else shutil.copy2)(finished / name, unfinished / name)
    shutil.rmtree(finished)
    return unfinished


def test_a_checkpoint_resumed_on_another_base_model_is_refused(tmp_path):
    base = tiny_model_dir(tmp_path / "base-a" / "model", seed=0)
    other = tiny_model_dir(tmp_path / "base-b" / "other", seed=1)  # the same tokenizer and shapes, other weights
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), random_blocks(2, 32, 1), 32, base)
    unfinished = unfinished_run(tmp_path, base)
    before = tree(tmp_path / "runs")

    with pytest.raises(CheckpointError) as refused:
        run(make_config(other, tmp_path / "runs", max_steps=4), tmp_path / "cache", resume="auto")
    assert str(refused.value) == (
        f"checkpoint {unfinished / 'checkpoint-2'} was trained on base model model, this run's is other (model.name "
        f"{other}): its adapter continues only on the base it was trained on; resume with the checkpoint's "
        f"(--set model.name=\"{base}\"), or start a new run, from its adapter with train.init_adapter")
    assert tree(tmp_path / "runs") == before  # nothing written, nothing discarded

    moved = tmp_path / "moved" / "model"  # the same base at another path: its name means it, it resumes
    shutil.copytree(base, moved)
    assert run(make_config(moved, tmp_path / "runs", max_steps=4), tmp_path / "cache", resume="auto") == unfinished


def test_a_checkpoint_named_for_another_step_is_refused_and_nothing_is_removed(tmp_path):
    model_dir = tiny_model_dir(tmp_path / "model")
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    unfinished = unfinished_run(tmp_path, model_dir)
    (unfinished / "checkpoint-1").rename(unfinished / "checkpoint-9")  # step 1's files under a later step's name
    before = tree(tmp_path / "runs")

    for resume in ("auto", str(unfinished / "checkpoint-9")):
        with pytest.raises(CheckpointError) as refused:
            run(make_config(model_dir, tmp_path / "runs", max_steps=4), tmp_path / "cache", resume=resume)
        assert str(refused.value) == (
            f"checkpoint {unfinished / 'checkpoint-9'} holds step 1 (its state.json), not the step its name says: it "
            "was renamed or copied under another name; rename it to checkpoint-1, or remove it, and resume again")
    assert tree(tmp_path / "runs") == before  # before: resumed at step 1 as the newest, checkpoint-2 removed

    (unfinished / "checkpoint-9").rename(unfinished / "checkpoint-1")
    assert run(make_config(model_dir, tmp_path / "runs", max_steps=4), tmp_path / "cache", resume="auto") == unfinished
    assert sorted(p.name for p in unfinished.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2", "checkpoint-4"]


def test_an_incomplete_checkpoint_passed_over_is_said(tmp_path, caplog):
    model_dir = tiny_model_dir(tmp_path / "model")
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    unfinished = unfinished_run(tmp_path, model_dir)
    (unfinished / "checkpoint-2" / "trainer_state.pt").unlink()  # lost: the newest is no whole checkpoint
    with caplog.at_level(logging.WARNING, logger="packtrain.train"):
        run(make_config(model_dir, tmp_path / "runs", max_steps=4), tmp_path / "cache", resume="auto")
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resume:")]
    assert said == [f"resume: {unfinished / 'checkpoint-2'} is incomplete (no trainer_state.pt): resuming from "
                    "checkpoint-1 before it; it is replaced when step 2 is saved again"]


def test_a_resume_with_another_global_batch_says_so(tmp_path, caplog):
    """Allowed (the sampler takes a data position of another batch: trainer/data/epochs.py), but no longer
    silent: before, the run's record named the new batch only, as if every step had taken it."""
    model_dir = tiny_model_dir(tmp_path / "model")
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    unfinished = unfinished_run(tmp_path, model_dir)
    assert json.loads((unfinished / "checkpoint-2" / "state.json").read_text())["global_batch"] == 2
    with caplog.at_level(logging.WARNING, logger="packtrain.train"):
        run(make_config(model_dir, tmp_path / "runs", max_steps=4, gradient_accumulation_steps=2), tmp_path / "cache",
            resume="auto")
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resuming checkpoint-2")]
    assert said == ["resuming checkpoint-2, trained with 2 sequences an optimizer step, with 4 "
                    "(per_device_train_batch_size 2 x gradient_accumulation_steps 2 x world size 1): the steps from 3 "
                    "on take the new batch, so the run's losses are no longer those of an uninterrupted run"]
    assert json.loads((unfinished / "checkpoint-4" / "state.json").read_text())["global_batch"] == 4


@pytest.mark.parametrize("digits", ["1" * 5000, "-" + "9" * 4301])
def test_a_state_json_python_refuses_to_read_is_said_corrupt(tmp_path, digits):
    """A state.json holding an integer of more than 4,300 digits: json.loads raises a ValueError that is no
    JSONDecodeError, which read_state let out as a traceback (review 54; rundir.read_record already took it)."""
    from packtrain.trainer.run.checkpoint import read_state

    (tmp_path / "checkpoint-3").mkdir()
    (tmp_path / "checkpoint-3" / "state.json").write_text(f'{{"step": {digits}}}')
    with pytest.raises(CheckpointError, match=r"^checkpoint file \S+state\.json is corrupt \(Exceeds the limit "):
        read_state(tmp_path / "checkpoint-3")
