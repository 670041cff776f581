"""Experiment sets: several experts built and trained by one command."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from packtrain.cli.train_all import expert_command, train_all
from build_fixtures import bundled_cache
from inprocess_cli import QUICK_END, cli

ROOT = Path(__file__).resolve().parents[1]


def test_train_all_runs_each_expert_and_reports_failures(hf_home, tmp_path):
    configs = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", configs)
    (configs / "broken.yaml").write_text("sources:\n  - name: nobody/nothing\n")
    runs = tmp_path / "runs"
    settings = ["--set", f"train.output_dir={runs}", "--set", "train.per_device_train_batch_size=1",
                "--set", "train.max_eval_batches=1", "--set", "train.dataloader_num_workers=0",
                "--set", "build.num_proc=1", *QUICK_END]
    # train-all itself in this process (its experts still run as their own commands, one after another:
    # the one that fails first, then one that trains)
    proc = cli("train-all", "broken", "sql", "--configs-dir", configs, "--cache-dir", bundled_cache(tmp_path / "cache"),
               "--max-steps", "1", "--log-dir", tmp_path / "logs", *settings)
    assert proc.returncode == 1, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(line["expert"], line["exit"]) for line in lines] == [("broken", 2), ("sql", 0)]
    assert all(line["gpu"] is None for line in lines)  # no GPU: one after another
    assert "nobody/nothing" in (tmp_path / "logs" / "broken.log").read_text()
    (run_dir,) = (runs / "sql").iterdir()
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert not (runs / "broken").exists()


def test_one_expert_per_gpu_slot(tmp_path, monkeypatch):
    """With 2 GPUs, two experts run at once, each pinned to its own GPU."""
    import packtrain.cli.train_all

    script = "import os, time; print(os.environ.get('CUDA_VISIBLE_DEVICES')); time.sleep(0.5)"
    monkeypatch.setattr(packtrain.cli.train_all, "expert_command", lambda e, b, t: [sys.executable, "-c", script])
    lines = []
    code = train_all(["a", "b", "c"], [], [], tmp_path, ["0", "1"], emit=lambda line: lines.append(json.loads(line)))
    assert code == 0
    gpus = {line["expert"]: line["gpu"] for line in lines}
    assert gpus["a"] == 0 and gpus["b"] == 1 and gpus["c"] in (0, 1)
    assert (tmp_path / "a.log").read_text().strip() == "0" and (tmp_path / "b.log").read_text().strip() == "1"


def test_the_expert_command_builds_then_trains():
    command = expert_command("sql", ["--cache-dir", "c d"], ["--max-steps", "2"])
    assert command[:2] == ["/bin/sh", "-c"]
    assert "prepare-model" not in command[2]  # pretokenize converts the embedded model itself
    assert "pretokenize sql --cache-dir 'c d' --no-progress && " in command[2]
    assert command[2].endswith("train sql --max-steps 2")


def test_train_all_refuses_duplicates_and_escaping_names(tmp_path):
    import pytest

    from packtrain.core.contract import ContractError

    twice = subprocess.run([sys.executable, "-m", "packtrain.cli", "train-all", "sql", "sql"], cwd=ROOT,
                           capture_output=True, text=True)
    assert twice.returncode == 2 and "an expert is listed twice" in twice.stderr
    with pytest.raises(ContractError, match="invalid expert name"):
        train_all(["../x"], [], [], tmp_path / "logs", [], emit=print)
    assert not (tmp_path / "logs").exists() and not (tmp_path / "x.log").exists()
