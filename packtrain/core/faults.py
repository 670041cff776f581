"""Forced crash points for the reliability tests.

``PACKTRAIN_CRASH_AT=<name>`` makes the build kill itself with SIGKILL when it reaches
``crash_point("<name>")``: a real, unclean death at an exact moment (mid shard, after the
manifest, after the rename, during cleanup, ...), which tests/test_reliability_build.py uses to
prove that CURRENT always names a complete build. Unset, it costs one dictionary look-up.

``PACKTRAIN_CRASH_ONCE=<file>`` (with ``PACKTRAIN_CRASH_AT``): only the first process to reach the
point dies (it creates ``<file>`` first); a later one, such as a retry of a killed Ray task
(tests/test_ray_build.py), passes.
"""

from __future__ import annotations

import os
import signal

CRASH_VARIABLES = ("PACKTRAIN_CRASH_AT", "PACKTRAIN_CRASH_ONCE")  # what a Ray task is given (pipeline/orchestrate/ray_build.py)


def crash_point(name: str) -> None:
    """Kill this process with SIGKILL here when ``PACKTRAIN_CRASH_AT`` is ``name`` (once, with
    ``PACKTRAIN_CRASH_ONCE``); or, when ``PACKTRAIN_INTERRUPT_AT`` is ``name``, send SIGINT to the
    whole process group, as Ctrl-C in a terminal does (workers included; run such a test in its own
    session), or the signal ``PACKTRAIN_INTERRUPT_WITH`` names (SIGTERM: as systemd stops a service)."""
    if os.environ.get("PACKTRAIN_CRASH_AT") == name and _first_to_crash():
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("PACKTRAIN_INTERRUPT_AT") == name:
        os.killpg(os.getpgrp(), signal.Signals[os.environ.get("PACKTRAIN_INTERRUPT_WITH", "SIGINT")])


def _first_to_crash() -> bool:
    once = os.environ.get("PACKTRAIN_CRASH_ONCE")
    if not once:
        return True
    try:
        os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
