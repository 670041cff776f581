"""Issue 5, the trainer half: corrupt builds are refused before step 0 naming the file; a run
killed with SIGKILL (during a checkpoint save, and at 10 random steps) resumes to the same losses
and the same adapter, bit for bit; corrupt checkpoints fail loudly naming the file.

The killed runs are forked children of the test process (real SIGKILL, no re-import of torch)."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal

import pyarrow as pa
import pytest
import torch

import packtrain.trainer.run.context
import packtrain.trainer.loop
from packtrain.core.contract import Manifest, check_shard_sizes, resolve_build
from packtrain.core.errors import ContractError
from packtrain.core.shardfile import open_shard
from packtrain.trainer.run.checkpoint import CheckpointError, complete_checkpoints, find_checkpoint
from packtrain.trainer.run.run_checks import TrainError
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def step_losses(run_dir):
    """Every step's training loss and every evaluation loss, in the order written."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("loss"), r.get("eval/loss")) for r in lines if "loss" in r or "eval/loss" in r]


def adapter_bytes(run_dir) -> bytes:
    return (run_dir / "adapter" / "adapter_model.safetensors").read_bytes()


def in_killed_child(target) -> None:
    """Run ``target()`` in a forked child that must die by SIGKILL."""
    pid = os.fork()
    if pid == 0:  # the child: it is expected to kill itself; anything else is a failure
        try:
            target()
        except BaseException as e:  # noqa: BLE001 - reported through the exit code
            print(f"child failed: {type(e).__name__}: {e}", flush=True)
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"child was not killed: {status}"


# ----------------------------------------------------------------------------------------------
# A corrupt build is refused before step 0


def batch_boundaries(path) -> list[int]:
    """Byte offsets in an Arrow IPC stream where a record batch message ends."""
    ends = []
    with pa.OSFile(str(path)) as f:
        reader = pa.ipc.MessageReader.open_stream(f)
        while True:
            try:
                message = reader.read_next_message()
            except StopIteration:
                break
            if message is None:
                break
            if message.type == "record batch":
                ends.append(f.tell())
    return ends


def flip(path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])


def corrupt(build_dir, case: str) -> list[str]:
    """Damage the build as ``case`` says; returns the file names the error must name."""
    train, val = build_dir / "train-00000.arrow", build_dir / "val-00000.arrow"
    size = train.stat().st_size
    if case == "flip-token-byte":
        at = batch_boundaries(train)[1] - 40  # inside the second record batch's token data
        flip(train, at)
        assert check_shard_sizes(build_dir, Manifest.load(build_dir)) is None  # same size: only a hash sees it
        assert len(open_shard(train, Manifest.load(build_dir).block_size)) == 10  # and it still parses: the trainer would read wrong tokens
    elif case == "flip-first-byte":
        flip(train, 0)
    elif case == "flip-last-byte":
        flip(train, size - 1)
    elif case == "truncate-half":
        truncate(train, size // 2)
    elif case == "truncate-one-byte":
        truncate(train, size - 1)
    elif case == "truncate-at-batch-boundary":
        truncate(train, batch_boundaries(train)[1])  # two whole record batches of four, no end marker
        assert len(open_shard(train, Manifest.load(build_dir).block_size)) == 6  # still a valid stream, 4 blocks short
    elif case == "delete-train-shard":
        train.unlink()
    elif case == "delete-val-shard":
        val.unlink()
        return [val.name]
    elif case == "flip-and-delete":
        flip(train, size // 2)
        val.unlink()
        return [train.name, val.name]
    elif case == "truncate-manifest":
        truncate(build_dir / "manifest.json", (build_dir / "manifest.json").stat().st_size // 2)
        return ["manifest.json"]
    return [train.name]


CORRUPTIONS = ["flip-token-byte", "flip-first-byte", "flip-last-byte", "truncate-half", "truncate-one-byte",
               "truncate-at-batch-boundary", "delete-train-shard", "delete-val-shard", "flip-and-delete",
               "truncate-manifest"]


@pytest.mark.parametrize("case", CORRUPTIONS)
def test_a_corrupt_build_is_refused_before_step_0(tmp_path, model_dir, monkeypatch, case):
    write_build(tmp_path / "cache", "sql", random_blocks(10, 32, 0), random_blocks(3, 32, 1), 32, model_dir,
                rows_per_batch=3)
    build_dir = resolve_build(tmp_path / "cache", "sql")
    named = corrupt(build_dir, case)

    def no_model(*_, **__):
        raise AssertionError("the model was loaded: training got past the checks")

    monkeypatch.setattr(packtrain.trainer.run.context, "load_base_model", no_model)
    with pytest.raises((TrainError, ContractError)) as err:
        run(make_config(model_dir, tmp_path / "runs"), tmp_path / "cache")
    message = str(err.value)
    for name in named:
        assert str(build_dir / name) in message
    if case != "truncate-manifest":
        assert "`packtrain pretokenize sql`" in message and "`packtrain verify sql`" in message
    else:
        assert "rebuild" in message
    assert not (tmp_path / "runs").exists()  # nothing started: no run directory


def test_an_intact_build_is_verified_and_the_time_logged(tmp_path, model_dir, caplog):
    write_build(tmp_path / "cache", "sql", random_blocks(10, 32, 0), random_blocks(3, 32, 1), 32, model_dir)
    with caplog.at_level(logging.INFO, logger="packtrain.train"):
        run(make_config(model_dir, tmp_path / "runs", max_steps=1), tmp_path / "cache")
    assert any("2 shards" in r.message and "match the manifest's sha256 (checked in" in r.message
               for r in caplog.records)


# ----------------------------------------------------------------------------------------------
# Killed with SIGKILL, resumed with resume="auto"

SETTINGS = dict(max_steps=24, per_device_train_batch_size=2, save_steps=1, save_total_limit=2, eval_steps=8,
                warmup_ratio=0.1, lr_scheduler_type="cosine")
LORA = {"dropout": 0.1}  # dropout draws from the torch RNG: its restored state is part of the check


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, model_dir):
    tmp = tmp_path_factory.mktemp("uninterrupted")
    write_build(tmp / "cache", "sql", random_blocks(9, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    run_dir = run(make_config(model_dir, tmp / "runs", lora=LORA, run_name="full", **SETTINGS), tmp / "cache")
    return step_losses(run_dir), adapter_bytes(run_dir)


def test_killed_during_a_checkpoint_save_resumes_from_the_newest_complete(tmp_path, model_dir, uninterrupted,
                                                                         monkeypatch):
    write_build(tmp_path / "cache", "sql", random_blocks(9, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", lora=LORA, run_name="r", **SETTINGS)
    save = packtrain.trainer.loop.save_checkpoint

    def save_and_die_at_step_7(run_info, state, *args):
        if state.step == 7:  # every file of checkpoint-7 written, not yet renamed into place
            os.environ["PACKTRAIN_CRASH_AT"] = "checkpoint_save"
        return save(run_info, state, *args)

    def child():
        monkeypatch.setattr(packtrain.trainer.loop, "save_checkpoint", save_and_die_at_step_7)
        run(config, tmp_path / "cache")

    in_killed_child(child)
    run_dir = tmp_path / "runs" / "sql" / "r"
    half_written = list(run_dir.glob(".tmp-checkpoint-7-*"))
    assert len(half_written) == 1 and (half_written[0] / "state.json").is_file()
    assert [p.name for p in complete_checkpoints(run_dir)] == ["checkpoint-5", "checkpoint-6"]
    assert find_checkpoint("auto", tmp_path / "runs" / "sql") == run_dir / "checkpoint-6"

    assert run(config, tmp_path / "cache", resume="auto") == run_dir
    losses, adapter = uninterrupted
    assert step_losses(run_dir) == losses and adapter_bytes(run_dir) == adapter
    assert not list(run_dir.glob(".tmp-*"))


def test_killed_at_10_random_steps_ends_bitwise_equal(tmp_path, model_dir, uninterrupted, monkeypatch):
    """10 SIGKILLs at steps and moments drawn from a seeded RNG: in a forward pass, during a checkpoint
    save, or right after one; each time resumed with resume="auto"."""
    write_build(tmp_path / "cache", "sql", random_blocks(9, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", lora=LORA, run_name="r", **SETTINGS)
    rng = random.Random(11)
    kills = [(step, rng.choice(["forward", "checkpoint_save", "after_save"]))
             for step in sorted(rng.sample(range(2, SETTINGS["max_steps"]), 10))]
    save, forward = packtrain.trainer.loop.save_checkpoint, packtrain.trainer.loop.forward_loss
    run_dir = tmp_path / "runs" / "sql" / "r"

    for step, moment in kills:
        def save_or_die(run_info, state, *args):
            if moment == "checkpoint_save" and state.step == step:
                os.environ["PACKTRAIN_CRASH_AT"] = "checkpoint_save"
            path = save(run_info, state, *args)
            if moment == "after_save" and state.step == step:
                os.kill(os.getpid(), signal.SIGKILL)
            return path

        def forward_or_die(model, *args, **kwargs):
            forwards.append(1)  # training forwards only (evaluation calls its own import of forward_loss)
            if moment == "forward" and start + len(forwards) == step:
                os.kill(os.getpid(), signal.SIGKILL)  # inside step `step`, before its checkpoint
            return forward(model, *args, **kwargs)

        def child():
            monkeypatch.setattr(packtrain.trainer.loop, "save_checkpoint", save_or_die)
            monkeypatch.setattr(packtrain.trainer.loop, "forward_loss", forward_or_die)
            run(config, tmp_path / "cache", resume="auto")

        start, forwards = newest_step(run_dir), []  # one micro-batch per step: step = start + forwards
        in_killed_child(child)
        expected = step if moment == "after_save" else step - 1
        assert newest_step(run_dir) == expected, (step, moment)

    assert run(config, tmp_path / "cache", resume="auto") == run_dir
    losses, adapter = uninterrupted
    assert step_losses(run_dir) == losses  # every step's loss, exactly, once each
    assert adapter_bytes(run_dir) == adapter
    assert not list(run_dir.glob(".tmp-*"))


def newest_step(run_dir) -> int:
    found = complete_checkpoints(run_dir) if run_dir.is_dir() else []
    return int(found[-1].name.split("-")[1]) if found else 0



# ----------------------------------------------------------------------------------------------
# Corrupt checkpoints (tests/test_trainer_resume.py truncates each file; these flip, garble, delete)


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory, model_dir):
    tmp = tmp_path_factory.mktemp("checkpointed")
    write_build(tmp / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    run(make_config(model_dir, tmp / "runs", max_steps=2, save_steps=2, run_name="r"), tmp / "cache")
    return tmp


CHECKPOINT_DAMAGE = {
    "adapter-byte-flip": ("adapter/adapter_model.safetensors", lambda p: flip(p, p.stat().st_size - 3)),
    "adapter-truncated-by-one": ("adapter/adapter_model.safetensors", lambda p: truncate(p, p.stat().st_size - 1)),
    "adapter-deleted": ("adapter/adapter_model.safetensors", lambda p: p.unlink()),
    "trainer-state-byte-flip": ("trainer_state.pt", lambda p: flip(p, p.stat().st_size // 2)),
    "state-json-garbage": ("state.json", lambda p: p.write_bytes(b"\x00\xff not json")),
    "state-json-wrong-fields": ("state.json", lambda p: p.write_text('{"stepp": 2}')),
    "checksums-garbage": ("checksums.json", lambda p: p.write_text("{")),
}


@pytest.mark.parametrize("damage", list(CHECKPOINT_DAMAGE))
def test_a_damaged_checkpoint_fails_loudly_naming_the_file(tmp_path, checkpointed, model_dir, damage):
    shutil.copytree(checkpointed, tmp_path, dirs_exist_ok=True)
    victim, apply = CHECKPOINT_DAMAGE[damage]
    path = tmp_path / "runs" / "sql" / "r" / "checkpoint-2" / victim
    apply(path)
    more = make_config(model_dir, tmp_path / "runs", max_steps=4, save_steps=2, run_name="r")
    with pytest.raises(CheckpointError) as err:  # r is finished: only an explicit path resumes it (into a new run)
        run(more, tmp_path / "cache", resume=str(tmp_path / "runs" / "sql" / "r"))
    assert str(path) in str(err.value) and "--resume PATH" in str(err.value)


def test_the_undamaged_checkpoint_resumes(tmp_path, checkpointed, model_dir):
    """The control for the cases above: the same copy, undamaged, resumes."""
    shutil.copytree(checkpointed, tmp_path, dirs_exist_ok=True)
    more = make_config(model_dir, tmp_path / "runs", max_steps=4, save_steps=2, run_name="r")
    run_dir = run(more, tmp_path / "cache", resume=str(tmp_path / "runs" / "sql" / "r"))
    assert run_dir == tmp_path / "runs" / "sql" / "r-from-2"
    assert [s for s, loss, _ in step_losses(run_dir) if loss is not None] == [1, 2, 3, 4]
    assert torch.load(run_dir / "checkpoint-4" / "trainer_state.pt", weights_only=True)["rng"]
