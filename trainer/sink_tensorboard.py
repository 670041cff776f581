"""``train.report_to: tensorboard``: every metrics line also goes to TensorBoard event files in
``<run>/tensorboard/`` (trainer/sinks.py): every numeric field a scalar at its step (``loss``,
``tok_s``, ``eval/loss``, ``mem/peak_gib``...). Needs the ``tensorboard`` package
(``pip install 'packtrain[tensorboard]'``). The event files are in the run directory: a full disk there
is one line that stops the run (core/diskfull.py), as for metrics.jsonl.
"""

from __future__ import annotations

from pathlib import Path

from packtrain.core.diskfull import written
from packtrain.core.rundir import RUN_DISK_FULL_FIX

TENSORBOARD_DIR = "tensorboard"


class TensorBoardSink:
    """A torch ``SummaryWriter`` on ``<run>/tensorboard/``."""

    def __init__(self, run_dir: Path):
        self.where = run_dir / TENSORBOARD_DIR

    def writing(self) -> written:
        """Every write to the event files: a full disk is one line (core/diskfull.py)."""
        return written(self.where, "the TensorBoard event file", RUN_DISK_FULL_FIX)

    def start(self, config: dict) -> None:
        from torch.utils.tensorboard import SummaryWriter

        with self.writing():
            self.writer = SummaryWriter(log_dir=str(self.where))

    def log(self, metrics: dict[str, float], step: int) -> None:
        with self.writing():
            for key, value in metrics.items():
                self.writer.add_scalar(key, value, step)

    def finish(self, status: str) -> None:
        with self.writing():
            self.writer.close()
