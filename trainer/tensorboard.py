"""``train.report_to: tensorboard``: every metrics line also goes to TensorBoard, as HF users expect.

``metrics.jsonl`` stays the record (resume cuts it back, the summary and the plots read it); the
event files in ``<run>/tensorboard/`` are a view of it: every numeric field a scalar at its step
(``loss``, ``tok_s``, ``eval/loss``, ``mem/peak_gib``...). Needs the ``tensorboard`` package
(``pip install 'packtrain[tensorboard]'``).
"""

from __future__ import annotations

from pathlib import Path

from packtrain.core.config import ConfigError
from packtrain.core.diskfull import written
from packtrain.core.rundir import RUN_DISK_FULL_FIX

TENSORBOARD_DIR = "tensorboard"


def summary_writer():
    """torch's SummaryWriter class, or a ConfigError saying how to install tensorboard (checked
    before the run starts, so a missing package never costs a run directory)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("train.report_to: tensorboard needs the tensorboard package: "
                          "pip install 'packtrain[tensorboard]', or set train.report_to: none") from None
    return SummaryWriter


class TensorBoardMirror:
    """A metrics file that also writes each record's numbers to a TensorBoard SummaryWriter."""

    def __init__(self, metrics, run_dir: Path):
        self.metrics = metrics
        self.where = run_dir / TENSORBOARD_DIR
        with self.writing():
            self.writer = summary_writer()(log_dir=str(self.where))

    def writing(self) -> written:
        """Every write to the event files: a full disk is one line (core/diskfull.py)."""
        return written(self.where, "the TensorBoard event file", RUN_DISK_FULL_FIX)

    def write(self, record: dict) -> None:
        self.metrics.write(record)
        step = record.get("step", 0)
        with self.writing():
            for key, value in record.items():
                if key not in ("step", "epoch") and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.metrics.close()
        with self.writing():
            self.writer.close()
