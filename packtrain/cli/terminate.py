"""SIGTERM stops a build as Ctrl-C does (``pretokenize``, ``merge-parts``, ``rebuild``): what the build was
writing is removed and its workers stopped before the process exits, with one line and code 143 (128 +
SIGTERM), as a shell reports a command SIGTERM ended. Its default action ended the process at once, leaving
its temporary files for the next build to remove and saying nothing. A second SIGTERM ends it at once.
Training has its own answer (trainer/run/interrupts.py: a checkpoint first)."""

from __future__ import annotations

import functools
import signal
import threading

STOPPED = "stopped by SIGTERM: what this build had written is removed (the last finished build is kept)"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the build's process is: every clean-up Ctrl-C runs, runs (click turns it into
    an Abort whose cause it is; packtrain/cli/commands.py ``run`` prints :data:`STOPPED` and exits 143)."""


def _raise_terminated(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM: at once
    raise Terminated()


def stops_on_sigterm(command):
    """Run ``command`` (a click command's function) with SIGTERM raising :class:`Terminated`; the handler
    before is set again after it."""
    @functools.wraps(command)
    def wrapped(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():  # no handler can be set there
            return command(*args, **kwargs)
        before = signal.signal(signal.SIGTERM, _raise_terminated)
        try:
            return command(*args, **kwargs)
        finally:
            signal.signal(signal.SIGTERM, before)

    return wrapped
