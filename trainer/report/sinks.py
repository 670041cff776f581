"""``train.report_to``: metric sinks, the dashboards every metrics line also goes to, as HF users expect.

``metrics.jsonl`` stays the record (resume cuts it back, the summary and the plots read it); a sink
is a view of it. Each sink has one small interface::

    start(config)        the run begins: the resolved config (config.json) is the dashboard run's config
    log(metrics, step)   one metrics line: its numeric fields, at its step (train and eval lines alike)
    finish(status)       the run ended: "finished", "failed" or "killed" (interrupted)

and lives in its own module, importing its library there, only on the main rank, when the run
starts: sink_tensorboard.py, sink_wandb.py, sink_mlflow.py. Whether the library is installed is
checked before anything is loaded (core/preflight.py ``check_report_to``).

A dashboard must never make training fail: a sink that raises (a server unreachable, a login
missing, a bug in its library) is warned about once, on the console and in train.log, and dropped;
training and metrics.jsonl go on. When the run ends, a dropped sink's dashboard run is ended as failed
(MLflow FAILED, wandb exit code 1), so that it does not stay "running" for ever. The one exception is a full disk under the run directory (a
:class:`DiskFullError`, TensorBoard's event files): that stops the run as metrics.jsonl's would.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from packtrain.core.diskfull import DiskFullError

log = logging.getLogger("packtrain.train")

STATUSES = ("finished", "failed", "killed")


class MetricSink(Protocol):
    """One dashboard (see the module's docstring); made with the run directory, nothing imported yet."""

    def start(self, config: dict) -> None: ...

    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def finish(self, status: str) -> None: ...


def make_sink(name: str, run_dir: Path, resumed_at: int | None = None) -> MetricSink:
    """The sink called ``name`` in ``train.report_to`` (its module imported here, its library at start).
    ``resumed_at``: the step of the checkpoint a resumed run continues from (metrics.jsonl is cut back to
    it, and so are TensorBoard's event files in the run directory; wandb and mlflow start a new run)."""
    if name == "tensorboard":
        from packtrain.trainer.report.sink_tensorboard import TensorBoardSink
        return TensorBoardSink(run_dir, resumed_at)
    if name == "wandb":
        from packtrain.trainer.report.sink_wandb import WandbSink
        return WandbSink(run_dir)
    if name == "mlflow":
        from packtrain.trainer.report.sink_mlflow import MlflowSink
        return MlflowSink(run_dir)
    raise ValueError(f"unknown metric sink {name!r}")  # the config's type check allows no other name


def numbers(record: dict) -> dict[str, float]:
    """A metrics line's numeric fields but its step: ``loss``, ``lr``, ``epoch``, ``eval/loss``, ...
    (a null ``mfu`` on a CPU, a string or a bool is left out)."""
    return {key: value for key, value in record.items()
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)}


class Guarded:
    """A sink whose failures are warned about once, after which it is dropped."""

    def __init__(self, name: str, sink: MetricSink):
        self.name, self.sink, self.alive = name, sink, True

    def call(self, what: str, *args) -> None:
        if not self.alive:
            return
        try:
            getattr(self.sink, what)(*args)
        except DiskFullError:
            self.alive = False
            raise  # the run directory's disk is full: the run stops, as for metrics.jsonl
        except Exception as e:
            self.alive = False
            said = " ".join(str(e).split())
            log.warning("report_to %s: %s failed (%s: %s); training goes on without %s (metrics.jsonl keeps every "
                        "line)", self.name, what, type(e).__name__, said if len(said) <= 200 else said[:200] + "...",
                        self.name)

    def end(self, status: str) -> None:
        """The run ended (called once): a live sink is told ``status``; a dropped one (failed in ``start`` or ``log``) is
        ended as failed, so that its dashboard run is not left running for ever (TensorBoard's writer
        closed). Done here, after the run's files are written, not when it is dropped: an unreachable
        server's retries hold up nothing but the exit. Where that fails too, train.log says so."""
        if self.alive:
            self.call("finish", status)
            return
        try:
            self.sink.finish("failed")
        except Exception as e:
            log.info("report_to %s: ending its run as failed did not work either (%s: %s)", self.name,
                     type(e).__name__, " ".join(str(e).split())[:200])


class Reporting:
    """metrics.jsonl and the sinks of ``train.report_to``: each line written to the file, then logged
    to every sink still alive. Only the main rank has sinks (the other ranks report nothing)."""

    def __init__(self, metrics, names: list[str], run_dir: Path, resumed_at: int | None = None):
        self.metrics = metrics
        self.sinks = [Guarded(name, make_sink(name, run_dir, resumed_at)) for name in names]

    def start(self, config: dict) -> None:
        for sink in self.sinks:
            sink.call("start", config)

    def write(self, record: dict) -> None:
        self.metrics.write(record)
        values = numbers(record)
        for sink in self.sinks if values else []:
            sink.call("log", values, record.get("step", 0))

    def close(self) -> None:
        """The metrics file is closed; the sinks stay open until :meth:`finish` says how the run ended."""
        self.metrics.close()

    def finish(self, status: str) -> None:
        assert status in STATUSES, status
        for sink in self.sinks:
            sink.end(status)
