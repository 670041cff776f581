"""``train.report_to``: wandb and mlflow beside TensorBoard (trainer/report/sinks.py), offline: a wandb run in
``WANDB_MODE=offline`` read back from its own run file, an MLflow ``file:`` store read back with
``MlflowClient``; a missing library refused before anything loads; a dashboard that fails never stops
training. (TensorBoard's own test: tests/test_plots.py.)"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from inprocess_cli import ROOT, cli
from packtrain.core.config import ConfigError
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def metrics_by_step(run_dir: Path) -> dict[int, dict]:
    """metrics.jsonl's numeric fields, the lines of one step merged (a train line and an eval line)."""
    steps: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps.setdefault(record["step"], {}).update(
            {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float)) and v is not None})
    return steps


def wandb_records(run_file: Path) -> list:
    """The records of a wandb run file (``run-<id>.wandb``), with wandb's own protobuf schema: the file is
    a 7-byte header then LevelDB log blocks of 32 KiB, each record a 7-byte header (crc32c, length, type:
    1 full, 2 first, 3 middle, 4 last) and its bytes. (wandb 0.31 reads it in Go only.)"""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, at = [], b"", 7
    while at + 7 <= len(data):
        if 32768 - at % 32768 < 7:  # a block's tail too short for a header: zero padding
            at += 32768 - at % 32768
            continue
        length, kind = struct.unpack("<HB", data[at + 4:at + 7])
        if kind == 0:
            break
        pending += data[at + 7:at + 7 + length]
        at += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


@pytest.fixture
def offline_dashboards(tmp_path: Path, monkeypatch):
    """wandb offline and MLflow on a file store, every file they write under ``tmp_path``; wandb's
    process-wide setup (settings read from the environment, its service process) ended afterwards."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    for name, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb"), "WANDB_PROJECT": "tests",
                        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
                        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"), "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
                        "XDG_CACHE_HOME": str(tmp_path / "xdg-cache"),
                        "MLFLOW_TRACKING_URI": f"file:{tmp_path / 'mlruns'}", "MLFLOW_ALLOW_FILE_STORE": "true",
                        "MLFLOW_EXPERIMENT_NAME": "tests"}.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "wandb").mkdir()
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # wandb.init replaces both for good: put back after
    monkeypatch.setattr(sys, "exit", sys.exit)
    yield
    import wandb

    wandb.teardown()


def exit_code(wandb_dir: Path) -> int:
    """The exit code in the offline run's file, read once wandb's service has ended and closed the file (read while
    it ran, the exit record was missing once at load 10 although wandb's log said it got exit code 255)."""
    import wandb

    wandb.teardown()
    [run_file] = (wandb_dir / "wandb").glob("offline-run-*/run-*.wandb")
    [ended] = [r.exit for r in wandb_records(run_file) if r.WhichOneof("record_type") == "exit"]
    return ended.exit_code


@pytest.mark.parametrize("value, problem", [
    ("wnadb", "expected 'none', 'tensorboard', 'wandb', 'mlflow' or a list of 'none', 'tensorboard', 'wandb', "
              "'mlflow', got 'wnadb' (did you mean 'wandb'?)"),
    (["tensorbord", "wandb"], "expected 'none', 'tensorboard', 'wandb', 'mlflow' or a list of 'none', 'tensorboard', "
                              "'wandb', 'mlflow', got ['tensorbord', 'wandb'] (did you mean 'tensorboard'?)"),
    ("comet_ml", "expected 'none', 'tensorboard', 'wandb', 'mlflow' or a list of 'none', 'tensorboard', 'wandb', "
                 "'mlflow', got 'comet_ml'"),
    (["none", "wandb"], "['none', 'wandb']: none with dashboards; use none alone, or name only the dashboards"),
    (["wandb", "wandb"], "['wandb', 'wandb']: name each of tensorboard, wandb, mlflow at most once, or use none"),
    ([], "[]: name each of tensorboard, wandb, mlflow at most once, or use none"),
])
def test_report_to_takes_none_a_name_or_a_list(tmp_path, value, problem):
    assert make_config(tmp_path, tmp_path).train.reporters() == []
    assert make_config(tmp_path, tmp_path, report_to=["none"]).train.reporters() == []  # as HF reads ["none"]
    assert make_config(tmp_path, tmp_path, report_to="wandb").train.reporters() == ["wandb"]
    assert make_config(tmp_path, tmp_path, report_to=["tensorboard", "mlflow"]).train.reporters() == ["tensorboard",
                                                                                                        "mlflow"]
    with pytest.raises(ConfigError) as error:
        make_config(tmp_path, tmp_path, report_to=value)
    assert str(error.value) == f"invalid config (<dict>): train.report_to: {problem}"


def test_a_missing_library_is_one_line_before_anything_loads(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    refused = cli("train", "sql", "--configs-dir", ROOT / "configs", "--cache-dir", tmp_path / "cache",
                  "--set", "train.report_to=[tensorboard, mlflow]", "--set", f"train.output_dir={tmp_path / 'runs'}")
    assert refused.returncode == 2
    assert refused.stderr == ("error: train.report_to: mlflow needs the mlflow package: "
                              "pip install 'packtrain[mlflow]', or set train.report_to: none\n")
    assert not (tmp_path / "runs").exists()


def test_wandb_offline_and_mlflow_file_runs_hold_the_metrics_and_the_config(tmp_path, model_dir, offline_dashboards):
    from mlflow import MlflowClient

    from packtrain.trainer.report.sink_mlflow import config_params

    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=2, eval_steps=2, sample_prompts=0, plots=False,
                         report_to=["wandb", "mlflow"])
    run_dir = run(config, tmp_path / "cache")
    expected = metrics_by_step(run_dir)
    assert sorted(expected) == [0, 1, 2] and "eval/loss" in expected[2] and "loss" in expected[2]
    resolved = json.loads((run_dir / "config.json").read_text())

    # wandb: the offline run file under WANDB_DIR (none in the run directory)
    [run_file] = (tmp_path / "wandb" / "wandb").glob("offline-run-*/run-*.wandb")
    assert not (run_dir / "wandb").exists()
    records = wandb_records(run_file)
    [started] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (started.display_name, started.project) == (run_dir.name, "tests")
    config_items = {item.key: json.loads(item.value_json) for r in records
                    if r.WhichOneof("record_type") in ("run", "config")
                    for item in (r.run.config.update if r.WhichOneof("record_type") == "run" else r.config.update)}
    assert {key: config_items[key] for key in resolved} == resolved
    history = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            history.setdefault(row["_step"], {}).update({k: v for k, v in row.items() if not k.startswith("_")})
    assert history == expected
    assert exit_code(tmp_path / "wandb") == 0

    # mlflow: the run in the file store
    client = MlflowClient()
    [found] = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert (found.info.run_name, found.info.status) == (run_dir.name, "FINISHED")
    assert found.data.params == config_params(resolved)
    assert found.data.params["train.learning_rate"] == "0.001" and found.data.params["train.report_to"] == \
        '["wandb", "mlflow"]'
    logged = {}
    for key in found.data.metrics:
        for m in client.get_metric_history(found.info.run_id, key):
            logged.setdefault(m.step, {})[key] = m.value
    assert logged == expected


def test_a_dashboard_that_fails_is_warned_once_and_training_goes_on(tmp_path, model_dir, monkeypatch):
    pytest.importorskip("tensorboard")
    from packtrain.trainer.report.sink_tensorboard import TensorBoardSink  # (its own module, since report_to has several)

    def unreachable(self, metrics, step):
        raise ConnectionError("the dashboard is\nunreachable")

    monkeypatch.setattr(TensorBoardSink, "log", unreachable)
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=2, eval_steps=2, sample_prompts=0, plots=False,
                         report_to="tensorboard")
    run_dir = run(config, tmp_path / "cache")
    assert (run_dir / "summary.json").exists() and sorted(metrics_by_step(run_dir)) == [0, 1, 2]
    warned = [line.split(" ", 2)[2] for line in (run_dir / "train.log").read_text().splitlines() if "WARNING" in line]
    assert warned == ["WARNING report_to tensorboard: log failed (ConnectionError: the dashboard is unreachable); "
                      "training goes on without tensorboard (metrics.jsonl keeps every line)"]


@pytest.mark.parametrize("stop, status, code", [(KeyboardInterrupt, "KILLED", 255), (RuntimeError, "FAILED", 1)])
def test_how_the_run_ended_is_passed_on(tmp_path, model_dir, monkeypatch, offline_dashboards, stop, status, code):
    import packtrain.trainer.run.train
    from mlflow import MlflowClient

    def interrupted(*args):
        raise stop("stopped at the end")

    monkeypatch.setattr(packtrain.trainer.run.train, "finish_run", interrupted)  # after the last step
    write_build(tmp_path / "cache", "sql", random_blocks(4, 32, 0), [], 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=1, sample_prompts=0, plots=False,
                         report_to=["wandb", "mlflow"])
    with pytest.raises(stop):
        run(config, tmp_path / "cache")
    client = MlflowClient()
    [found] = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert found.info.status == status
    assert exit_code(tmp_path / "wandb") == code


def test_a_dropped_dashboard_is_ended_as_failed_when_it_is_dropped(tmp_path, model_dir, monkeypatch, offline_dashboards):
    from mlflow import MlflowClient

    from packtrain.trainer.report.sink_mlflow import MlflowSink
    from packtrain.trainer.report.sink_wandb import WandbSink

    def unreachable(self, metrics, step):
        raise ConnectionError("the dashboard is unreachable")

    monkeypatch.setattr(MlflowSink, "log", unreachable)
    monkeypatch.setattr(WandbSink, "log", unreachable)
    write_build(tmp_path / "cache", "sql", random_blocks(4, 32, 0), [], 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=1, sample_prompts=0, plots=False,
                         report_to=["wandb", "mlflow"])
    run_dir = run(config, tmp_path / "cache")
    assert (run_dir / "summary.json").exists()
    client = MlflowClient()
    [found] = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    assert found.info.status == "FAILED"  # not left RUNNING: the dashboard shows it stopped hearing from the run
    assert exit_code(tmp_path / "wandb") == 1
    warned = [line.split(" ", 2)[2] for line in (run_dir / "train.log").read_text().splitlines() if " failed (" in line]
    assert [line.split(":")[0] for line in warned] == ["WARNING report_to wandb", "WARNING report_to mlflow"]


def test_a_resumed_run_replaces_the_tensorboard_steps_after_its_checkpoint(tmp_path, model_dir, monkeypatch):
    pytest.importorskip("tensorboard")
    import packtrain.trainer.loop
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    save = packtrain.trainer.loop.save_checkpoint

    def crash_at_step_4(run, state, *args):
        if state.step == 4:
            raise RuntimeError("killed before checkpoint-4")
        return save(run, state, *args)

    monkeypatch.setattr(packtrain.trainer.loop, "save_checkpoint", crash_at_step_4)
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), [], 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=4, save_steps=2, sample_prompts=0, plots=False,
                         run_name="r", report_to="tensorboard")
    with pytest.raises(RuntimeError):
        run(config, tmp_path / "cache")
    monkeypatch.setattr(packtrain.trainer.loop, "save_checkpoint", save)
    run_dir = run(config, tmp_path / "cache", resume="auto")  # from checkpoint-2: steps 3 and 4 again
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    logged = [(e.step, e.value) for e in events.Scalars("loss")]
    assert [step for step, _ in logged] == [1, 2, 3, 4]  # the killed run's steps 3 and 4 purged, as metrics.jsonl's
    assert [value for _, value in logged] == pytest.approx([loss for step, loss in sorted(
        (step, values["loss"]) for step, values in metrics_by_step(run_dir).items() if "loss" in values)], rel=1e-6)


def test_tensorboard_holds_the_resolved_config(tmp_path, model_dir):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    write_build(tmp_path / "cache", "sql", random_blocks(4, 32, 0), [], 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=1, sample_prompts=0, plots=False,
                         report_to="tensorboard")
    run_dir = run(config, tmp_path / "cache")
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    [text] = events.Tensors("config/text_summary")  # as HF's TensorBoardCallback logs its args: text
    logged = make_ndarray(text.tensor_proto).item().decode()
    assert json.loads(logged.removeprefix("```json\n").removesuffix("\n```")) == json.loads(
        (run_dir / "config.json").read_text())


def test_a_dashboard_that_fails_to_start_is_said_once(tmp_path, model_dir, monkeypatch):
    pytest.importorskip("tensorboard")
    import torch.utils.tensorboard

    def refused(*args, **kwargs):
        raise PermissionError("the log directory is read-only")

    monkeypatch.setattr(torch.utils.tensorboard, "SummaryWriter", refused)
    write_build(tmp_path / "cache", "sql", random_blocks(4, 32, 0), [], 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=1, sample_prompts=0, plots=False,
                         report_to="tensorboard")
    run_dir = run(config, tmp_path / "cache")
    said = [line.split(" ", 2)[2] for line in (run_dir / "train.log").read_text().splitlines() if "report_to" in line]
    assert said == ["WARNING report_to tensorboard: start failed (PermissionError: the log directory is read-only); "
                    "training goes on without tensorboard (metrics.jsonl keeps every line)"]  # no second line at the end
