"""Data-parallel training: 2 CPU processes (gloo) compute what 1 process with a 2x batch computes.

The two ranks are started with torch.multiprocessing, with the environment torchrun would set (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT) over the test's own, and run the
real ``packtrain.trainer.run.train.run``. They are forked from a fork server that imported the trainer (and
torch, transformers and peft with it) once per test process, so that each rank does not import them
again (5-6 s of CPU each, 8 ranks in this file and test_trainer_fsdp.py); nothing else runs in it.

Tolerances (fp32; the ranks sum the same token losses in another order): losses, eval losses and
gradient norms to 1e-5 relative (measured: <= 2e-7, gradient norms equal); adapter weights to 1e-4 absolute (measured: <= 1e-5, on weights of magnitude ~0.1). The weights get
the looser bound because AdamW divides each element's update by its own gradient magnitude: where a
gradient element is nearly zero, a 1e-7 rounding difference becomes an update difference of a sizable
fraction of the learning rate (1e-3). The gradient norm is the check with teeth for the loss
normalisation: AdamW barely notices a gradient off by a constant factor W, the norm does (dropping
the ``/ W`` in the loop makes this test fail at step 1 with half the gradient norm).
"""

from __future__ import annotations

import json
import os
import socket
import sys

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from packtrain.trainer.run.checkpoint import CheckpointError, complete_checkpoints
from packtrain.trainer.data.data import PAD, BlockSampler
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build

WORLD = 2
# 14 train blocks: a 4-block global micro-batch gives 4 per epoch, the last 2 blocks and 2 of padding (one on
# each rank), so with ga=2 every epoch's second step ends in padding; dropout 0 (masks cannot match a
# differently shaped batch)
SETTINGS = dict(max_steps=4, gradient_accumulation_steps=2, save_steps=2, eval_steps=2, save_total_limit=5,
                per_device_eval_batch_size=2, warmup_steps=1, lr_scheduler_type="cosine", max_grad_norm=0.5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, environ: dict, port: int, model_dir, cache, out, run_name, settings, resume, calls_dir):
    """One rank, as torchrun would start it; records every file-writing call it makes."""
    os.environ.clear()  # the fork server's environment is the first test's: the test's own, as torchrun passes it
    os.environ.update(environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import packtrain.trainer.loop
    import packtrain.trainer.report.metrics

    def record(what):
        with open(os.path.join(calls_dir, f"rank{rank}.txt"), "a") as f:
            f.write(what + "\n")

    save, write = packtrain.trainer.loop.save_checkpoint, packtrain.trainer.report.metrics.MetricsFile.write

    def save_recorded(run_info, state, *args):
        record(f"checkpoint {state.step}")
        return save(run_info, state, *args)

    def write_recorded(self, rec):
        record(f"metrics {rec.get('step')}")
        return write(self, rec)

    packtrain.trainer.loop.save_checkpoint = save_recorded
    packtrain.trainer.report.metrics.MetricsFile.write = write_recorded
    config = make_config(model_dir, out, run_name=run_name, per_device_train_batch_size=2, **settings)
    run(config, cache, resume=resume)


def run_two_ranks(tmp_path, model_dir, run_name, settings=SETTINGS, resume=None):
    calls = tmp_path / f"calls-{run_name}-{resume is not None}"
    calls.mkdir()
    mp.set_forkserver_preload(["packtrain.trainer.run.train"])  # not this module: the fork server lacks tests/ on its path
    mp.start_processes(_rank_main, nprocs=WORLD, start_method="forkserver", join=True,
                       args=(dict(os.environ), free_port(), model_dir, tmp_path / "cache", tmp_path / "runs", run_name, settings,
                             resume, str(calls)))
    return tmp_path / "runs" / "sql" / run_name, {p.stem: p.read_text().split("\n")[:-1] for p in calls.iterdir()}


def records(run_dir):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [(r["step"], r["loss"], r["grad_norm"]) for r in lines if "loss" in r]
    evals = [(r["step"], r["eval/loss"], r["eval/tokens"]) for r in lines if "eval/loss" in r]
    return train, evals


def assert_same_run(got, want):
    (train_got, eval_got), (train_want, eval_want) = records(got), records(want)
    assert [s for s, *_ in train_got] == [s for s, *_ in train_want] == list(range(1, 5))
    for (_, loss, norm), (_, loss_ref, norm_ref) in zip(train_got, train_want):
        assert loss == pytest.approx(loss_ref, rel=1e-5) and norm == pytest.approx(norm_ref, rel=1e-5)
    tokens = eval_want[0][2]  # step 0: evaluated before training
    assert [(s, t) for s, _, t in eval_got] == [(s, t) for s, _, t in eval_want] == [(0, tokens), (2, tokens), (4, tokens)]
    for (_, loss, _), (_, loss_ref, _) in zip(eval_got, eval_want):
        assert loss == pytest.approx(loss_ref, rel=1e-5)
    a = load_file(got / "adapter" / "adapter_model.safetensors")
    b = load_file(want / "adapter" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and len(a) > 0
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-4)


def test_strided_slices_make_up_the_global_batches():
    """Rank r takes positions r, r+W, ...: the k-th batches of the ranks are the k-th global batch, the
    epoch's last one included (2 blocks and 2 of padding: one each)."""
    one = list(BlockSampler(14, 7, "b", batch_size=4))
    ranks = [list(BlockSampler(14, 7, "b", rank=r, world_size=WORLD, batch_size=2)) for r in range(WORLD)]
    assert [len(r) for r in ranks] == [8, 8] and len(one) == 16
    for k in range(4):  # batches of 2 per rank, 4 globally
        assert sorted(ranks[0][2 * k:2 * k + 2] + ranks[1][2 * k:2 * k + 2]) == sorted(one[4 * k:4 * k + 4])
    assert ranks[0][-1] == ranks[1][-1] == PAD


def single_process_reference(tmp_path, monkeypatch, train_blocks: int = 14, val_blocks: int = 5):
    """A build (14 train, 5 val blocks) and one process's run with the global batch (4 x ga 2), the
    reference every multi-process run is compared with; returns (model_dir, single run dir)."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    model_dir = tiny_model_dir(tmp_path / "model")
    write_build(tmp_path / "cache", "sql", random_blocks(train_blocks, 32, 0), random_blocks(val_blocks, 32, 1), 32,
                model_dir)
    single = run(make_config(model_dir, tmp_path / "runs", run_name="single", per_device_train_batch_size=4,
                             **SETTINGS), tmp_path / "cache")
    return model_dir, single


@pytest.mark.skipif(sys.platform != "linux", reason="gloo over TCP on localhost, tested on Linux")
def test_two_ranks_match_one_process_with_the_global_batch(tmp_path, monkeypatch):
    model_dir, single = single_process_reference(tmp_path, monkeypatch)
    # two processes, 2 each x ga 2
    ddp, calls = run_two_ranks(tmp_path, model_dir, "ddp")
    assert_same_run(ddp, single)

    # only rank 0 wrote: checkpoints once, every metrics line once (metrics 0: the eval before training)
    assert "rank1" not in calls
    assert calls["rank0"] == ["metrics 0", "metrics 1", "metrics 2", "metrics 2", "checkpoint 2", "metrics 3", "metrics 4",
                              "metrics 4", "checkpoint 4"]
    assert [p.name for p in complete_checkpoints(ddp)] == ["checkpoint-2", "checkpoint-4"]
    assert not list(ddp.glob(".tmp-*"))
    state = json.loads((ddp / "checkpoint-4" / "state.json").read_text())
    single_state = json.loads((single / "checkpoint-4" / "state.json").read_text())
    assert state["world_size"] == 2 and single_state["world_size"] == 1
    # the data position, token counts and epoch are global: the same as the single process's
    assert {k: state[k] for k in ("step", "epoch", "position", "tokens", "sup_tokens")} == \
           {k: single_state[k] for k in ("step", "epoch", "position", "tokens", "sup_tokens")}
    assert json.loads((ddp / "run.json").read_text())["global_batch_blocks"] == 8

    # resuming with the same world size redoes steps 3-4 exactly (rank 0 picked checkpoint-2)
    before = records(ddp)
    _, calls = run_two_ranks(tmp_path, model_dir, "ddp", resume=str(ddp / "checkpoint-2"))
    again = ddp.with_name("ddp-from-2")  # ddp is finished: it continues in a new run beside it
    assert "rank1" not in calls
    assert records(again) == before and records(ddp) == before
    assert calls["rank0"] == ["metrics 3", "metrics 4", "metrics 4", "checkpoint 4"]

    # another world size is refused, naming both
    more = make_config(model_dir, tmp_path / "runs", run_name="ddp", per_device_train_batch_size=4,
                       **{**SETTINGS, "max_steps": 6})
    with pytest.raises(CheckpointError, match="world size 2, this run has world size 1"):
        run(more, tmp_path / "cache", resume=str(ddp))
