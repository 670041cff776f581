"""The run's log: the ``packtrain.train`` logger, on stderr unless the CLI set logging up, into
``<run>/train.log`` while a run writes there, and on ranks other than 0 only their warnings.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from tqdm import tqdm

from packtrain.core.diskfull import free_space, is_disk_full
from packtrain.trainer.run.distributed import World

log = logging.getLogger("packtrain.train")


FILE_ONLY = {"file_only": True}
"""``extra=`` of a record for train.log only: the console says it otherwise (the failure that ends a
run: the CLI prints it as its one ``error:`` line)."""


class RankFilter(logging.Filter):
    """On ranks other than 0: warnings and errors only, prefixed with the rank."""

    def __init__(self, world: World):
        super().__init__()
        self.rank = world.rank

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return False
        record.msg = f"[rank {self.rank}] {record.msg}"
        return True


class ConsoleHandler(logging.StreamHandler):
    """stderr, where the progress bars are too (trainer/report/progress.py): a line is written on a line of
    its own, the bars cleared first and drawn again below it (a checkpoint's line was glued to the
    training bar's end on a terminal)."""

    def emit(self, record: logging.LogRecord) -> None:
        with tqdm.external_write_mode(file=self.stream):
            super().emit(record)


def ensure_log_handler() -> None:
    """Log to stderr unless the caller (the CLI) configured logging already."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = ConsoleHandler(sys.stderr)
        handler.addFilter(lambda record: not getattr(record, "file_only", False))
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)


class HeldLog(logging.Handler):
    """The run's log lines from before its directory exists (it is created only once nothing can
    refuse any more: trainer/run/train.py), written first into its train.log by :func:`add_file_log`.
    Attached while it lives; ``close()`` detaches it and keeps what it held."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []
        log.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def close(self) -> None:
        log.removeHandler(self)
        super().close()


class RunLogFile(logging.FileHandler):
    """``<run>/train.log``. A line it cannot write for want of space is said once on stderr, in one
    line, instead of logging's traceback for each line; the run goes on (its next checkpoint, metrics
    or final write stops it with one line: core/diskfull.py)."""

    said = False

    def handleError(self, record: logging.LogRecord) -> None:
        if not is_disk_full(sys.exc_info()[1]):
            super().handleError(record)
        elif not self.said:
            self.said = True
            sys.stderr.write(f"warning: no space left on the device of {self.baseFilename} "
                             f"({free_space(self.baseFilename)} free): its log lines are not written\n")

    def close(self) -> None:
        try:
            super().close()
        except OSError as e:  # the lines still buffered cannot be written either
            if not is_disk_full(e):
                raise
            self.handleError(None)


def add_file_log(path: Path, held: HeldLog | None = None) -> logging.Handler:
    """Log into ``path`` from now on, after the lines ``held`` kept (with their own times)."""
    handler = RunLogFile(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    for record in held.records if held is not None else ():
        handler.handle(record)
    log.addHandler(handler)
    return handler
