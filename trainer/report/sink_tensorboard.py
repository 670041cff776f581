"""``train.report_to: tensorboard``: every metrics line also goes to TensorBoard event files in
``<run>/tensorboard/`` (trainer/report/sinks.py): every numeric field a scalar at its step (``loss``,
``tok_s``, ``eval/loss``, ``mem/peak_gib``...), and the resolved config as text (``config``). Needs
the ``tensorboard`` package (``pip install 'packtrain[tensorboard]'``). The event files are in the run directory: a full disk there
is one line that stops the run (core/diskfull.py), as for metrics.jsonl. A resumed run writes a new
event file beside the earlier ones that purges the steps after its checkpoint (``purge_step``), so
TensorBoard shows each step once, as metrics.jsonl has it.
"""

from __future__ import annotations

import json
from pathlib import Path

from packtrain.core.diskfull import written
from packtrain.core.rundir import RUN_DISK_FULL_FIX

TENSORBOARD_DIR = "tensorboard"


class TensorBoardSink:
    """A torch ``SummaryWriter`` on ``<run>/tensorboard/``."""

    def __init__(self, run_dir: Path, resumed_at: int | None = None):
        self.where, self.resumed_at = run_dir / TENSORBOARD_DIR, resumed_at
        self.writer = None  # until start

    def writing(self) -> written:
        """Every write to the event files: a full disk is one line (core/diskfull.py)."""
        return written(self.where, "the TensorBoard event file", RUN_DISK_FULL_FIX)

    def start(self, config: dict) -> None:
        from torch.utils.tensorboard import SummaryWriter

        with self.writing():
            # a resumed run: the steps its earlier part logged after the checkpoint are purged (hidden by
            # TensorBoard's readers), as metrics.jsonl is cut back to the checkpoint's step
            purge = None if self.resumed_at is None else self.resumed_at + 1
            self.writer = SummaryWriter(log_dir=str(self.where), purge_step=purge)
            # the resolved config as text (the TEXT tab), as HF's TensorBoardCallback logs its args
            self.writer.add_text("config", f"```json\n{json.dumps(config, indent=2, sort_keys=True)}\n```", 0)

    def log(self, metrics: dict[str, float], step: int) -> None:
        with self.writing():
            for key, value in metrics.items():
                self.writer.add_scalar(key, value, step)

    def finish(self, status: str) -> None:
        if self.writer is None:  # its start failed: nothing to close
            return
        with self.writing():
            self.writer.close()
