"""bench/train_bench.py's contenders run to a result on CPU (tiny model, two steps each).

The bench is how every training-speed figure in docs/BENCHMARKS.md is made, and it runs on a GPU
only when a session is lent one: on 2026-11-27 two of its contenders had been failing since a
refactor (``hf`` read ``manifest.raw``, which the typed Manifest no longer has; ``packtrain-auto``
set the accumulation beside ``auto``, a config error), found only on the GPU. This catches that
class here. hf-compile (a CPU compile, ~40 s) and trl (installed by ``make bench`` only) are left out, and
``packtrain`` (``packtrain-auto`` runs its code with the micro-batch chosen: 9 CPU s a contender).
Each contender trains blocks of 256 tokens (``--block-size``: every code path is the one 2048 runs), on
a build whose fast-encoder decision is the run's shared one (build_fixtures.bundled_cache: the decision
is not what this tests); with 2048 and the decision proved here the test cost 70 CPU seconds, now 41
(2026-12-06).
(bench/gpu_levers.py, run 2's levers, had the same ``auto`` error; ``train_bench.py --set`` runs its overrides
now, checked against the config schema by the dry run: tests/test_gpu_report_dry_run.py.)
"""
import json
import os
import subprocess
import sys
from pathlib import Path

from build_fixtures import bundled_cache

ROOT = Path(__file__).resolve().parents[1]


def test_every_contender_runs_to_a_result_on_cpu(tmp_path):
    out = tmp_path / "bench.json"
    bundled_cache(tmp_path / "work" / "cache")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "train_bench.py"), "--arch", "tiny", "--steps", "2", "--batch-size", "1",
         "--grad-accum", "2", "--block-size", "256", "--threads", "1", "--contenders", "packtrain-auto,hf,before",
         "--work-dir", str(tmp_path / "work"), "--json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    results = json.loads(out.read_text())["results"]
    assert sorted(results) == ["before", "hf", "packtrain-auto"]
    for contender, result in results.items():
        assert "skipped" not in result, (contender, result)
        assert result["tok_s"] > 0 and result["steps_timed"] == 1, (contender, result)
    # auto on CPU: the largest divisor of the global batch (2 blocks) up to 8; the peers as given
    assert [results[c]["micro"] for c in ("packtrain-auto", "hf", "before")] == [2, 1, 1]
    assert "[hf] " in proc.stdout  # each contender's output streamed, prefixed with its name
    assert "sequences of 256;" in proc.stdout and " train blocks of 256 tokens, " in proc.stdout


def test_a_contender_that_runs_out_of_its_limit_is_killed_and_the_bench_goes_on(tmp_path):
    """A hanging contender hung the whole bench (no per-contender limit; only gpu_report's outer
    `timeout` ended it, losing the contenders after it): --contender-limit kills its process group
    (its loader and compile workers too) and reports it."""
    sys.path.insert(0, str(ROOT))
    from bench.train_bench import run_streamed

    marker = tmp_path / "child-alive"
    grandchild = tmp_path / "grandchild.py"
    grandchild.write_text(f"import pathlib, time\ntime.sleep(3)\npathlib.Path({str(marker)!r}).touch()\n")
    script = tmp_path / "contender.py"
    script.write_text(f"import subprocess, sys, time\nprint('started', flush=True)\n"
                      f"subprocess.Popen([sys.executable, {str(grandchild)!r}])\ntime.sleep(60)\n")
    code, tail = run_streamed([sys.executable, str(script)], dict(os.environ), "slow", limit=1.5)
    assert code is None and tail == ["started"]
    code, tail = run_streamed([sys.executable, "-c", "print('done')"], dict(os.environ), "quick", limit=30)
    assert code == 0 and tail == ["done"]
    import time

    time.sleep(3)
    assert not marker.exists()  # the contender's own child was killed with it


def test_a_contender_never_outlives_the_bench(tmp_path):
    """The contender runs in its own process group (so a limit can kill it whole), which SIGTERM from
    `timeout` (gpu_report.sh) and the terminal's Ctrl-C no longer reach: the bench kills it when it
    ends (found by an attack on 2026-11-27: a killed bench left its contender holding the GPU)."""
    import signal
    import time

    pidfile = tmp_path / "contender.pid"
    script = tmp_path / "contender.py"
    script.write_text(f"import os, pathlib, time\npathlib.Path({str(pidfile)!r}).write_text(str(os.getpid()))\n"
                      "print('started', flush=True)\ntime.sleep(60)\n")
    driver = tmp_path / "driver.py"
    driver.write_text(f"import signal, sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom bench.train_bench import run_streamed\n"
                      "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
                      f"run_streamed([sys.executable, {str(script)!r}], {{}}, 'slow')\n")
    for sig in (signal.SIGTERM, signal.SIGINT):
        pidfile.unlink(missing_ok=True)
        bench = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, text=True)
        assert bench.stdout.readline().strip() == "[slow] started"
        bench.send_signal(sig)
        bench.wait(timeout=180)  # a guard against a hang, not a time bound: a loaded machine takes its time
        pid = int(pidfile.read_text())
        for _ in range(50):  # killed at once; reaped by init
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the contender outlived the bench ({sig.name})")


def test_a_contender_limit_must_be_positive():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "train_bench.py"), "--contender-limit", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "must be a number of seconds above 0, got 0" in proc.stderr
