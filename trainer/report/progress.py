"""What the console shows while the trainer works: progress bars on a terminal, plain lines elsewhere.

On a terminal (the console's log stream, stderr, is a TTY) training shows a tqdm bar with its ETA,
loss and tokens/s; evaluation and generation show a bar that goes away when done. Anywhere else
(``nohup``, CI, ``| tee``, ``> train.log 2>&1``) a ``\\r`` bar is noise in a file, so the same
progress comes as log lines (as Hugging Face's Trainer prints its logs dict every ``logging_steps``
whether or not a bar shows)::

    step 10/30: loss 2.3151, lr 1.97e-04, 812 tok/s, data wait 0.2%, 3.1 s/step, ETA 1m02s
    eval at step 10: 8 batches to do
    eval at step 10: 4/8 batches, 12s, ETA 12s
    samples, adapter: 1 prompt to do
    samples, adapter: 1/1 prompt in 41s

The step line goes to ``<run>/train.log`` on a terminal too (the bar says it on the console).
"""

from __future__ import annotations

import logging
import sys
import time

from tqdm import tqdm

from packtrain.trainer.run.runlog import FILE_ONLY

log = logging.getLogger("packtrain.train")


def on_terminal() -> bool:
    """The console's log stream (stderr: trainer/run/runlog.py) is a terminal: bars, not lines."""
    return sys.stderr.isatty()


def format_duration(seconds: float) -> str:
    """A short duration::

        >>> format_duration(7.4), format_duration(125), format_duration(3725)
        ('7s', '2m05s', '1h02m')
    """
    seconds = int(round(max(seconds, 0.0)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def eta_seconds(done: int, total: int, elapsed: float) -> float:
    """Time left at the pace so far::

        >>> eta_seconds(5, 30, 10.0)
        50.0
    """
    return elapsed / max(done, 1) * (total - done)


def step_line(record: dict, total: int, eta: float) -> str:
    """One logged training step (a metrics.jsonl record: trainer/report/metrics.py) as a console line::

        >>> step_line({"step": 10, "loss": 2.31514, "lr": 0.000197, "tok_s": 812.4, "data_wait": 0.0023,
        ...            "step_s": 3.06}, 30, 62.0)
        'step 10/30: loss 2.3151, lr 1.97e-04, 812 tok/s, data wait 0.2%, 3.1 s/step, ETA 1m02s'

    A step whose window held no supervised token (a CPU window of prompt tokens only) has no loss::

        >>> step_line({"step": 1, "loss": None, "lr": 0.0002, "tok_s": 40.2, "data_wait": 0.001, "step_s": 12.5},
        ...           5, 50.0)
        'step 1/5: no supervised token (no loss), lr 2.00e-04, 40 tok/s, data wait 0.1%, 12.5 s/step, ETA 50s'
    """
    return (f"step {record['step']}/{total}: {loss_text(record['loss'])}, lr {record['lr']:.2e}, "
            f"{record['tok_s']:.0f} tok/s, data wait {100 * record['data_wait']:.1f}%, "
            f"{record['step_s']:.1f} s/step, ETA {format_duration(eta)}")


def loss_text(loss: float | None) -> str:
    """``loss 2.3151``, or what a logged step without a supervised token has instead of a loss."""
    return "no supervised token (no loss)" if loss is None else f"loss {loss:.4f}"


class TrainProgress:
    """Training's progress from ``initial`` to ``total`` steps; ``show`` false (ranks other than 0): nothing."""

    def __init__(self, total: int, initial: int, desc: str, show: bool = True):
        self.total, self.initial, self.show = total, initial, show
        self.start = time.perf_counter()
        self.bar = (tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True)
                    if show and on_terminal() else None)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def logged(self, record: dict) -> None:
        """A logged step: its line on the console (the bar's postfix on a terminal) and in train.log."""
        if not self.show:
            return
        eta = eta_seconds(record["step"] - self.initial, self.total - self.initial, time.perf_counter() - self.start)
        line = step_line(record, self.total, eta)
        if self.bar is None:
            log.info(line)
            return
        self.bar.set_postfix(loss="-" if record["loss"] is None else f"{record['loss']:.4f}", tok_s=f"{record['tok_s']:.0f}")
        log.info(line, extra=FILE_ONLY)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def line_marks(total: int, lines: int = 10) -> set[int]:
    """After which units (1-based) a non-terminal console gets a progress line: about every tenth
    of ``total``, always the last::

        >>> sorted(line_marks(3)), sorted(line_marks(25))
        ([1, 2, 3], [3, 5, 8, 10, 13, 15, 18, 20, 23, 25])
    """
    return {-(-total * k // lines) for k in range(1, lines + 1)} | {total} if total > 0 else set()


class Progress:
    """Progress of ``total`` units of some work (``what``: "eval at step 10", "samples, adapter"; ``units``:
    singular and plural, ("batch", "batches")): a bar on a terminal, removed when done; elsewhere a
    log line when it starts and at each of :func:`line_marks`."""

    def __init__(self, what: str, total: int, units: tuple[str, str], show: bool = True):
        self.what, self.total, self.units, self.done = what, total, units, 0
        self.start = time.perf_counter()
        self.marks = line_marks(total) if show else set()
        self.bar = (tqdm(total=total, desc=what, unit=units[0], leave=False, dynamic_ncols=True)
                    if show and on_terminal() else None)
        if show and self.bar is None and total > 0:
            log.info("%s: %s to do", what, self.count(total))  # what runs now, in a log file too

    def count(self, n: int) -> str:
        return f"{n} {self.units[n != 1]}"

    def update(self, n: int = 1) -> None:
        before, self.done = self.done, self.done + n
        if self.bar is not None:
            self.bar.update(n)
            return
        if any(before < mark <= self.done for mark in self.marks):
            elapsed = time.perf_counter() - self.start
            if self.done >= self.total:
                log.info("%s: %d/%s in %s", self.what, self.done, self.count(self.total), format_duration(elapsed))
            else:
                log.info("%s: %d/%s, %s, ETA %s", self.what, self.done, self.count(self.total),
                         format_duration(elapsed), format_duration(eta_seconds(self.done, self.total, elapsed)))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
