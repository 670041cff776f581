"""Forced crash points for the reliability tests.

``PACKTRAIN_CRASH_AT=<name>`` makes the build kill itself with SIGKILL when it reaches
``crash_point("<name>")``: a real, unclean death at an exact moment (mid shard, after the
manifest, after the rename, during cleanup, ...), which tests/test_reliability_build.py uses to
prove that CURRENT always names a complete build. Unset, it costs one dictionary look-up.
"""

from __future__ import annotations

import os
import signal


def crash_point(name: str) -> None:
    """Kill this process with SIGKILL here when ``PACKTRAIN_CRASH_AT`` is ``name``; or, when
    ``PACKTRAIN_INTERRUPT_AT`` is ``name``, send SIGINT to the whole process group, as Ctrl-C in a
    terminal does (workers included; run such a test in its own session)."""
    if os.environ.get("PACKTRAIN_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("PACKTRAIN_INTERRUPT_AT") == name:
        os.killpg(os.getpgrp(), signal.SIGINT)
