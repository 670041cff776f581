"""Issue 23, item 2: a full disk is one line for every writer (packtrain/core/diskfull.py).

Every failure here is a real library's real failure on a real full device, without root: the write
is sent to ``/dev/full`` (every write fails with ENOSPC), or made on a small tmpfs mounted in an
unprivileged user + mount namespace (``unshare -rm``; skipped with the reason where that is not
allowed). Only safetensors, which writes through its own temporary file and so cannot be sent to
``/dev/full``, is given the error it raised on the tmpfs (the tmpfs test checks that message is
still what it raises)."""

from __future__ import annotations

import errno
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

import packtrain.core.shardfile
import packtrain.pipeline.pack.spill
import packtrain.trainer.run.checkpoint
from build_fixtures import make_project, rows, write_jsonl
from packtrain.core.configfile import load_config
from packtrain.core.contract import read_current
from packtrain.core.diskfull import DiskFullError, is_disk_full, written
from packtrain.pipeline.orchestrate.build import build
from packtrain.trainer.report.plots import write_run_plots
from packtrain.trainer.run.train import run
from trainer_fixtures import RUN_END, make_config, random_blocks, tiny_model_dir, write_build

ROOT = Path(__file__).resolve().parents[1]
FULL = "/dev/full"
FREE = r"\(\d+(\.\d)? (B|KiB|MiB|GiB|TiB) free\)"
# what safetensors raised on the 6 MB tmpfs (checked again by test_the_library_errors_on_a_real_full_tmpfs)
SAFETENSORS_FULL = "Error while serializing: I/O error: No space left on device (os error 28)"

pytestmark = pytest.mark.skipif(not os.path.exists(FULL), reason="no /dev/full on this system")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def raised(write) -> BaseException:
    with pytest.raises(BaseException) as err:
        write()
    return err.value


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob(".tmp-*"))


def steps_of(run_dir: Path) -> list[int]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in lines if "loss" in r]


# ----------------------------------------------------------------------------------------------
# Recognition: what each library raises on a full device


def arrow_stream(sink):
    schema = pa.schema([("x", pa.int64())])
    writer = pa.ipc.new_stream(sink, schema)
    for _ in range(4):
        writer.write_batch(pa.record_batch([pa.array(np.arange(100_000))], schema=schema))
    writer.close()


def json_dump():
    with open(FULL, "w") as f:
        json.dump({"x": list(range(100_000))}, f)


def savefig():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2, 3])
    try:
        fig.savefig(FULL, format="png")
    finally:
        plt.close(fig)


LIBRARY_WRITES = {
    "torch.save, large (zip writer: unexpected pos)": lambda: torch.save({"w": torch.zeros(300_000)}, FULL),
    "torch.save, small (iostream error)": lambda: torch.save({"w": torch.zeros(10)}, FULL),
    "pyarrow stream into a Python file": lambda: arrow_stream(open(FULL, "wb")),
    "pyarrow stream into a path": lambda: arrow_stream(FULL),
    "np.save": lambda: np.save(open(FULL, "wb"), np.arange(1_000_000)),  # a path would get .npy appended
    "ndarray.tofile (no errno)": lambda: np.arange(1_000_000).tofile(FULL),
    "json.dump": json_dump,
    "Path.write_text": lambda: Path(FULL).write_text("x" * 100_000),
    "matplotlib savefig": savefig,
}


@pytest.mark.parametrize("case", sorted(LIBRARY_WRITES))
def test_every_library_failure_on_a_full_device_is_recognised(case):
    error = raised(LIBRARY_WRITES[case])
    assert is_disk_full(error), f"{type(error).__name__}: {error}"


def test_other_failures_are_not_a_full_disk(tmp_path):
    from safetensors import SafetensorError

    others = [
        raised(lambda: (tmp_path / "missing" / "x").write_text("x")),  # FileNotFoundError
        raised(lambda: torch.save({"w": torch.zeros(1)}, tmp_path / "missing" / "x.pt")),  # cannot open
        raised(lambda: open(tmp_path, "w")),  # IsADirectoryError
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        SafetensorError("Error while serializing: I/O error: Permission denied (os error 13)"),
        ValueError("No space left on device"),  # not an I/O error, whatever its text
    ]
    assert [is_disk_full(e) for e in others] == [False] * len(others)
    assert is_disk_full(SafetensorError(SAFETENSORS_FULL))


def test_the_line_names_the_path_the_free_space_and_the_fix(tmp_path):
    partial = tmp_path / ".tmp-x"
    partial.mkdir()
    (partial / "half").write_bytes(b"12")
    complete = tmp_path / "complete"
    complete.write_text("kept")
    with pytest.raises(DiskFullError) as err:
        with written(tmp_path / "x", "the thing", "free space and run it again", partial=[partial]):
            np.arange(1000).tofile(FULL)
    assert re.fullmatch(rf"no space left on the device of {tmp_path / 'x'} {FREE} while writing the thing: the "
                        r"partial files were removed; free space and run it again", str(err.value)), err.value
    assert isinstance(err.value.__cause__, OSError)  # the library's error is kept as the cause
    assert not partial.exists() and complete.read_text() == "kept"
    with pytest.raises(KeyError):  # any other failure goes on as it was, its partial files removed too
        with written(tmp_path / "x", "the thing", "fix", partial=[complete]):
            raise KeyError("x")
    assert not complete.exists()


# ----------------------------------------------------------------------------------------------
# The trainer: checkpoints, adapters, metrics, plots


def to_full_device(real, calls: list, at: int):
    """``real(obj, path, ...)`` that writes its ``at``-th call to /dev/full instead of ``path``."""
    def write(obj, path, *args, **kwargs):
        calls.append(path)
        return real(obj, FULL if len(calls) == at else path, *args, **kwargs)
    return write


def test_a_checkpoint_save_on_a_full_device_then_resume_auto(tmp_path, model_dir, monkeypatch):
    """The attack's case: torch's zip writer fails (``unexpected pos``) while checkpoint-2 is saved."""
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    monkeypatch.setattr(packtrain.trainer.run.checkpoint.torch, "save",
                        to_full_device(torch.save, calls := [], at=2))  # checkpoint-2's trainer_state.pt
    config = make_config(model_dir, tmp_path / "runs", max_steps=4, save_steps=1, run_name="r", **RUN_END)
    with pytest.raises(DiskFullError) as err:
        run(config, tmp_path / "cache")
    monkeypatch.undo()
    run_dir = tmp_path / "runs" / "sql" / "r"
    assert "unexpected pos" in str(err.value.__cause__)
    assert re.fullmatch(rf"no space left on the device of {run_dir / 'checkpoint-2'} {FREE} while writing "
                        rf"checkpoint-2 of run {run_dir}: the partial files were removed; free space \(or set "
                        r"train.output_dir elsewhere\) and continue with --resume auto", str(err.value)), err.value
    assert sorted(p.name for p in run_dir.iterdir() if p.is_dir()) == ["checkpoint-1"]
    assert leftovers(tmp_path) == []
    assert run(config, tmp_path / "cache", resume="auto") == run_dir  # space again: auto continues from step 1
    assert steps_of(run_dir) == [1, 2, 3, 4]
    assert (run_dir / "summary.json").is_file() and leftovers(tmp_path) == []


@pytest.mark.parametrize("where", ["checkpoint", "final"])
def test_an_adapter_save_on_a_full_disk(tmp_path, model_dir, monkeypatch, where):
    """safetensors (under PEFT's save_pretrained) fails as it did on the tmpfs: in checkpoint-2's
    adapter, or in the final adapter."""
    import peft.peft_model
    from safetensors import SafetensorError

    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    real, calls = peft.peft_model.safe_save_file, []

    def full_disk(tensors, filename, *args, **kwargs):
        calls.append(filename)
        real(tensors, filename, *args, **kwargs)  # the file was being written when the disk filled
        if len(calls) == 2 if where == "checkpoint" else ".tmp-adapter" in str(filename):
            raise SafetensorError(SAFETENSORS_FULL)

    monkeypatch.setattr(peft.peft_model, "safe_save_file", full_disk)
    config = make_config(model_dir, tmp_path / "runs", max_steps=3, save_steps=1, run_name="r", **RUN_END)
    with pytest.raises(DiskFullError) as err:
        run(config, tmp_path / "cache")
    monkeypatch.undo()
    run_dir = tmp_path / "runs" / "sql" / "r"
    target = run_dir / ("checkpoint-2" if where == "checkpoint" else "adapter")
    what = f"checkpoint-2 of run {run_dir}" if where == "checkpoint" else f"the final adapter of run {run_dir}"
    assert re.fullmatch(rf"no space left on the device of {target} {FREE} while writing {what}: the partial files "
                        r"were removed; free space \(or set train.output_dir elsewhere\) and continue with "
                        r"--resume auto", str(err.value)), err.value
    done = ["checkpoint-1"] if where == "checkpoint" else ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    assert sorted(p.name for p in run_dir.iterdir() if p.is_dir()) == done  # no adapter, no .tmp-*
    assert not (run_dir / "summary.json").exists()
    assert run(config, tmp_path / "cache", resume="auto") == run_dir  # still unfinished: auto continues it
    assert steps_of(run_dir) == [1, 2, 3]
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file() and leftovers(tmp_path) == []


def test_metrics_on_a_full_device(tmp_path, model_dir, monkeypatch):
    """metrics.jsonl, appended line by line, is on a full device: one line; with space again the run works."""
    import packtrain.trainer.report.metrics

    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    real_open = open
    monkeypatch.setattr(packtrain.trainer.report.metrics, "open", lambda path, mode: real_open(FULL, mode), raising=False)
    config = make_config(model_dir, tmp_path / "runs", max_steps=2, save_steps=1, **RUN_END)
    with pytest.raises(DiskFullError) as err:
        run(config, tmp_path / "cache")
    monkeypatch.undo()
    [run_dir] = (tmp_path / "runs" / "sql").iterdir()
    assert re.fullmatch(rf"no space left on the device of {run_dir / 'metrics.jsonl'} {FREE} while writing "
                        rf"metrics.jsonl of run {run_dir}: free space \(or set train.output_dir elsewhere\) and "
                        r"continue with --resume auto", str(err.value)), err.value
    resumed = run(config, tmp_path / "cache", resume="auto")
    assert steps_of(resumed) == [1, 2] and leftovers(tmp_path) == []


def test_tensorboard_on_a_full_device(tmp_path, model_dir, monkeypatch):
    """train.report_to: tensorboard, its event file on a full disk (what the writer raises, ENOSPC): one line."""
    from torch.utils.tensorboard import SummaryWriter

    def full(*_, **__):
        raise OSError(errno.ENOSPC, "No space left on device")

    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), [], 32, model_dir)
    monkeypatch.setattr(SummaryWriter, "add_scalar", full)
    config = make_config(model_dir, tmp_path / "runs", max_steps=2, report_to="tensorboard", plots=False)
    with pytest.raises(DiskFullError) as err:
        run(config, tmp_path / "cache")
    [run_dir] = (tmp_path / "runs" / "sql").iterdir()
    assert re.fullmatch(rf"no space left on the device of {run_dir / 'tensorboard'} {FREE} while writing the "
                        r"TensorBoard event file: free space \(or set train.output_dir elsewhere\) and continue with "
                        r"--resume auto", str(err.value)), err.value


def plotted_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "runs" / "sql" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 2.0 / s, "tok_s": 100.0}) + "\n"
                                                   for s in (1, 2, 3)))
    return run_dir


def test_plots_on_a_full_device(tmp_path, monkeypatch):
    import matplotlib.figure

    run_dir = plotted_run(tmp_path)
    (run_dir / "plots").mkdir()
    (run_dir / "plots" / "loss.png").write_bytes(b"an older plot")
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda self, path, *a, **k: real(self, FULL, *a, **{**k, "format": "png"})
                        if "loss.png" in str(path) else real(self, path, *a, **k))  # (no suffix: say png)
    with pytest.raises(DiskFullError) as err:
        write_run_plots(run_dir)
    assert re.fullmatch(rf"no space left on the device of {run_dir / 'plots' / 'loss.png'} {FREE} while writing the "
                        r"plot loss.png: the partial files were removed; free space, then draw the plots again "
                        r"with `packtrain plot`", str(err.value)), err.value
    assert sorted(os.listdir(run_dir / "plots")) == ["loss.png"]  # the older plot, no .tmp-
    assert (run_dir / "plots" / "loss.png").read_bytes() == b"an older plot"
    monkeypatch.undo()
    assert [p.name for p in write_run_plots(run_dir)] == ["loss.png", "throughput.png", "data_wait.png", "memory.png"]


def test_the_plot_command_says_it_in_one_line(tmp_path, monkeypatch, capsys):
    import matplotlib.figure

    from packtrain.cli.commands import run as cli

    project = make_project(tmp_path)
    build(load_config("sql", project["configs"]), project["cache"], log=lambda *a: None)
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda self, path, *a, **k: real(self, FULL, *a, **{**k, "format": "png"}))
    monkeypatch.setattr(sys, "argv", ["packtrain", "plot", "sql", "--cache-dir", str(project["cache"]),
                                      "--runs-dir", str(tmp_path / "runs")])
    with pytest.raises(SystemExit) as exit_code:
        cli()
    stderr = capsys.readouterr().err
    assert exit_code.value.code == 2 and "Traceback" not in stderr
    assert re.fullmatch(rf"error: no space left on the device of \S+/plots/lengths.png {FREE} while writing the plot "
                        r"lengths.png: the partial files were removed; free space, then draw the plots again with "
                        r"`packtrain plot`", stderr.strip().splitlines()[-1]), stderr


# ----------------------------------------------------------------------------------------------
# The build: spills and shards


@pytest.mark.parametrize("where", ["spill", "shard"])
def test_a_build_on_a_full_device_keeps_the_previous_build(tmp_path, monkeypatch, where):
    """The token spill's index arrays (np.save) or a shard (pyarrow) hit a full device."""
    project = make_project(tmp_path)
    load = lambda **o: load_config("sql", project["configs"], o)  # noqa: E731
    old = build(load(), project["cache"], log=lambda *a: None)
    if where == "spill":
        real_save = np.save
        monkeypatch.setattr(packtrain.pipeline.pack.spill.np, "save", lambda path, array: real_save(open(FULL, "wb"), array))
    else:
        real_open = open
        monkeypatch.setattr(packtrain.core.shardfile, "open", lambda path, mode: real_open(FULL, mode), raising=False)
    write_jsonl(project["data"], rows(80))  # new rows: tokenized (spilled) and packed again
    new = load()
    with pytest.raises(DiskFullError) as err:
        build(new, project["cache"], log=lambda *a: None)
    root = project["cache"] / "sql"
    assert re.fullmatch(rf"no space left on the device of {root} {FREE} while writing build [0-9a-f]{{16}} of 'sql': "
                        r"the partial files were removed; nothing was published and CURRENT is unchanged; free space "
                        r"or set CACHE_DIR \(--cache-dir\) to a larger disk, then build again", str(err.value)), err.value
    assert read_current(project["cache"], "sql") == old.build_id
    assert leftovers(project["cache"]) == []
    monkeypatch.undo()
    assert build(new, project["cache"], log=lambda *a: None).build_id != old.build_id  # space again: it builds


def test_train_log_on_a_full_device_is_said_once_in_one_line(capsys):
    """logging prints a traceback for each line a FileHandler cannot write; train.log says it once."""
    import logging

    from packtrain.trainer.run.runlog import RunLogFile

    handler = RunLogFile(Path(FULL))
    logger = logging.getLogger("packtrain.test.diskfull")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for i in range(3):
            logger.warning("line %d", i)
    finally:
        logger.removeHandler(handler)
        handler.close()  # the lines still buffered cannot be written either: said already, not raised
    err = capsys.readouterr().err
    assert re.fullmatch(rf"warning: no space left on the device of {FULL} {FREE}: its log lines are not written\n",
                        err), err
