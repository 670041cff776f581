"""Issue 23, item 2, end to end on a real small tmpfs (mounted in an unprivileged user + mount
namespace, ``unshare -rm``; skipped with the reason where that is not allowed): what the libraries
raise on a full disk, and the real CLI whose checkpoint-2 does not fit, then ``--resume auto``. The
cases on ``/dev/full``: tests/test_reliability_disk_full.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_reliability_disk_full import FREE, SAFETENSORS_FULL
from trainer_fixtures import random_blocks, tiny_model_dir, write_build

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


# End to end, on a real small tmpfs: the real CLI, checkpoint-2 does not fit, then --resume auto

NAMESPACE_TMPFS = ["unshare", "-rm", "sh", "-c", 'mount -t tmpfs -o size=$0 tmpfs "$1" && shift && exec "$@"']


def in_tmpfs(disk: Path, size: str, *command: str) -> subprocess.CompletedProcess:
    """``command`` with a ``size`` tmpfs mounted on ``disk`` (seen only by it: its own mount namespace)."""
    return subprocess.run([*NAMESPACE_TMPFS, size, str(disk), *command], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture
def tmpfs_disk(tmp_path) -> Path:
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("unshare") is None:
        pytest.skip("no unshare command: the tmpfs cases need an unprivileged user + mount namespace")
    probe = in_tmpfs(disk, "64k", "sh", "-c", f'touch "{disk}/x"')
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here ({probe.stderr.strip()}): the /dev/full cases "
                    "cover the behaviour")
    return disk


LIBRARY_SCRIPT = """
import json, os, sys
import numpy as np, torch
from safetensors.torch import save_file
from packtrain.core.diskfull import is_disk_full
disk = sys.argv[1]
open(f"{disk}/filler", "wb").write(b"0" * (1 << 20))  # 1 MiB of the 2 MiB: 1 MiB left, part of each write
found = {}
for name, write in [("safetensors", lambda: save_file({"w": torch.zeros(1 << 19)}, f"{disk}/a.safetensors")),
                    ("torch", lambda: torch.save({"w": torch.zeros(1 << 19)}, f"{disk}/a.pt")),
                    ("numpy", lambda: np.save(f"{disk}/a.npy", np.zeros(1 << 18)))]:
    try:
        write()
        found[name] = "no error"
    except Exception as e:
        found[name] = [type(e).__name__, str(e), is_disk_full(e)]
    for partial in os.listdir(disk):  # what the failed write left: 1 MiB free again for the next one
        if partial != "filler":
            os.remove(f"{disk}/{partial}")
print(json.dumps(found))
"""


def test_the_library_errors_on_a_real_full_tmpfs(tmp_path, tmpfs_disk):
    result = in_tmpfs(tmpfs_disk, "2m", sys.executable, "-c", LIBRARY_SCRIPT, str(tmpfs_disk))
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.splitlines()[-1])
    assert found["safetensors"] == ["SafetensorError", SAFETENSORS_FULL, True]
    assert found["torch"][0] == "RuntimeError" and "unexpected pos" in found["torch"][1] and found["torch"][2]
    assert found["numpy"][0] == "OSError" and re.fullmatch(r"\d+ requested and \d+ written", found["numpy"][1])
    assert found["numpy"][2]


CLI_SCRIPT = """
import os, shutil, sys
import packtrain.trainer.loop
from packtrain.cli.commands import run
disk, out, args = sys.argv[1], sys.argv[2], sys.argv[3:]
real = packtrain.trainer.loop.save_checkpoint

def save_then_fill(run_info, state, *a, **k):  # after checkpoint-1: 200 KiB left, less than a checkpoint
    path = real(run_info, state, *a, **k)
    if state.step == 1:
        with open(f"{disk}/filler", "wb") as f:
            f.write(b"0" * (shutil.disk_usage(disk).free - (200 << 10)))
    return path

packtrain.trainer.loop.save_checkpoint = save_then_fill
for name, extra in (("full", []), ("resumed", ["--resume", "auto"])):
    sys.stderr.flush()
    with open(f"{out}/{name}.err", "w") as log:
        os.dup2(log.fileno(), 2)
        sys.argv = ["packtrain", *args, *extra]
        try:
            run()
            code = 0
        except SystemExit as e:
            code = e.code
        sys.stderr.flush()
    open(f"{out}/{name}.code", "w").write(str(code))
    open(f"{out}/{name}.listing", "w").write("\\n".join(sorted(os.listdir(f"{disk}/runs/sql/r"))))
    if os.path.exists(f"{disk}/filler"):
        os.remove(f"{disk}/filler")  # space again
        packtrain.trainer.loop.save_checkpoint = real
"""


def test_the_cli_on_a_real_full_tmpfs_then_resume_auto(tmp_path, tmpfs_disk, model_dir):
    """checkpoint-2 cannot fit: the real CLI exits 2 with one line (no traceback), the partial
    checkpoint is gone; once space is freed, --resume auto continues from checkpoint-1 and finishes."""
    write_build(tmp_path / "cache", "sql", random_blocks(12, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    out = tmp_path / "out"
    out.mkdir()
    result = in_tmpfs(tmpfs_disk, "6m", sys.executable, "-c", CLI_SCRIPT, str(tmpfs_disk), str(out),
                      "train", "sql", "--model", str(model_dir), "--cache-dir", str(tmp_path / "cache"),
                      "--max-steps", "3", "--set", f"train.output_dir={tmpfs_disk / 'runs'}",
                      "--set", "train.dataloader_num_workers=0", "--set", "train.save_steps=1",
                      "--set", "train.run_name=r", "--set", "train.plots=false")
    assert result.returncode == 0, result.stderr[-3000:]
    read = lambda name: (out / name).read_text()  # noqa: E731
    stderr = read("full.err")
    assert read("full.code") == "2" and "Traceback" not in stderr, stderr[-3000:]
    run_dir = tmpfs_disk / "runs" / "sql" / "r"
    last = stderr.rstrip("\n").split("\n")[-1]
    assert re.fullmatch(rf"error: no space left on the device of {run_dir / 'checkpoint-2'} {FREE} while writing "
                        rf"checkpoint-2 of run {run_dir}: the partial files were removed; free space \(or set "
                        r"train.output_dir elsewhere\) and continue with --resume auto", last), stderr[-3000:]
    assert [line for line in stderr.splitlines() if line.startswith("error:")] == [last]
    assert stderr.count("no space left") == 1  # said once: "run failed" goes to train.log only
    assert read("full.listing").split() == ["checkpoint-1", "config.json", "metrics.jsonl", "run.json", "train.log"]
    assert read("resumed.code") == "0", read("resumed.err")[-3000:]
    assert "resumed from" in read("resumed.err") and "checkpoint-1" in read("resumed.err")
    assert read("resumed.listing").split() == ["adapter", "checkpoint-1", "checkpoint-2", "checkpoint-3",
                                               "config.json", "metrics.jsonl", "run.json", "summary.json", "train.log"]
    print(last)


BUILD_SCRIPT = """
import os, sys
from packtrain.cli.commands import run
cache, args = sys.argv[1], sys.argv[2:]
sys.argv = ["packtrain", *args]
try:
    run()
    code = 0
except SystemExit as e:
    code = e.code
sys.stderr.flush()
print("EXIT", code, sorted(os.path.relpath(os.path.join(d, f), cache) for d, _, fs in os.walk(cache) for f in fs))
"""


def test_a_build_whose_workers_fill_a_real_tmpfs(tmp_path, tmpfs_disk):
    """Two workers write their batches' tokens into the spill (pipeline/pack/spill.py) on a 256 KiB tmpfs
    that cannot hold them: the CLI exits 2 with one line, and no partial file is left on it."""
    from build_fixtures import make_project, rows, write_jsonl

    project = make_project(tmp_path, decided=False)
    write_jsonl(project["data"], rows(3000))
    result = in_tmpfs(tmpfs_disk, "256k", sys.executable, "-c", BUILD_SCRIPT, str(tmpfs_disk / "cache"),
                      "pretokenize", "sql", "--configs-dir", str(project["configs"]), "--cache-dir",
                      str(tmpfs_disk / "cache"), "--num-proc", "2", "--no-progress", "--set", "build.batch_rows=64")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.match(r"error: no space left on the device of .*/cache/sql .*CURRENT is unchanged",
                                         errors[0]), result.stderr[-3000:]
    code, files = result.stdout.splitlines()[-1].split(" ", 2)[1:]
    planned = r"sql/(\.lock|\.stat-cache\.json|\.sources/\.tokenizer-facts/\w+\.json)"  # the lock, what planning noted
    assert code == "2" and [f for f in eval(files) if not re.fullmatch(planned, f)] == [], files  # no spill, no batch file
