"""The real command line run in the test's own process, for the tests that train or build through it.

A subprocess (``python -m packtrain.cli``) would add only the import of torch, transformers and peft
to each call: 5 s on a quiet 2-core box, 30 s under load. Tests about what a separate process sees
(exit on a signal, torchrun, the console's environment) keep their subprocesses.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# No samples and no plots at the end of a run: the tests that train through the CLI are about what
# runs and what it writes, not about the samples (tests/test_train_after_eval.py) or the plots
# (tests/test_plots.py), which cost a CPU run more time than its steps.
QUICK_END = ["--set", "train.sample_prompts=0", "--set", "train.plots=false"]


class Terminal(io.StringIO):
    """A stdin that says it is a terminal (``isatty``), typed ahead."""

    def isatty(self) -> bool:
        return True


def cli(*args, stdin: str = "", tty: bool = False) -> subprocess.CompletedProcess:
    """``packtrain ARGS`` through its real entry point (``packtrain.cli.commands.run``, what
    ``python -m packtrain.cli`` runs), from the repository root, reading ``stdin`` (``tty``: as if typed
    at a terminal): its exit code, stdout and stderr. sys.argv, sys.stdin, the working directory and
    os.environ are as they were afterwards."""
    from packtrain.cli.commands import run as entry_point

    argv, environ, cwd, stdin_was = sys.argv, dict(os.environ), os.getcwd(), sys.stdin
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["packtrain", *map(str, args)]
    sys.stdin = Terminal(stdin) if tty else io.StringIO(stdin)
    os.chdir(ROOT)
    code = 0
    try:
        with redirect_stdout(out), redirect_stderr(err):
            entry_point()
    except SystemExit as e:
        code = e.code or 0
    finally:
        sys.argv, sys.stdin = argv, stdin_was
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())
