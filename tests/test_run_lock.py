"""Issue 46 D: one process per run directory. Two ``train --resume auto`` on one run at once both
resumed it (the loser died on the other's ``.tmp-checkpoint-3-<pid>/checksums.json``, metrics.jsonl
recorded steps 3 and 4 twice). The main rank now holds ``<run>/.lock`` (packtrain/core/run_lock.py) while
the run trains or resumes: a second process is refused in one line naming the holder and the run; a
lock left by a killed holder is taken over, said in one line. The holders here are real processes: a fresh
interpreter holding the lock, and forks of the test process training (torch is imported once)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from packtrain.core.run_lock import RUN_LOCK, RunLocked
from packtrain.trainer.run.train import run
from test_reliability_runs_inputs import snapshot, steps_of, unfinished_run
from trainer_fixtures import make_config, tiny_model_dir

ROOT = Path(__file__).resolve().parents[1]

# A process that locks the run directory argv[1], says so on stdout, then waits for stdin to close
# (or for its SIGKILL) before it lets go.
HOLDER = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from packtrain.core.run_lock import RunLock
lock = RunLock(sys.argv[1]).acquire()
print("held", flush=True)
sys.stdin.read()
lock.release()
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def holding(run_dir: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_second_process_on_a_run_being_trained_is_refused_naming_the_holder(tmp_path, model_dir, monkeypatch):
    run_dir = unfinished_run(tmp_path, model_dir, monkeypatch)  # checkpoint-2 of 4
    config = make_config(model_dir, tmp_path / "runs", max_steps=4, save_steps=1, run_name="r")
    holder = holding(run_dir)
    try:
        before = snapshot(run_dir)
        record = json.loads((run_dir / RUN_LOCK).read_text())
        with pytest.raises(RunLocked) as refused:
            run(config, tmp_path / "cache", resume="auto")
        assert str(refused.value) == (
            f"run directory {run_dir} is in use: process {holder.pid} on {socket.gethostname()} (since "
            f"{record['since']}) trains it (lock {run_dir / RUN_LOCK}); one process per run: wait for that one to "
            "end (or stop it), then continue with --resume auto")
        assert snapshot(run_dir) == before  # nothing written, nothing discarded
    finally:
        holder.stdin.close()
        assert holder.wait() == 0
    assert not (run_dir / RUN_LOCK).exists()  # its holder removed it as it let go
    resumed = run(config, tmp_path / "cache", resume="auto")
    assert resumed == run_dir and steps_of(run_dir) == [1, 2, 3, 4]  # each step once
    assert not (run_dir / RUN_LOCK).exists()


def test_the_lock_of_a_killed_holder_is_taken_over_saying_so(tmp_path, model_dir, monkeypatch, caplog):
    run_dir = unfinished_run(tmp_path, model_dir, monkeypatch)
    holder = holding(run_dir)
    record = json.loads((run_dir / RUN_LOCK).read_text())
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert (run_dir / RUN_LOCK).exists()  # left behind: the kernel let go of the lock, not of the file
    config = make_config(model_dir, tmp_path / "runs", max_steps=4, save_steps=1, run_name="r")
    with caplog.at_level(logging.WARNING, logger="packtrain.train"):
        assert run(config, tmp_path / "cache", resume="auto") == run_dir
    assert f"run directory {run_dir}: taking over the lock {run_dir / RUN_LOCK} of process {holder.pid} on " \
           f"{socket.gethostname()} (since {record['since']}), which is gone" in caplog.messages
    assert steps_of(run_dir) == [1, 2, 3, 4] and not (run_dir / RUN_LOCK).exists()


def forked_trainer(config, cache: Path, go: int, out: Path) -> int:
    """A real second process (a fork of this one: torch is imported already) that waits for a byte on the
    pipe ``go``, resumes the run, and writes to ``out`` what happened: ``trained`` or ``refused: <line>``."""
    pid = os.fork()
    if pid == 0:
        try:
            os.read(go, 1)
            try:
                run(config, cache, resume="auto")
                said = "trained"
            except RunLocked as e:
                said = f"refused: {e}"
            except Exception as e:  # noqa: BLE001 - reported to the test
                said = f"failed: {type(e).__name__}: {e}"
            out.write_text(said)
        finally:
            os._exit(0)
    return pid


def test_two_resume_auto_at_once_train_the_run_once(tmp_path, model_dir, monkeypatch):
    run_dir = unfinished_run(tmp_path, model_dir, monkeypatch)  # checkpoint-2
    config = make_config(model_dir, tmp_path / "runs", max_steps=6, save_steps=1, run_name="r")
    go_read, go_write = os.pipe()
    outs = [tmp_path / "first", tmp_path / "second"]
    pids = [forked_trainer(config, tmp_path / "cache", go_read, out) for out in outs]
    os.write(go_write, b"xx")  # both at once
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    said = sorted(out.read_text() for out in outs)
    assert said[-1] == "trained", said
    # the other was refused by the lock (or, started after the first had finished, by its finished run's name)
    assert said[0].startswith(f"refused: run directory {run_dir} ") or said[0] == (
        f"failed: TrainError: run directory {run_dir} already exists: continue it with --resume {run_dir}, or choose "
        "another train.run_name"), said
    assert steps_of(run_dir) == [1, 2, 3, 4, 5, 6]  # each step once
    assert not list(run_dir.glob(".tmp-*")) and not (run_dir / RUN_LOCK).exists()


def test_a_forked_child_does_not_keep_the_run_lock(tmp_path):
    """A DataLoader worker is a fork of the trainer: its copy of the lock's file descriptor would hold the
    lock after the trainer was killed, and the next resume would be refused naming a dead process."""
    from packtrain.core.run_lock import RunLock

    lock = RunLock(tmp_path).acquire()
    ready, release = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the fork hooks have run; it waits for the parent's word, then ends
        os.write(ready[1], b"x")
        os.read(release[0], 1)
        os._exit(0)
    try:
        assert os.read(ready[0], 1) == b"x"
        os.close(lock.fd)  # as if the trainer died: its own descriptor closed, the file left behind
        lock.fd = None
        taken: list[str] = []
        RunLock(tmp_path).acquire(taken.append).release()  # the child does not hold it
        assert len(taken) == 1 and "taking over the lock" in taken[0]
    finally:
        os.write(release[1], b"x")
        os.waitpid(pid, 0)
