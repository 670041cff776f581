"""Checkpoints and resume: an interrupted run continues bit for bit; foreign or corrupt ones are refused."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

import packtrain.trainer.loop
from packtrain.trainer import threads
from packtrain.trainer.run.checkpoint import CheckpointError, complete_checkpoints, find_checkpoint, save_checkpoint
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build


class Crash(Exception):
    pass


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def step_losses(run_dir):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in lines if "loss" in r], [(r["step"], r["eval/loss"]) for r in lines
                                                                    if "eval/loss" in r]


def crash_after_checkpoint(monkeypatch, step: int):
    save = packtrain.trainer.loop.save_checkpoint

    def save_then_crash(run, state, *args):
        path = save(run, state, *args)
        if state.step == step:
            raise Crash(f"simulated crash after {path.name}")
        return path

    monkeypatch.setattr(packtrain.trainer.loop, "save_checkpoint", save_then_crash)


def test_stop_and_resume_is_identical_to_an_uninterrupted_run(tmp_path, model_dir, monkeypatch):
    write_build(tmp_path / "cache", "sql", random_blocks(10, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    settings = dict(max_steps=20, per_device_train_batch_size=3, gradient_accumulation_steps=2, save_steps=5,
                    eval_steps=5, warmup_ratio=0.1, lr_scheduler_type="cosine")
    lora = {"dropout": 0.1}  # dropout draws from the torch RNG: its state must be restored too
    full = run(make_config(model_dir, tmp_path / "runs", lora=lora, run_name="full", **settings), tmp_path / "cache")

    crash_after_checkpoint(monkeypatch, 10)
    config = make_config(model_dir, tmp_path / "runs", lora=lora, run_name="part", **settings)
    with pytest.raises(Crash):
        run(config, tmp_path / "cache")
    monkeypatch.undo()
    part = tmp_path / "runs" / "sql" / "part"
    assert [p.name for p in complete_checkpoints(part)] == ["checkpoint-5", "checkpoint-10"]
    assert find_checkpoint("auto", tmp_path / "runs" / "sql") == part / "checkpoint-10"

    resumed = run(config, tmp_path / "cache", resume="auto")
    assert resumed == part
    assert step_losses(resumed) == step_losses(full)  # every step's loss and eval loss, exactly
    assert [s for s, _ in step_losses(resumed)[0]] == list(range(1, 21))
    a, b = load_file(full / "adapter" / "adapter_model.safetensors"), load_file(part / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    state = json.loads((part / "checkpoint-20" / "state.json").read_text())
    # 4 micro-batches of 3 an epoch (the last: 1 block and 2 of padding), 2 steps of 2: 10 epochs, none begun
    assert (state["step"], state["epoch"], state["position"]) == (20, 10, 0)
    assert json.loads((part / "run.json").read_text())["resumed_from"] == str(part / "checkpoint-10")


def test_a_resumed_run_keeps_the_torch_threads_it_trained_with(tmp_path, model_dir, monkeypatch):
    """train.cpu_threads auto chooses by the load average, which moves between a crash and its resume:
    the resume takes the count state.json recorded (another count can add CPU reductions in another order)."""
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", run_name="r", max_steps=4, save_steps=2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "torch_default_threads", lambda: 2)
    monkeypatch.setattr(threads, "affinity_cpus", lambda: 2)
    monkeypatch.setattr(threads, "load_average", lambda: 0.0)  # quiet: both CPUs
    crash_after_checkpoint(monkeypatch, 2)
    with pytest.raises(Crash):
        run(config, tmp_path / "cache")
    checkpoint = tmp_path / "runs" / "sql" / "r" / "checkpoint-2"
    assert json.loads((checkpoint / "state.json").read_text())["cpu_threads"] == 2
    monkeypatch.setattr(packtrain.trainer.loop, "save_checkpoint", save_checkpoint)
    monkeypatch.setattr(threads, "load_average", lambda: 9.0)  # loaded now: a new run would take 1
    run(config, tmp_path / "cache", resume="auto")
    assert json.loads((tmp_path / "runs" / "sql" / "r" / "checkpoint-4" / "state.json").read_text())["cpu_threads"] == 2
    assert "as the run being resumed" in (tmp_path / "runs" / "sql" / "r" / "train.log").read_text()


def test_resume_on_another_build_is_refused_unless_allowed(tmp_path, model_dir):
    old = write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=4, save_steps=2, run_name="r")
    run_dir = run(config, tmp_path / "cache")
    new = write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 5), [], 32, model_dir, salt="v2")

    more = make_config(model_dir, tmp_path / "runs", max_steps=6, save_steps=2, run_name="r")
    with pytest.raises(CheckpointError) as err:
        run(more, tmp_path / "cache", resume=str(run_dir))
    assert old in str(err.value) and new in str(err.value) and "--allow-build-change" in str(err.value)

    # r is finished: it continues in a new run beside it
    assert run(more, tmp_path / "cache", resume=str(run_dir), allow_build_change=True) == run_dir.with_name("r-from-4")
    state = json.loads((run_dir.with_name("r-from-4") / "checkpoint-6" / "state.json").read_text())
    assert state["build_id"] == new and state["step"] == 6


def test_resume_with_other_optimizer_settings_or_seed_is_refused(tmp_path, model_dir):
    """The restored optimizer and schedule keep the checkpoint's learning rate, weight decay and Adam
    numbers: a resume with others trained with the old ones while its config.json recorded the new. Another
    seed drew another block order, in which the saved position would skip some blocks and repeat others."""
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=2, save_steps=2, run_name="r"), tmp_path / "cache")
    more = make_config(model_dir, tmp_path / "runs", max_steps=4, learning_rate=0.01, weight_decay=0.1)
    with pytest.raises(CheckpointError, match=r"^checkpoint .*checkpoint-2 was trained with other optimizer settings "
                       r"\(the restored optimizer keeps them\): train.learning_rate 0.001 \(this run: 0.01\), "
                       r"train.weight_decay 0.0 \(this run: 0.1\); resume with the checkpoint's \(--set "
                       r"train.learning_rate=0.001 --set train.weight_decay=0.0\), or start a new run, from its "
                       r"adapter with train.init_adapter$"):
        run(more, tmp_path / "cache", resume=str(run_dir))
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["r"]

    with pytest.raises(CheckpointError, match=r"^checkpoint .*checkpoint-2 was trained with other seed \(it orders every "
                       r"epoch's blocks, so the saved data position would point into another order; and it draws a "
                       r"random-init base's weights\): train.seed 42 \(this run: 7\); resume with the checkpoint's "
                       r"\(--set train.seed=42\)"):
        run(make_config(model_dir, tmp_path / "runs", max_steps=4, seed=7), tmp_path / "cache", resume=str(run_dir))
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["r"]

def test_a_resume_that_changes_the_schedule_trains_every_step_on_the_new_one(tmp_path, model_dir):
    """The optimizer's saved state holds the rate of the checkpoint's schedule: a 2-step cosine ends at 0.
    Continued to 4 steps, step 3 trained at that 0 (the rate is logged as the step used it)."""
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=2, save_steps=2, run_name="r",
                              lr_scheduler_type="cosine"), tmp_path / "cache")
    for scheduler, expected in (("cosine", [5e-4, 0.5e-3 * (1 + math.cos(math.pi * 3 / 4))]), ("constant", [1e-3, 1e-3])):
        more = make_config(model_dir, tmp_path / "runs", max_steps=4, lr_scheduler_type=scheduler)
        resumed = run(more, tmp_path / "cache", resume=str(run_dir))
        rates = [r["lr"] for r in map(json.loads, (resumed / "metrics.jsonl").read_text().splitlines())
                 if r.get("step", 0) > 2 and "lr" in r]
        assert rates == pytest.approx(expected, rel=1e-12, abs=0)


def test_windows_resume_exactly_and_another_sequence_length_is_refused(tmp_path, model_dir):
    """train.max_seq_length cuts the 32-token blocks into windows of 16: the data position counts windows,
    so a resume continues bit for bit, and a resume with another length is refused, saying which."""
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    settings = dict(max_steps=4, save_steps=2, eval_steps=2, max_seq_length=16)
    full = run(make_config(model_dir, tmp_path / "runs", run_name="w", **settings), tmp_path / "cache")
    assert json.loads((full / "run.json").read_text())["seq_length"] == 16
    assert json.loads((full / "checkpoint-2" / "state.json").read_text())["seq_length"] == 16

    with pytest.raises(CheckpointError) as err:
        run(make_config(model_dir, tmp_path / "runs", **{**settings, "max_seq_length": None}), tmp_path / "cache",
            resume=str(full / "checkpoint-2"))
    assert ("was taken on sequences of 16 tokens, this run has 32 (train.max_seq_length" in str(err.value)
            and "--set train.max_seq_length=16" in str(err.value))
    resumed = run(make_config(model_dir, tmp_path / "runs", run_name="w", **settings), tmp_path / "cache",
                  resume=str(full / "checkpoint-2"))
    assert resumed == full.with_name("w-from-2")
    assert step_losses(resumed) == step_losses(full)  # steps 1-2 kept from the checkpoint's run, 3-4 again, exactly


def test_resume_path_and_missing_checkpoint(tmp_path, model_dir):
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=2, save_steps=1, save_total_limit=5)
    run_dir = run(config, tmp_path / "cache")
    assert find_checkpoint(str(run_dir), tmp_path) == run_dir / "checkpoint-2"
    assert find_checkpoint(str(run_dir / "checkpoint-1"), tmp_path) == run_dir / "checkpoint-1"
    (run_dir / ".tmp-checkpoint-3-999").mkdir()  # a crash while writing: ignored
    assert find_checkpoint("auto", tmp_path / "runs" / "sql") is None  # a finished run is never resumed
    (run_dir / "summary.json").unlink()
    shutil.rmtree(run_dir / "adapter")
    assert find_checkpoint("auto", tmp_path / "runs" / "sql") == run_dir / "checkpoint-2"
    with pytest.raises(CheckpointError, match="nowhere does not exist"):
        find_checkpoint(str(tmp_path / "nowhere"), tmp_path)
    assert find_checkpoint("auto", tmp_path / "no-runs") is None


@pytest.mark.parametrize("victim", ["trainer_state.pt", "adapter/adapter_model.safetensors", "state.json"])
def test_a_corrupt_checkpoint_file_fails_loudly_naming_it(tmp_path, model_dir, victim):
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=2, save_steps=2)
    run_dir = run(config, tmp_path / "cache")
    path = run_dir / "checkpoint-2" / victim
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    more = make_config(model_dir, tmp_path / "runs", max_steps=4, save_steps=2)
    with pytest.raises(CheckpointError, match=victim.split("/")[-1]):
        run(more, tmp_path / "cache", resume=str(run_dir))


def test_resuming_an_older_checkpoint_abandons_the_later_ones(tmp_path, model_dir, monkeypatch):
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=8, save_steps=2, save_total_limit=10, run_name="r")
    crash_after_checkpoint(monkeypatch, 6)  # unfinished: a finished run would continue in a new directory
    with pytest.raises(Crash):
        run(config, tmp_path / "cache")
    monkeypatch.undo()
    run_dir = tmp_path / "runs" / "sql" / "r"
    assert [p.name for p in complete_checkpoints(run_dir)] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    shorter = make_config(model_dir, tmp_path / "runs", max_steps=3, save_steps=2, save_total_limit=10, run_name="r")
    run(shorter, tmp_path / "cache", resume=str(run_dir / "checkpoint-2"))
    # 4 and 6 belonged to the abandoned trajectory: auto must now take step 3, not step 6
    assert [p.name for p in complete_checkpoints(run_dir)] == ["checkpoint-2", "checkpoint-3"]
    assert find_checkpoint(str(run_dir), tmp_path / "runs" / "sql") == run_dir / "checkpoint-3"
    assert "resuming from step 2 abandons checkpoint-4: removed" in (run_dir / "train.log").read_text()
