"""``train.report_to: wandb``: the run on Weights & Biases (trainer/report/sinks.py), through the ``wandb``
library (``pip install 'packtrain[wandb]'``), as HF's ``WandbCallback`` does it.

- ``WANDB_PROJECT`` names the project (default ``packtrain``); ``WANDB_MODE`` (``offline``,
  ``disabled``), ``WANDB_DIR``, ``WANDB_ENTITY``, ``WANDB_API_KEY`` are read by wandb itself. Without
  ``WANDB_DIR`` the run's wandb files go into the run directory (``<run>/wandb/``).
- The wandb run's name is the run directory's name; its config is the resolved config (config.json).
- Every metrics line is logged at its step, with the same names as in metrics.jsonl.
- The end: exit code 0 (finished), 1 (failed) or 255 (killed: wandb's own code for an interrupt).
- wandb's console capture is off: train.log is the run's log.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PROJECT = "packtrain"
EXIT_CODES = {"finished": 0, "failed": 1, "killed": 255}


class WandbSink:
    """One wandb run per packtrain run."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.run = None  # until start

    def start(self, config: dict) -> None:
        import wandb

        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT, name=self.run_dir.name,
                              config=config, dir=os.environ.get("WANDB_DIR") or str(self.run_dir),
                              settings=wandb.Settings(console="off"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def finish(self, status: str) -> None:
        if self.run is None:  # its start failed: no wandb run to end
            return
        self.run.finish(exit_code=EXIT_CODES[status])
