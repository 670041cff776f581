"""What the commands print: their own lines, not the libraries' bars and warnings (kept with
``--verbose``), and the cpu profile's note once, when training begins (not for `config`, nor before a
refusal)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from packtrain.cli.commands import main
from test_task_eval import memorization_build
from trainer_fixtures import make_config, tiny_model_dir

NOTE = ("no CUDA GPU: the cpu profile (configs/defaults.yaml cpu:) trains 512-token windows of the 2048-token "
        "blocks, 1 step (--max-steps) of 1 sequence(s), evaluation on 1 batch(es) of 2, end-of-run answers within 768 "
        "tokens a model; cpu.enabled: false trains the full config")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-step sql run (text=True below reads a bar's \r as a new line)."""
    from packtrain.trainer.run.train import run

    root = tmp_path_factory.mktemp("console")
    model_dir = tiny_model_dir(root / "model")
    memorization_build(root / "cache", model_dir, expert="sql")
    return run(make_config(model_dir, root / "runs", max_steps=2, max_new_tokens=4, plots=False, sample_prompts=0),
               root / "cache")


def evaluate(run_dir: Path, *options: str) -> subprocess.CompletedProcess:
    """`packtrain [options] eval` in a real process, as a user's log file gets it."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONWARNINGS", "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS", "PACKTRAIN_VERBOSE")}
    return subprocess.run([sys.executable, "-m", "packtrain.cli", *options, "eval", "sql", "--run", str(run_dir),
                           "--max-examples", "1"], capture_output=True, text=True, env=env)


def test_eval_prints_its_own_lines_only_and_verbose_keeps_the_libraries(finished, tmp_path):
    quiet = evaluate(shutil.copytree(finished, tmp_path / "quiet"))
    assert quiet.returncode == 0, quiet.stderr
    assert "Loading weights" not in quiet.stderr and "%|" not in quiet.stderr and "Warning" not in quiet.stderr
    build_id = json.loads((tmp_path / "quiet" / "run.json").read_text())["build_id"]
    first = quiet.stderr.splitlines()[0]  # the first line is ours
    assert first[first.index(" INFO ") + 6:] == (f"task eval of {tmp_path / 'quiet'}: 1 validation prompts of build "
                                                 f"{build_id} on cpu")
    said = [line[line.index(" INFO ") + 6:] for line in quiet.stderr.splitlines() if " INFO " in line]
    assert said[1].startswith("torch threads: ")  # chosen for this machine (trainer/threads.py), said once
    assert [line.rsplit(" in ", 1)[0] for line in said if line.startswith("task eval, ")] == [
        "task eval, base model: 1 prompt to do", "task eval, base model: 1/1 prompt",
        "task eval, adapter: 1 prompt to do", "task eval, adapter: 1/1 prompt"]  # off a terminal: lines, no bars

    verbose = evaluate(shutil.copytree(finished, tmp_path / "verbose"), "--verbose")
    assert verbose.returncode == 0, verbose.stderr
    assert "Loading weights: 100%|" in verbose.stderr
    assert "FutureWarning: `is_gradient_checkpointing` is deprecated" in verbose.stderr


def test_the_cpu_note_is_said_once_when_training_begins(hf_home, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, whatever this machine has
    cache, runs = tmp_path / "cache", tmp_path / "runs"

    def invoke(*args):
        return CliRunner().invoke(main, [*args, "--cache-dir", str(cache)])

    shown = invoke("config", "sql")  # the config as written on stdout; the profile's changes on stderr (test_cpu_profile.py)
    assert shown.exit_code == 0 and "cpu profile" not in shown.stdout and "no CUDA" not in shown.stdout
    refused = invoke("train", "sql")  # no build yet: the refusal alone
    assert refused.exit_code == 1 and refused.output == ""
    assert str(refused.exception).startswith("no build for expert 'sql' in ")

    assert invoke("pretokenize", "sql", "--num-proc", "1").exit_code == 0
    trained = invoke("train", "sql", "--max-steps", "1", "--set", f"train.output_dir={runs}",
                     "--set", "train.dataloader_num_workers=0")
    assert trained.exit_code == 0, trained.output
    said = [record.getMessage() for record in caplog.records]
    assert [line for line in said if "cpu profile" in line] == [NOTE] and "cpu profile" not in trained.output
    assert "match the manifest's sha256" in said[said.index(NOTE) + 1]  # once the build is found and checked


@pytest.mark.parametrize("verbose", [False, True])
def test_a_librarys_records_below_error_reach_no_console_and_packtrains_always_do(verbose, capsys, monkeypatch):
    """The rule, not a list of messages: any library's warning (here kernels' trust-check line of
    kernels 0.19, and one from a library nobody has seen yet) is hidden; its errors and every record of
    packtrain's own pass; --verbose shows them all; the last resort is logging's own again afterwards."""
    import logging

    from packtrain.cli.console import library_output

    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # as in a command: pytest's own capture set aside
    before = logging.lastResort
    with library_output(verbose):
        logging.getLogger("kernels._internals.hf_hub").warning(
            "Skipping publisher trust check for 'kernels-community/quantization-bitsandbytes' because Hugging Face "
            "Hub is in offline mode.")
        logging.getLogger("newlib").warning("a library released tomorrow")
        logging.getLogger("newlib").error("a library's error")
        logging.getLogger("packtrain.pipeline").warning("packtrain's own warning")
    assert logging.lastResort is before
    shown = capsys.readouterr().err.splitlines()
    assert shown == (["Skipping publisher trust check for 'kernels-community/quantization-bitsandbytes' because "
                      "Hugging Face Hub is in offline mode.", "a library released tomorrow"] if verbose else []) + [
        "a library's error", "packtrain's own warning"]


def test_make_train_nproc_starts_torchrun_without_its_banner_and_keeps_the_users_threads():
    """`make train NPROC=2`: where OMP_NUM_THREADS is unset, torchrun gives every rank 1 and logs a five-line banner
    saying so on each start (torch/distributed/run.py). The Makefile gives the ranks that 1 itself: the same
    threads, no banner (found 2026-12-07); a value the user set reaches the ranks unchanged. Run here with the
    Makefile's own line, the ranks `printenv OMP_NUM_THREADS` instead of training."""
    from build_fixtures import ROOT

    planned = subprocess.run(["make", "-n", "train", "NPROC=2", "EXPERT=sql"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    line = next(line.strip() for line in planned.splitlines() if "/torchrun " in line)
    launcher, _, options = line.partition(".venv/bin/torchrun ")
    command = f"{launcher}{Path(sys.executable).parent}/torchrun {options.split(' -m ')[0]} --no-python printenv "
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # tests/conftest.py sets it
    started = subprocess.run(["bash", "-c", command + "OMP_NUM_THREADS"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=120)
    assert (started.returncode, started.stdout, started.stderr) == (0, "1\n1\n", "")
    users = subprocess.run(["bash", "-c", launcher + "printenv OMP_NUM_THREADS"], env=dict(env, OMP_NUM_THREADS="3"),
                           capture_output=True, text=True)
    assert users.stdout == "3\n"
