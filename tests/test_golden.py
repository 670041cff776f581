"""Golden numbers of a tiny CPU run, pinned at rtol 1e-5 (as torchtune pins its first losses): any
numeric drift in the data order, the loss, the accumulation, the optimizer or the schedule shows here.
When a change is meant to alter them, re-derive them and say why in the commit."""

from __future__ import annotations

import json

import pytest

from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build

LOSSES = [10.062490609975962, 9.38414790712554, 9.379556726526332, 9.610353531376008, 9.447713998647837,
          9.6504541015625]
GRAD_NORMS = [0.5207098722457886, 0.47965380549430847, 0.5308058857917786, 0.5473223924636841,
              0.6457436680793762, 0.436620831489563]
# steps 0 (the base model, evaluated before the first step), 3 and 6
EVAL_LOSSES = [9.719330787658691, 9.716763496398926, 9.715485572814941]


def test_tiny_run_golden_losses(tmp_path):
    model = tiny_model_dir(tmp_path / "model")
    write_build(tmp_path / "cache", "sql", random_blocks(12, 32, 0), random_blocks(3, 32, 1), 32, model)
    run_dir = run(make_config(model, tmp_path / "runs", max_steps=6, eval_steps=3, gradient_accumulation_steps=2),
                  tmp_path / "cache")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r and "eval/loss" not in r]
    assert [r["loss"] for r in train] == pytest.approx(LOSSES, rel=1e-5)
    assert [r["grad_norm"] for r in train] == pytest.approx(GRAD_NORMS, rel=1e-5)
    assert [r["eval/loss"] for r in records if "eval/loss" in r] == pytest.approx(EVAL_LOSSES, rel=1e-5)
