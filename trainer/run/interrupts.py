"""Ctrl-C and SIGTERM while training, and the time-bounded save cadence: nothing trained is lost.

- The first SIGINT (Ctrl-C) or SIGTERM (SLURM's or Kubernetes' pre-emption) only asks the run to stop
  (:class:`StopRequests`, said in one line); the loop looks after each optimizer step, saves a checkpoint
  there and raises :class:`packtrain.core.errors.Interrupted`: the CLI says where the checkpoint is and how
  to resume, and exits 130 (SIGINT) or 143 (SIGTERM).
- A second signal of the same kind stops at once, saving nothing more: SIGINT raises KeyboardInterrupt (the
  CLI's ``aborted``, 130), SIGTERM ends the process by its default action (143). A signal of the other kind
  (torchrun answers a Ctrl-C by sending SIGTERM to its ranks) does not: the stop already asked goes on.
- :class:`SaveClock`: ``train.save_steps: auto`` saves every ``train.save_minutes`` minutes (and at the
  last step), so a killed run (SIGKILL, a crash, power) loses a bounded time of training.

Under torchrun the ranks get their signals at different moments, and their clocks differ: the loop sums
both flags over the ranks after each step (trainer/loop.py ``stop_or_save``), so every rank stops, and
saves, after the same step.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

log = logging.getLogger("packtrain.train")

SIGNALS = (signal.SIGINT, signal.SIGTERM)
NAMES = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM"}


class StopRequests:
    """A context manager that catches SIGINT and SIGTERM while the loop runs (in the main thread only: Python
    runs signal handlers there); ``signum`` is the first signal received (None: none). The former handlers
    are back on exit, so the end of the run (samples, task eval) is interrupted as before."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._former: dict[int, object] = {}

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._former[signum] = signal.signal(signum, self._received)
        return self

    def __exit__(self, *exc) -> None:
        for signum, former in self._former.items():
            signal.signal(signum, former)
        self._former.clear()

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _received(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum = signum
            again = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
            log.warning("%s: saving a checkpoint at the end of this step, then stopping (%s again: stop at once, "
                        "saving nothing more)", NAMES[signum], again)
            return
        if signum != self.signum:  # torchrun's SIGTERM after the terminal's SIGINT: the stop goes on
            log.warning("%s: already stopping after this step (%s)", NAMES[signum], NAMES[self.signum])
            return
        signal.signal(signum, signal.SIG_DFL)  # the second one: at once, nothing more saved
        log.warning("%s again: stopping at once, saving nothing more", NAMES[signum])
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        os.kill(os.getpid(), signum)


class SaveClock:
    """When a time-based save is due: ``minutes`` after the last save (or the start); None: never."""

    def __init__(self, minutes: float | None) -> None:
        self.seconds = None if minutes is None else minutes * 60
        self.last = time.monotonic()

    def due(self) -> bool:
        return self.seconds is not None and time.monotonic() - self.last >= self.seconds

    def saved(self) -> None:
        self.last = time.monotonic()
