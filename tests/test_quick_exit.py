"""A finished train or eval ends without the interpreter's teardown (packtrain/cli/quick_exit.py): what
exit does that matters still runs, the teardown does not; only the console script does it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import packtrain.cli.commands as commands
from packtrain.cli.quick_exit import QUICK_EXIT

PROGRAM = textwrap.dedent("""
    import atexit, sys, threading
    from pathlib import Path
    from packtrain.cli.quick_exit import exit_now

    out = Path(sys.argv[1])

    class Torn:
        def __del__(self):
            (out / "teardown").write_text("freed")

    kept = Torn()
    atexit.register(lambda: (out / "atexit").write_text("ran"))
    if sys.argv[2] == "thread":  # a non-daemon thread still working: the ordinary exit, which waits for it
        threading.Thread(target=lambda: __import__("time").sleep(0.5) or (out / "thread").write_text("done")).start()
    print("last line", end="")  # no newline: flushed all the same
    exit_now(0)
""")


def run_program(tmp_path, mode: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path), mode], capture_output=True, text=True,
                          timeout=120)
    return done, sorted(p.name for p in tmp_path.iterdir())


def test_exit_now_runs_atexit_and_flushes_but_skips_the_teardown(tmp_path):
    done, written = run_program(tmp_path, "plain")
    assert (done.returncode, done.stdout) == (0, "last line")
    assert written == ["atexit"]  # the object's __del__ (the teardown) never ran


def test_exit_now_waits_for_a_working_thread_with_the_ordinary_exit(tmp_path):
    done, written = run_program(tmp_path, "thread")
    assert (done.returncode, done.stdout) == (0, "last line")
    assert written == ["atexit", "teardown", "thread"]


def test_only_a_command_that_asks_for_it_ends_the_console_script_at_once(monkeypatch):
    ended = []
    monkeypatch.setattr(commands, "exit_now", ended.append)
    for returned in (QUICK_EXIT, None, 0):
        monkeypatch.setattr(commands, "main", lambda standalone_mode, value=returned: value)
        commands.script()
    assert ended == [0]
