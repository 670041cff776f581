"""The end of a finished ``train`` or ``eval`` without the interpreter's teardown.

After its last line such a command has loaded torch, transformers and peft; Python's own exit then
frees every module and object one by one, which on the loaded 2-core CPU machine took 8-11 s after the
final JSON line of a 5-step try (docs/benchmarks-history.md, "A 5-step try on Spider: ... start-up and
exit"). Nothing is left to write by then: what exit does that matters runs here (non-daemon threads
waited for, the ``atexit`` handlers: logging's flush, multiprocessing's joins, weakref finalizers, the
report_to sinks'; stdout and stderr flushed), then the process ends with ``os._exit``, as the build's fork
server does. Only the console script does this (``packtrain = packtrain.cli.commands:script``): a caller
of :func:`packtrain.cli.commands.run` in its own process (the tests, ``python -m packtrain.cli`` under
torchrun) keeps the ordinary exit.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

QUICK_EXIT = "quick-exit"
"""What a command returns to end the process with :func:`exit_now` once it finished (the console script)."""


def others_running() -> bool:
    """Whether a thread other than the main one and not a daemon is alive (Python's exit would wait for it)."""
    return any(t is not threading.main_thread() and not t.daemon and t.is_alive() for t in threading.enumerate())


def exit_now(code: int = 0) -> None:
    """End the process with ``code`` after what exit does that matters; with a non-daemon thread
    still running, the ordinary exit (which waits for it) instead."""
    if others_running():
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
