"""What the console shows while the trainer works (trainer/report/progress.py): off a terminal one line per
logged step with its ETA and lines for evaluation and generation; on a terminal a bar, the step
lines in train.log only. The end-of-run samples' bound, and the torch thread count (trainer/threads.py)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pytest
import yaml

from packtrain.trainer.report import progress
from packtrain.trainer import threads
from packtrain.trainer.report.progress import format_duration, line_marks, step_line
from packtrain.trainer.eval.task_eval import sample_max_new_tokens
from packtrain.trainer.threads import choose_threads, decide_threads, parse_cpu_max

# --- pure functions ----------------------------------------------------------------------------

def test_step_line():
    record = {"step": 20, "loss": 1.234567, "lr": 2e-4, "tok_s": 1534.6, "data_wait": 0.125, "step_s": 0.42}
    assert step_line(record, 30, 4.2) == ("step 20/30: loss 1.2346, lr 2.00e-04, 1535 tok/s, data wait 12.5%, "
                                          "0.4 s/step, ETA 4s")
    assert [format_duration(s) for s in (0, 59.6, 60, 3599, 3600, 90061)] == ["0s", "1m00s", "1m00s", "59m59s",
                                                                              "1h00m", "25h01m"]


def test_a_step_without_a_supervised_token_has_no_loss_not_a_loss_of_0():
    """A 512-token CPU window of prompt tokens only: the step says so (it said `loss 0.0000`), its
    metrics line has a null loss (loss.png leaves the point out rather than drawing a drop to 0), and
    the summary's final loss is the last step's that had one."""
    import torch

    from packtrain.trainer.report.metrics import FlopCounter, Meter, WindowCounts, summarize

    meter = Meter(torch.device("cpu"), FlopCounter(10, 1, 0.0), None)
    meter.add(WindowCounts(tokens=512, sup=0, pairs=512), 0.0, torch.zeros(()))
    record = meter.flush(1, 0.0, 2e-4, torch.tensor(0.5))
    assert record["loss"] is None
    assert step_line({**record, "tok_s": 40.2, "data_wait": 0.001, "step_s": 12.5}, 5, 50.0) == (
        "step 1/5: no supervised token (no loss), lr 2.00e-04, 40 tok/s, data wait 0.1%, 12.5 s/step, ETA 50s")
    meter.add(WindowCounts(tokens=512, sup=4, pairs=512), 0.0, torch.tensor(6.0))
    supervised = meter.flush(2, 0.0, 2e-4, torch.tensor(0.5))
    assert supervised["loss"] == 1.5
    assert summarize([supervised, record], [], {})["final_loss"] == 1.5


def test_a_log_line_on_a_terminal_is_not_glued_to_the_bar():
    """On a terminal the bar's line is cleared before a log line (a checkpoint's) and drawn again after it."""
    import io

    from tqdm import tqdm

    from packtrain.trainer.run.runlog import ConsoleHandler

    stream = io.StringIO()
    handler = ConsoleHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    bar = tqdm(total=5, desc="train sql", file=stream)
    bar.update(1)
    handler.emit(logging.makeLogRecord({"msg": "step 1: checkpoint runs/sql/run/checkpoint-1", "levelno": 20}))
    bar.close()
    before, _, after = stream.getvalue().partition("step 1: checkpoint runs/sql/run/checkpoint-1\n")
    assert re.search(r"train sql.*\r {20,}\r$", before, re.S), before  # the bar, then cleared: \r, blanks, \r
    assert after.startswith("\r") and "train sql" in after  # drawn again below


def test_line_marks():
    assert sorted(line_marks(1)) == [1]
    assert sorted(line_marks(10)) == list(range(1, 11))
    assert sorted(line_marks(100)) == [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]
    assert line_marks(0) == set()


@pytest.mark.parametrize("affinity, quota, load, expected", [
    (16, 2.0, 9.0, 1),     # a quota of 2 CPUs on a loaded machine
    (16, 2.0, 0.0, 2),     # the quota, not the 16 CPUs the mask shows
    (16, None, 0.0, 16),
    (16, None, 4.2, 12),
    (2, None, 5.5, 1),     # this machine today
    (2, None, 0.3, 2),
    (2, None, 0.6, 1),
    (4, 0.5, 0.0, 1),      # half a CPU: still one thread
    (8, 3.9, 1.0, 2),
])
def test_choose_threads(affinity, quota, load, expected):
    assert choose_threads(affinity, quota, load) == expected


def test_cgroup_cpu_max():
    assert [parse_cpu_max(t) for t in ("200000 100000\n", "max 100000\n", "50000 100000")] == [2.0, None, 0.5]


def test_decide_threads(monkeypatch):
    monkeypatch.setattr(threads, "affinity_cpus", lambda: 16)
    monkeypatch.setattr(threads, "cgroup_quota", lambda: 2.0)
    monkeypatch.setattr(threads, "load_average", lambda: 9.0)
    assert decide_threads("auto", 8, {}) == threads.ThreadChoice(
        1, "torch threads: 1 (16 CPUs, a cgroup quota of 2, others' load 9.0; train.cpu_threads or OMP_NUM_THREADS "
           "to set)")
    assert decide_threads("auto", 8, {"OMP_NUM_THREADS": "4"}) == threads.ThreadChoice(
        None, "torch threads: 4 (OMP_NUM_THREADS; 16 CPUs, a cgroup quota of 2)")
    assert decide_threads(3, 8, {"OMP_NUM_THREADS": "4"}) == threads.ThreadChoice(
        3, "torch threads: 3 (train.cpu_threads; 16 CPUs, a cgroup quota of 2)")
    monkeypatch.setattr(threads, "cgroup_quota", lambda: None)
    monkeypatch.setattr(threads, "load_average", lambda: 0.0)
    assert decide_threads("auto", 8, {}).threads == 8  # never more than torch's own count (its physical cores)


def test_others_load_is_the_lower_of_the_load_average_and_what_runs_now(tmp_path, monkeypatch):
    """The 1-minute average still counts `make install`'s and the build's own work for a minute after
    they end: what runs right now (less this process) decides when it is lower."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3\nprocs_running 1\nprocs_blocked 0\n")  # only the reader itself
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (1.2, 0.5, 0.3))
    assert threads.load_average(stat, samples=3, interval=0) == 0.0
    stat.write_text("procs_running 4\n")  # three others runnable now
    assert threads.load_average(stat, samples=2, interval=0) == 1.2  # the average is lower: it decides
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    assert threads.load_average(stat, samples=2, interval=0) == 3.0
    assert threads.load_average(tmp_path / "absent", samples=2, interval=0) == 9.0  # no /proc: the average


def test_sample_bound():
    assert sample_max_new_tokens("auto", 128, 100, "cpu") == 32
    assert sample_max_new_tokens("auto", 128, 100, "cuda") == 128
    assert sample_max_new_tokens("auto", 128, 3, "cpu") == 14
    assert sample_max_new_tokens(7, 128, 100, "cuda") == 7


# --- a run, as a log file gets it ----------------------------------------------------------------

@pytest.fixture(scope="module")
def run_output(tmp_path_factory) -> list[str]:
    """The console of a tiny 6-step `packtrain train` whose output goes to a pipe (as under nohup, CI or
    `> log 2>&1`), without the times at the start of the lines."""
    from test_task_eval import memorization_build
    from trainer_fixtures import make_config, tiny_model_dir

    root = tmp_path_factory.mktemp("progress")
    model_dir = tiny_model_dir(root / "model")
    memorization_build(root / "cache", model_dir, expert="sql")
    config = make_config(model_dir, root / "runs", max_steps=6, logging_steps=2, eval_steps=3, sample_prompts=2,
                         sample_max_new_tokens=3, max_new_tokens=16, plots=False, per_device_eval_batch_size=1)
    (root / "configs").mkdir()
    (root / "configs" / "sql.yaml").write_text(yaml.safe_dump(config.to_dict()))
    done = subprocess.run([sys.executable, "-m", "packtrain.cli", "train", "sql", "--configs-dir", str(root / "configs"),
                           "--cache-dir", str(root / "cache")], capture_output=True, env=quiet_env())
    assert done.returncode == 0, done.stderr.decode()
    assert b"\r" not in done.stderr and b"%|" not in done.stderr  # no bar
    return [line.split(" INFO ", 1)[-1] for line in done.stderr.decode().splitlines()]


def quiet_env() -> dict[str, str]:
    """This environment without the variables a user does not set (the CLI sets them: cli/console.py)."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONWARNINGS", "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "PACKTRAIN_VERBOSE",
                         "OMP_NUM_THREADS")}


def test_off_a_terminal_every_logged_step_is_a_line_with_its_eta(run_output):
    steps = [line for line in run_output if line.startswith("step ") and "/6:" in line]
    assert [line.split(":")[0] for line in steps] == ["step 2/6", "step 4/6", "step 6/6"]
    pattern = (r"step \d/6: loss \d+\.\d{4}, lr \d\.\d\de-\d\d, \d+ tok/s, data wait \d+\.\d%, \d+\.\d s/step, "
               r"ETA \d+s")
    assert all(re.fullmatch(pattern, line) for line in steps), steps
    assert steps[-1].endswith("ETA 0s")


def test_off_a_terminal_evaluation_and_generation_say_their_progress(run_output):
    # 2 val blocks, 1 sequence per batch: a line per batch, the last one with the time taken; generation on a
    # CPU batches at least 8 prompts (trainer/eval/task_eval.py CPU_GENERATION_BATCH): both prompts in one batch
    evals = [re.sub(r"\d+s\b", "Ns", line) for line in run_output if line.startswith("eval at step")]
    assert evals == [line for step in (0, 3, 6) for line in (
        f"eval at step {step}: 2 batches to do", f"eval at step {step}: 1/2 batches, Ns, ETA Ns",
        f"eval at step {step}: 2/2 batches in Ns")]
    samples = [re.sub(r"\d+s\b", "Ns", line) for line in run_output if line.startswith("samples")]
    assert samples == ["samples: base model vs adapter on 2 validation prompts, greedy, each stopping at the eos or "
                       "after 3 new tokens (train.sample_max_new_tokens: 3)",
                       "samples, base model: 2 prompts to do", "samples, base model: 2/2 prompts in Ns",
                       "samples, adapter: 2 prompts to do", "samples, adapter: 2/2 prompts in Ns"]


def test_the_samples_stop_at_their_bound(run_output):
    answers = [line.split("base      ", 1)[1] for line in run_output if line.strip().startswith("base      ")]
    assert len(answers) == 2 and all(1 <= len(answer.split()) <= 3 for answer in answers), answers


def test_the_thread_count_is_said_once(run_output):
    said = [line for line in run_output if line.startswith("torch threads: ")]
    assert len(said) == 1 and re.fullmatch(r"torch threads: \d+ \(\d+ CPUs.*", said[0]), said


def test_on_a_terminal_a_bar_and_the_step_lines_in_train_log_only(tmp_path, monkeypatch, caplog, capsys):
    from packtrain.trainer.run.runlog import FILE_ONLY
    from packtrain.trainer.run.train import run
    from test_task_eval import memorization_build
    from trainer_fixtures import make_config, tiny_model_dir

    monkeypatch.setattr(progress, "on_terminal", lambda: True)
    model_dir = tiny_model_dir(tmp_path / "model")
    memorization_build(tmp_path / "cache", model_dir, expert="sql")
    with caplog.at_level(logging.INFO, logger="packtrain.train"):
        run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=2, sample_prompts=0, plots=False),
                      tmp_path / "cache")
    steps = [r for r in caplog.records if r.getMessage().startswith("step 1/2: loss")]
    assert len(steps) == 1 and getattr(steps[0], "file_only") is FILE_ONLY["file_only"]
    assert " step 2/2: loss " in (run_dir / "train.log").read_text()
    assert "2/2 [" in capsys.readouterr().err  # tqdm's bar, with its times
