"""PNG plots of a run, drawn from its ``metrics.jsonl`` (the record; the plots are derived and
redrawn whenever asked): ``<run>/plots/loss.png`` (train loss and eval loss by step),
``throughput.png`` (tokens/s), ``data_wait.png`` (share of time waiting for data) and
``memory.png`` (peak GiB: GPU memory allocated on CUDA, the process's resident memory (RSS) on a CPU,
labelled by the device run.json names). Every axis but the loss's starts at 0 (data wait: 0-100%),
so that noise of a percent is not drawn as a spike. Each is titled by the expert the run trained
(``sql: loss``), the run's id under it, smaller.

matplotlib is an optional extra (packtrain/core/plotting.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from packtrain.core.plotting import PLOTS_DIR, PlotError, pyplot, save_figure
from packtrain.core.contract import CONFIG_SNAPSHOT
from packtrain.core.rundir import RunRecord, json_object


def read_metrics(path: Path) -> tuple[list[dict], list[dict]]:
    """(train lines, eval lines) of a metrics.jsonl; torn or skipped-step lines are left out."""
    if not path.is_file():
        raise PlotError(f"{path} does not exist: not a run directory, or the run logged no step yet")
    train, evals = [], []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict) or "skipped" in record:
            continue
        if "eval/loss" in record or "loss" in record:
            check_record(record, f"{path} line {number}")
            (evals if "eval/loss" in record else train).append(record)
    return train, evals


PLOTTED = ("loss", "eval/loss", "tok_s", "sup_tok_s", "data_wait", "mem/peak_gib")


def check_record(record: dict, where: str) -> None:
    """A step record the plots can use: an integer ``step`` >= 0 and numbers (or null) in the plotted fields."""
    step = record.get("step")
    problem = None if type(step) is int and step >= 0 else f"step is {step!r}, expected an integer >= 0"
    for name in PLOTTED:
        value = record.get(name)
        if problem is None and value is not None and type(value) not in (int, float):
            problem = f"{name} is {value!r:.40}, expected a number"
    if problem:
        raise PlotError(f"{where}: {problem}; the file is damaged: repair or delete that line (the run's plots are "
                        "drawn from it)")


def memory_label(run_dir: Path) -> str:
    """What ``mem/peak_gib`` measured (trainer/report/metrics.py), by the device run.json names."""
    record = RunRecord.read(run_dir)
    device = record.device if record is not None else None
    if device is None:
        return "peak memory (GiB): GPU allocated on CUDA, CPU RSS otherwise"
    return "peak GPU memory allocated (GiB)" if device.startswith("cuda") else "peak CPU memory, RSS (GiB)"


def run_expert(run_dir: Path) -> str:
    """The expert a run trained, as its config.json names it; where that cannot be read, the name of the
    directory the run is in (``<output_dir>/<expert>/<run>``)."""
    try:
        expert = json_object(run_dir / CONFIG_SNAPSHOT).get("expert")
    except (OSError, ValueError, TypeError, RecursionError):
        expert = None
    return expert if isinstance(expert, str) and expert else run_dir.absolute().parent.name


def write_run_plots(run_dir: Path) -> list[Path]:
    """Draw the run's plots into ``<run>/plots/``; returns the files written."""
    if not run_dir.is_dir():
        raise PlotError(f"{run_dir} {'is a file, not' if run_dir.exists() else 'does not exist, not'} a run directory: "
                        "name a run directory (runs/<expert>/<run>) with --run")
    train, evals = read_metrics(run_dir / "metrics.jsonl")
    if not train:
        raise PlotError(f"{run_dir / 'metrics.jsonl'} has no training step to plot")
    plt = pyplot()
    out = run_dir / PLOTS_DIR
    if out.exists() and not out.is_dir():
        raise PlotError(f"{out} is a file, not the plots directory: move it away to draw the plots")
    out.mkdir(exist_ok=True)
    steps = [r["step"] for r in train]
    charts = [
        ("loss.png", "loss", [("train loss", steps, [r["loss"] for r in train]),
                              ("eval loss", [r["step"] for r in evals], [r["eval/loss"] for r in evals])]),
        ("throughput.png", "tokens/s", [("tokens/s", steps, [r.get("tok_s") for r in train]),
                                        ("supervised tokens/s", steps, [r.get("sup_tok_s") for r in train])]),
        ("data_wait.png", "time waiting for data (%)",
         [("data wait", steps, [None if r.get("data_wait") is None else 100 * r["data_wait"] for r in train])]),
        ("memory.png", memory_label(run_dir), [("peak", steps, [r.get("mem/peak_gib") for r in train])]),
    ]
    written, expert = [], run_expert(run_dir)
    for name, ylabel, series in charts:
        fig, ax = plt.subplots(figsize=(7, 4))
        for label, xs, ys in series:
            points = [(x, y) for x, y in zip(xs, ys) if y is not None]
            if points:
                ax.plot(*zip(*points), marker="o" if len(points) < 30 else None, label=label)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        highest = max((y for _, _, ys in series for y in ys if y is not None), default=0)
        if name == "data_wait.png":  # all of it: 1% of noise is not drawn as a spike
            ax.set_ylim(0, 100)
        elif name != "loss.png" and highest > 0:  # from 0
            ax.set_ylim(0, 1.1 * highest)
        fig.suptitle(f"{expert}: {ylabel}")
        ax.set_title(f"run {run_dir.absolute().name}", fontsize="small")
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend()
        fig.tight_layout()
        written.append(save_figure(plt, fig, out / name))
    return written
