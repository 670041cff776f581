"""Issue 47, item 1: nothing trained is lost to an interrupt (trainer/run/interrupts.py, trainer/loop.py).

A real `packtrain train` in a subprocess (tests/hooked_cli.py sends the signal in step 5's forward) gets
SIGINT as Ctrl-C sends it (to its process group) or SIGTERM as SLURM and Kubernetes send it: it saves
checkpoint-5 at the end of step 5, says where it is and how to resume, exits 130 or 143; `--resume auto`
then ends with the very losses of an uninterrupted run. A second Ctrl-C stops at once, saving nothing,
and `--resume auto` says what it found. The save cadence: ``save_steps: auto`` saves by time
(``save_minutes``), the cpu profile's too."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from inprocess_cli import ROOT, cli
from packtrain.core.config import ConfigError
from packtrain.core.configfile import config_from_dict
from packtrain.core.rundir import complete_checkpoints
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build

SETTINGS = dict(max_steps=10, per_device_train_batch_size=2, save_steps="auto", eval_steps=4, warmup_ratio=0.1,
                lr_scheduler_type="cosine", sample_prompts=0, plots=False)
LORA = {"dropout": 0.1}  # dropout draws from the torch RNG: its restored state is part of the check


def losses(run_dir: Path) -> list[tuple]:
    """Every step's training loss and every evaluation loss, in the order written."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("loss"), r.get("eval/loss")) for r in lines if "loss" in r or "eval/loss" in r]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, model_dir):
    tmp = tmp_path_factory.mktemp("uninterrupted")
    write_build(tmp / "cache", "sql", random_blocks(9, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    run_dir = run(make_config(model_dir, tmp / "runs", lora=LORA, run_name="full", **SETTINGS), tmp / "cache")
    assert [p.name for p in complete_checkpoints(run_dir)] == ["checkpoint-10"]  # the defaults: none before the end
    return losses(run_dir)


def project(tmp_path: Path, model_dir: Path) -> list[str]:
    """A build and configs/sql.yaml for the tiny model; the CLI options that train it."""
    write_build(tmp_path / "cache", "sql", random_blocks(9, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", lora=LORA, run_name="r", **SETTINGS)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "sql.yaml").write_text(yaml.safe_dump(config.to_dict()))
    return ["--configs-dir", str(tmp_path / "configs"), "--cache-dir", str(tmp_path / "cache")]


def signalled_train(options: list[str], signals: str) -> subprocess.CompletedProcess:
    """`packtrain train sql` in its own session, ``signals`` (``INT``, ``TERM``, ``INT,INT``) sent in step 5."""
    env = {**os.environ, "ATK_SIGNAL_AT_STEP": "5", "ATK_SIGNALS": signals}
    return subprocess.run([sys.executable, str(ROOT / "tests" / "hooked_cli.py"), "train", "sql", *options],
                          capture_output=True, text=True, env=env, start_new_session=True, timeout=600)


@pytest.mark.parametrize("signals, code, name", [("INT", 130, "SIGINT (Ctrl-C)"), ("TERM", 143, "SIGTERM")])
def test_a_signal_saves_its_step_and_resume_auto_ends_as_if_uninterrupted(tmp_path, model_dir, uninterrupted,
                                                                         signals, code, name):
    options = project(tmp_path, model_dir)
    stopped = signalled_train(options, signals)
    run_dir = tmp_path / "runs" / "sql" / "r"
    assert stopped.returncode == code, stopped.stderr
    assert [p.name for p in complete_checkpoints(run_dir)] == ["checkpoint-5"]
    last = stopped.stderr.strip().splitlines()[-1]
    assert last == (f"stopped by {name} after step 5 of 10: checkpoint {run_dir / 'checkpoint-5'}; resume with "
                    f"`packtrain train sql {' '.join(options)} --resume auto`")  # the options it was run with
    assert "Traceback" not in stopped.stderr and not (run_dir / "adapter").exists()

    resumed = cli("train", "sql", *options, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.strip().splitlines()[-1])["run_dir"] == str(run_dir)
    assert losses(run_dir) == uninterrupted  # every step's loss and eval loss, exactly, once each


def test_a_second_ctrl_c_stops_at_once_and_resume_auto_says_what_it_found(tmp_path, model_dir, caplog):
    options = project(tmp_path, model_dir)
    stopped = signalled_train(options, "INT,INT")
    run_dir = tmp_path / "runs" / "sql" / "r"
    assert stopped.returncode == 130, stopped.stderr
    assert "SIGINT (Ctrl-C) again: stopping at once, saving nothing more" in stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == "aborted"
    assert complete_checkpoints(run_dir) == [] and not list(run_dir.glob(".tmp-*"))

    (tmp_path / "configs" / "sql.yaml").write_text(  # a new run beside it, not over it
        (tmp_path / "configs" / "sql.yaml").read_text().replace("run_name: r", "run_name: r2"))
    with caplog.at_level(logging.INFO, logger="packtrain.train"):
        resumed = cli("train", "sql", *options, "--resume", "auto")
    assert resumed.returncode == 0, resumed.stderr
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resume auto:")]
    assert any(f"{run_dir} is an unfinished run with no checkpoint" in line and "kept as it is" in line
               for line in said), said
    assert (run_dir / "metrics.jsonl").is_file()  # what it holds is left to the user


def test_save_steps_auto_saves_by_time(tmp_path, model_dir):
    write_build(tmp_path / "cache", "sql", random_blocks(9, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=4, save_steps="auto", save_minutes=1e-9,
                         save_total_limit=10)
    run_dir = run(config, tmp_path / "cache")
    assert [p.name for p in complete_checkpoints(run_dir)] == [f"checkpoint-{s}" for s in (1, 2, 3, 4)]


def test_the_save_cadence_config():
    def train(**fields):
        return config_from_dict({"expert": "sql", "sources": [{"name": "bundled"}], "train": fields})

    assert (train().train.save_steps, train().train.save_minutes) == ("auto", 10.0)  # the defaults
    with pytest.raises(ConfigError, match=r"train.save_steps: auto saves every train.save_minutes, which is unset; "
                                          r"set train.save_minutes \(e.g. 10\) or train.save_steps"):
        train(save_minutes=None)
    assert train(save_steps=50, save_minutes=None).train.save_steps == 50
    on_cpu = config_from_dict({"expert": "sql", "sources": [{"name": "bundled"}], "cpu": {"enabled": True}})
    assert on_cpu.for_device(cuda=False).train.save_minutes == 1.0  # the cpu profile's
    assert on_cpu.for_device(cuda=False, explicit=frozenset({"train.save_minutes"})).train.save_minutes == 10.0
    assert on_cpu.for_device(cuda=True).train.save_minutes == 10.0


# --- under torchrun: every rank stops after the same step ---------------------------------------------

def _rank_stopped(rank: int, environ: dict, port: int, model_dir, cache, out, results) -> None:
    """One of 2 ranks, as torchrun starts it; rank 1 alone gets SIGINT, in step 3's forward. Writes how it ended."""
    import signal

    import packtrain.trainer.loop
    from packtrain.core.errors import Interrupted

    os.environ.clear()
    os.environ.update(environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    forward, forwards = packtrain.trainer.loop.forward_loss, []

    def forward_and_signal(*args, **kwargs):
        forwards.append(1)
        if rank == 1 and len(forwards) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return forward(*args, **kwargs)

    packtrain.trainer.loop.forward_loss = forward_and_signal
    config = make_config(model_dir, out, run_name="ddp", max_steps=8, save_steps="auto", eval_steps=1000)
    try:
        run(config, cache)
        ended = "finished"
    except Interrupted as e:
        ended = f"{e.exit_code} {e}"
    Path(results, f"rank{rank}").write_text(f"{len(forwards)} forwards; {ended}")


@pytest.mark.skipif(sys.platform != "linux", reason="gloo over TCP on localhost, tested on Linux")
def test_under_torchrun_every_rank_stops_after_the_step_one_rank_was_interrupted_in(tmp_path, model_dir, monkeypatch):
    import torch.multiprocessing as mp
    from test_trainer_distributed import free_port

    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    (tmp_path / "results").mkdir()
    mp.set_forkserver_preload(["packtrain.trainer.run.train"])
    mp.start_processes(_rank_stopped, nprocs=2, start_method="forkserver", join=True,
                       args=(dict(os.environ), free_port(), model_dir, tmp_path / "cache", tmp_path / "runs",
                             str(tmp_path / "results")))
    run_dir = tmp_path / "runs" / "sql" / "ddp"
    ended = {p.name: p.read_text() for p in (tmp_path / "results").iterdir()}
    assert ended["rank1"].startswith("3 forwards; 130 stopped by SIGINT (Ctrl-C) after step 3 of 8"), ended
    assert ended["rank0"].startswith("3 forwards; 143 stopped by a signal to another rank after step 3 of 8"), ended
    assert [p.name for p in complete_checkpoints(run_dir)] == ["checkpoint-3"]


def test_ctrl_c_with_data_workers_evaluates_and_saves_its_step(tmp_path, model_dir):
    """Ctrl-C reaches the data workers too (the process group): they leave it to the trainer, whose
    evaluation due at the stopping step still reads the val blocks through its persistent worker."""
    write_build(tmp_path / "cache", "sql", random_blocks(9, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", run_name="w", max_steps=10, save_steps="auto", eval_steps=5,
                         dataloader_num_workers=1, dataloader_persistent_workers=True, sample_prompts=0, plots=False)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "sql.yaml").write_text(yaml.safe_dump(config.to_dict()))
    stopped = signalled_train(["--configs-dir", str(tmp_path / "configs"), "--cache-dir", str(tmp_path / "cache")],
                              "INT")
    run_dir = tmp_path / "runs" / "sql" / "w"
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    assert [p.name for p in complete_checkpoints(run_dir)] == ["checkpoint-5"]
    assert [step for step, _, eval_loss in losses(run_dir) if eval_loss is not None] == [0, 5]


@pytest.mark.parametrize("signal_name, code, line", [
    ("TERM", 143, "stopped by SIGTERM outside the training steps (loading, evaluating before the first step, or ending "
                  "the run): every checkpoint is kept, and a run whose adapter/ was written is finished; resume an "
                  "unfinished one with --resume auto"),
    ("INT", 130, "aborted")])
def test_a_signal_at_the_end_of_the_run_leaves_it_finished_and_says_so(tmp_path, model_dir, signal_name, code, line):
    """Attack 52: a SIGTERM after the last step (the samples, the task eval: minutes) ended the process without a
    word, leaving .tmp-* and .lock; SIGTERM or Ctrl-C there left a trained adapter/ without summary.json, which
    `export` and `eval` did not see ("no finished run") and `--resume auto` would train again from step 0."""
    options = project(tmp_path, model_dir)
    env = {**os.environ, "ATK_SIGNAL_AT_END": signal_name}
    stopped = subprocess.run([sys.executable, str(ROOT / "tests" / "hooked_cli.py"), "train", "sql", *options],
                             capture_output=True, text=True, env=env, start_new_session=True, timeout=600)
    run_dir = tmp_path / "runs" / "sql" / "r"
    assert stopped.returncode == code, stopped.stderr[-3000:]
    assert stopped.stderr.strip().splitlines()[-1] == line and "Traceback" not in stopped.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == ["adapter", "checkpoint-10", "config.json", "metrics.jsonl",
                                                         "run.json", "summary.json", "train.log"]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 10
    exported = cli("export", "sql", "--out", tmp_path / "export", "--runs-dir", tmp_path / "runs")
    assert exported.returncode == 0, exported.stderr
