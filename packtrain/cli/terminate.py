"""SIGTERM stops a build as Ctrl-C does (``pretokenize``, ``merge-parts``, ``rebuild``): what the build was
writing is removed and its workers stopped before the process exits, with one line and code 143 (128 +
SIGTERM), as a shell reports a command SIGTERM ended. Its default action ended the process at once, leaving
its temporary files for the next build to remove and saying nothing. A second SIGTERM ends it at once.
Training has its own answer while it trains (trainer/run/interrupts.py: a checkpoint first); before its first
step and after its last (loading the model, the step-0 evaluation, the end of the run) ``train`` stops as here,
saying :data:`TRAIN_STOPPED` (before, the process ended without a word, leaving ``.tmp-*`` directories and its
lock file in the run directory: attack 52, 2026-12-06)."""

from __future__ import annotations

import functools
import signal
import threading

STOPPED = "stopped by SIGTERM: what this build had written is removed (the last finished build is kept)"
TRAIN_STOPPED = ("stopped by SIGTERM outside the training steps (loading, evaluating before the first step, or "
                 "ending the run): every checkpoint is kept, and a run whose adapter/ was written is finished; "
                 "resume an unfinished one with --resume auto")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command's process is: every clean-up Ctrl-C runs, runs (click turns it into
    an Abort whose cause it is; packtrain/cli/commands.py ``run`` prints its line, :data:`STOPPED` or
    :data:`TRAIN_STOPPED`, and exits 143)."""


def stops_on_sigterm(command=None, *, line: str = STOPPED):
    """Run ``command`` (a click command's function) with SIGTERM raising :class:`Terminated` (saying ``line``);
    the handler before is set again after it. ``@stops_on_sigterm`` or ``@stops_on_sigterm(line=...)``."""
    if command is None:
        return functools.partial(stops_on_sigterm, line=line)

    def raise_terminated(signum, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM: at once
        raise Terminated(line)

    @functools.wraps(command)
    def wrapped(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():  # no handler can be set there
            return command(*args, **kwargs)
        before = signal.signal(signal.SIGTERM, raise_terminated)
        try:
            return command(*args, **kwargs)
        finally:
            signal.signal(signal.SIGTERM, before)

    return wrapped
