"""Issue 12, class 3 (numbers are validated as numbers) and class 7 (the low ones: num_proc,
a cache inside a dataset directory, ignored files, Ctrl-C during a multi-process build)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import typing
from pathlib import Path

import pytest
import torch

import packtrain.pipeline.encode.pool as tokenize_module
from build_fixtures import ctrl_c_as_in_a_terminal, make_project, write_jsonl
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.errors import BuildError
from packtrain.cli.options import resolve
from packtrain.core.config import ConfigError, ExpertConfig, StageConfig
from packtrain.core.config_sources import SourceConfig
from packtrain.core.config_fields import in_range
from packtrain.core.configfile import apply_cli_overrides, load_config
from packtrain.pipeline.read.discover import resolve_source
from packtrain.trainer.model.adapters import NonFiniteWeightsError
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path)


def problems(project, *settings) -> list[str]:
    """The problems the CLI's --set path reports for ``settings``, one per list item."""
    with pytest.raises(ConfigError) as err:
        resolve("sql", project["configs"], None, None, None, settings)
    lines = str(err.value).splitlines()
    if len(lines) == 1:  # one problem: one line, "invalid config (<source>): <problem>"
        return [lines[0].split("): ", 1)[1]]
    return [line.removeprefix("  - ") for line in lines[1:]]


# --- class 3: every number has a declared finite range --------------------------------------------


def numeric_fields():
    classes = {ExpertConfig}  # and every config dataclass its fields hold
    todo = [ExpertConfig]
    while todo:
        for hint in typing.get_type_hints(todo.pop()).values():
            for t in (hint, *typing.get_args(hint), *(a for arg in typing.get_args(hint) for a in typing.get_args(arg))):
                if dataclasses.is_dataclass(t) and t not in classes:
                    classes.add(t)
                    todo.append(t)
    for cls in sorted(classes, key=lambda c: c.__name__):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if {int, float} & set(typing.get_args(hints[f.name]) or (hints[f.name],)):
                yield cls, f


def test_every_numeric_field_declares_a_range_its_default_fits():
    fields = list(numeric_fields())
    # 51: build.read_memory_mb (issue 46), train.save_minutes and cpu.save_minutes (issue 47), build.dedup_threshold
    # (issue 49); 53: train.gradient_checkpointing (an integer k: every k-th layer) and train.max_memory_gib
    # (issue 45); 55: cpu.per_device_eval_batch_size and cpu.generate_tokens (issue 47 item 3)
    assert len(fields) == 55  # a new numeric field must declare its range too
    for cls, f in fields:
        assert "range" in f.metadata, f"{cls.__name__}.{f.name} has no declared range (use num(default, '[lo, hi]'))"
        if isinstance(f.default, (int, float)):
            assert in_range(f.default, f.metadata["range"]), f"{cls.__name__}.{f.name}"


@pytest.mark.parametrize("setting, expected", [
    ("train.max_grad_norm=.nan", "train.max_grad_norm: must be a finite number in (0, 1000000], got nan"),
    ("train.learning_rate=.nan", "train.learning_rate: must be a finite number in (0, 1], got nan"),
    ("train.learning_rate=nan", "train.learning_rate: must be a finite number in (0, 1], got nan"),
    ("train.learning_rate=NaN", "train.learning_rate: must be a finite number in (0, 1], got nan"),
    ("train.learning_rate=.inf", "train.learning_rate: must be a finite number in (0, 1], got inf"),
    ("train.learning_rate=1e999", "train.learning_rate: must be a finite number in (0, 1], got inf"),
    ("train.learning_rate=1" + "0" * 400, "train.learning_rate: must be a finite number in (0, 1], got inf"),
    ("train.warmup_ratio=-.inf", "train.warmup_ratio: must be a finite number in [0, 1), got -inf"),
    ("train.adam_beta1=1.5", "train.adam_beta1: must be in [0, 1), got 1.5"),
    ("train.adam_beta2=1", "train.adam_beta2: must be in [0, 1), got 1.0"),
    ("train.weight_decay=-1", "train.weight_decay: must be in [0, 1], got -1.0"),
    ("train.adam_epsilon=-1", "train.adam_epsilon: must be in (0, 1], got -1.0"),
    ("train.adam_epsilon=0", "train.adam_epsilon: must be in (0, 1], got 0.0"),
    ("train.peak_tflops=.inf", "train.peak_tflops: must be a finite number in (0, 1000000000] "
                               "(or unset: looked up by GPU name), got inf"),
    ("train.seed=-1", "train.seed: must be in [0, 4294967295], got -1"),
    ("train.max_seq_length=8", "train.max_seq_length: must be in [16, 1048576] (or unset: the build's block size), got 8"),
    ("cpu.max_seq_length=0", "cpu.max_seq_length: must be in [16, 1048576], got 0"),
    ("train.seed=.nan", "train.seed: expected int, got nan"),
    ("train.save_total_limit=0", "train.save_total_limit: must be in [1, 1000000] (checkpoints are needed to "
                                 "resume), got 0"),
    ("train.dataloader_num_workers=-1", "train.dataloader_num_workers: must be in [0, 1024], got -1"),
    ("lora.dropout=.nan", "lora.dropout: must be a finite number in [0, 1), got nan"),
    ("lora.r=0", "lora.r: must be in [1, 65536], got 0"),
    ("pack.val_fraction=.nan", "pack.val_fraction: must be a finite number in [0, 1), got nan"),
    ("pack.block_size=8", "pack.block_size: must be in [16, 1048576], got 8"),
    ("pack.shard_size_mb=0", "pack.shard_size_mb: must be in [1, 1048576], got 0"),
    ("build.batch_rows=0", "build.batch_rows: must be in [1, 10000000], got 0"),
    ("build.num_proc=0", "build.num_proc: must be in [1, 1024] (tokenizer processes or auto; capped at the number "
                         "of batches), got 0"),
    ("build.num_proc=many", "build.num_proc: expected an integer or 'auto', got 'many'"),
    ("sources=[{name: x, max_rows: 0}]", "sources[0].max_rows: must be in [1, 1000000000000] (or unset for "
                                         "every row), got 0"),
])
def test_a_bad_number_names_the_field_the_value_and_the_range(project, setting, expected):
    assert problems(project, setting) == [expected]


def test_every_problem_is_reported_at_once(project):
    assert problems(project, "train.learning_rate=.nan", "train.adam_beta1=1.5", "train.weight_decay=-1",
                    "train.adam_epsilon=-1", "build.num_proc=0", "lora.dropout=-.inf") == [
        "build.num_proc: must be in [1, 1024] (tokenizer processes or auto; capped at the number of batches), got 0",
        "lora.dropout: must be a finite number in [0, 1), got -inf",
        "train.learning_rate: must be a finite number in (0, 1], got nan",
        "train.weight_decay: must be in [0, 1], got -1.0",
        "train.adam_beta1: must be in [0, 1), got 1.5",
        "train.adam_epsilon: must be in (0, 1], got -1.0",
    ]
    # a type error does not hide the range errors
    assert problems(project, "train.seed=.nan", "train.max_grad_norm=.nan") == [
        "train.seed: expected int, got nan",
        "train.max_grad_norm: must be a finite number in (0, 1000000], got nan",
    ]


def test_a_yaml_file_with_nan_is_refused(project):
    path = project["configs"] / "sql.yaml"
    path.write_text(path.read_text() + "train:\n  max_grad_norm: .nan\n  adam_beta1: .inf\n")
    with pytest.raises(ConfigError) as err:
        load_config("sql", project["configs"])
    assert str(err.value).splitlines() == [
        f"invalid config ({path}):",
        "  - train.adam_beta1: must be a finite number in [0, 1), got inf",
        "  - train.max_grad_norm: must be a finite number in (0, 1000000], got nan",
    ]


def test_stage_numbers_are_checked():
    config = ExpertConfig("sql", [], stages=[StageConfig("one", [SourceConfig("bundled", max_rows=-3)],
                                                         num_train_epochs=0, max_steps=0)])
    errors: list[str] = []
    config.validate(errors)
    assert errors == [
        "stages[0].sources[0].max_rows: must be in [1, 1000000000000] (or unset for every row), got -3",
        "stages[0].num_train_epochs: must be in [1, 1000000] (or unset: train.num_train_epochs), got 0",
        "stages[0].max_steps: must be in [1, 1000000000000] (or unset: train.max_steps), got 0",
    ]


def test_the_auto_and_boolean_fields_still_load(project):
    config = resolve("sql", project["configs"], None, None, None,
                     ("train.per_device_train_batch_size=auto", "train.global_batch_size=32",
                      "train.torch_compile=true", "train.fused_loss=auto", "train.learning_rate=1"))
    train = config.train
    assert (train.per_device_train_batch_size, train.global_batch_size, train.torch_compile, train.fused_loss,
            train.learning_rate) == ("auto", 32, True, "auto", 1.0)
    assert problems(project, "train.per_device_train_batch_size=0") == [
        "train.per_device_train_batch_size: must be in [1, 1048576] (or auto), got 0"]
    # was a ZeroDivisionError traceback: global_batch_size % (micro x 0)
    assert problems(project, "train.gradient_accumulation_steps=0", "train.global_batch_size=8") == [
        "train.gradient_accumulation_steps: must be in [1, 1048576], got 0"]


def test_the_cli_prints_the_problem_without_a_traceback(project):
    result = subprocess.run([sys.executable, "-m", "packtrain.cli", "config", "sql", "--configs-dir",
                             str(project["configs"]), "--set", "train.max_grad_norm=.nan"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]  # one problem, one line
    assert line.endswith("): train.max_grad_norm: must be a finite number in (0, 1000000], got nan")
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def test_the_trainer_refuses_a_bad_number_in_a_config_made_in_code(tmp_path, model_dir):
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    config = make_config(model_dir, tmp_path / "runs")
    config.train.max_grad_norm = math.nan
    with pytest.raises(ConfigError, match=r"train.max_grad_norm: must be a finite number in \(0, 1000000\], got nan"):
        run(config, tmp_path / "cache")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("save_steps", [1, 1000])  # a checkpoint, or the final adapter
def test_non_finite_weights_are_never_saved(tmp_path, model_dir, monkeypatch, save_steps):
    """What max_grad_norm: .nan did: clipping to a NaN norm makes every gradient NaN while the loss
    and the norm stay finite, so step 1 is taken and the weights turn NaN; step 2's loss is NaN
    (skipped), and the run ends there (max_steps 2) with a NaN adapter to save."""
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    real = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, _: real(params, math.nan))
    config = make_config(model_dir, tmp_path / "runs", max_steps=2, save_steps=save_steps)
    with pytest.raises(NonFiniteWeightsError) as err:
        run(config, tmp_path / "cache")
    (run_dir,) = (tmp_path / "runs" / "sql").iterdir()
    what = "checkpoint-1" if save_steps == 1 else "adapter"
    assert str(err.value).startswith(f"not saving {run_dir / what}: 28 trainable weight tensor(s) hold NaN or inf "
                                     "(first: base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight)")
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.json", "metrics.jsonl", "run.json", "train.log"]
    assert f"ERROR run failed: NonFiniteWeightsError: not saving {run_dir / what}" in (run_dir / "train.log").read_text()


# --- class 7 --------------------------------------------------------------------------------------


def test_num_proc_zero_is_refused_not_replaced(project):
    assert apply_cli_overrides(num_proc=0) == {"build.num_proc": 0}
    with pytest.raises(ConfigError, match=r"build.num_proc: must be in \[1, 1024\] .*got 0"):
        resolve("sql", project["configs"], None, None, 0, ())
    with pytest.raises(ConfigError, match=r"build.num_proc: must be in \[1, 1024\] .*got -2"):
        resolve("sql", project["configs"], None, None, -2, ())
    make = ["make", "-n", "-C", str(ROOT), "pretokenize", "BIN=bin", "VENV=/nonexistent"]
    zero = subprocess.run([*make, "NUM_PROC=0"], capture_output=True, text=True).stdout
    unset = subprocess.run(make, capture_output=True, text=True).stdout
    assert "--num-proc 0" in zero and "--num-proc" not in unset  # unset: the config's build.num_proc


class FakePool:
    """Stands in for a spawn pool: records its size, runs each task in this process."""

    sizes: list[int] = []
    _pool: list = []  # the processes it started (pool.py watches them for one that dies)
    _result_handler = threading.main_thread()  # the thread reading results back, alive (pool.py watches it)

    def __init__(self, processes, initializer=None):
        FakePool.sizes.append(processes)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False

    def apply_async(self, fn, args):
        result = fn(*args)
        return type("Done", (), {"get": lambda _, timeout=None: result})()


@pytest.mark.parametrize("tasks, num_proc, pool, said", [
    (1, 32, [], "num_proc 32 capped at 1: only 1 batch of rows (build.batch_rows each) to tokenize"),
    (3, 8, [3], "num_proc 8 capped at 3: only 3 batches of rows (build.batch_rows each) to tokenize"),
    (5, 4, [4], None),
    (0, 4, [], None),
])
def test_num_proc_is_capped_at_the_number_of_batches(monkeypatch, tasks, num_proc, pool, said):
    FakePool.sizes = []
    server = type("Server", (), {"context": lambda *_: type("Context", (), {
        "Pool": FakePool, "get_start_method": lambda _: "spawn"})()})()
    monkeypatch.setattr(tokenize_module, "encode_rows", lambda task, columns: (task, columns))
    lines = []
    task = typing.NamedTuple("Task", [("fast_encoder", None), ("line_cache", bool), ("i", int), ("batch_files", None)])
    out = list(tokenize_module.encode_stream(((task(None, False, i, None), {"i": i}) for i in range(tasks)),
                                             num_proc, server, lines.append))
    assert [(t.i, columns) for t, columns in out] == [(i, {"i": i}) for i in range(tasks)]
    assert FakePool.sizes == pool
    assert lines == ([said] if said else [])


def test_a_small_build_says_num_proc_was_capped(project):
    lines = []
    result = build(load_config("sql", project["configs"], {"build.num_proc": 32, "build.batch_rows": 1000}),
                   project["cache"], log=lines.append, progress=False)
    assert "num_proc 32 capped at 1: only 1 batch of rows (build.batch_rows each) to tokenize" in lines
    # the summary says the number used, not the setting (it said `tokenizing with num_proc=32`)
    report = json.loads((result.path / "report.json").read_text())
    assert (report["num_proc"], report["processes"]) == (32, 1)
    assert "tokenizing with num_proc=1 (build.num_proc 32, capped: 1 batch to tokenize)" in "\n".join(lines)


def dataset_dir(tmp_path) -> Path:
    directory = tmp_path / "dataset"
    write_jsonl(directory / "train.jsonl", [{"question": "q", "context": "c", "answer": "SELECT 1"}] * 40)
    write_jsonl(directory / "test.jsonl", [{"question": "q", "context": "c", "answer": "SELECT 2"}])
    write_jsonl(directory / "more" / "train.csv.zip", [])  # a zip archive: datasets reads it, packtrain does not
    (directory / "notes.txt").write_text("about the data\n")
    (directory / ".DS_Store").write_text("x")
    (directory / "dataset_info.json").write_text("{}")
    (directory / "train.csv").write_text("question,context,answer\nq,c,SELECT 3\n")
    return directory


def test_ignored_files_of_a_dataset_directory_are_named(tmp_path):
    directory = dataset_dir(tmp_path)
    source = resolve_source(SourceConfig(name=str(directory)))
    assert [p.name for p in source.files] == ["train.jsonl"]
    assert source.note == (
        "ignored 6 files: .DS_Store (hidden), dataset_info.json (dataset metadata), more/train.csv.zip (not a "
        ".parquet/.arrow/.jsonl/.json/.csv/.tsv file), notes.txt (not a .parquet/.arrow/.jsonl/.json/.csv/.tsv file), "
        "test.jsonl (another split), train.csv (the .jsonl files are read)")
    assert source.note in source.describe()


@pytest.mark.parametrize("where", ["inside", "same", "symlink"])
def test_a_cache_inside_the_dataset_directory_is_refused(project, tmp_path, where):
    directory = dataset_dir(tmp_path)
    cache = {"inside": directory / "cache", "same": directory, "symlink": tmp_path / "link" / "cache"}[where]
    if where == "symlink":
        (tmp_path / "link").symlink_to(directory)
    config = load_config("sql", project["configs"], {"sources": [{"name": str(directory)}]})
    with pytest.raises(BuildError) as err:
        build(config, cache, log=lambda _: None, progress=False)
    assert str(err.value) == (
        f"the cache directory {cache.resolve()} is inside the dataset directory {directory} (sources[0] of 'sql'): "
        f"the next build would read its own shards as data; set CACHE_DIR (--cache-dir) to a directory outside "
        f"{directory}")
    assert not (cache.resolve() / "sql" / "CURRENT").exists()


def test_a_cache_next_to_a_single_data_file_is_fine(project, tmp_path):
    directory = dataset_dir(tmp_path)
    config = load_config("sql", project["configs"], {"sources": [{"name": str(directory / "train.jsonl")}]})
    first = build(config, directory / "cache", log=lambda _: None, progress=False)
    again = build(config, directory / "cache", log=lambda _: None, progress=False)
    assert again.up_to_date and again.build_id == first.build_id


def assert_every_process_gone(group: int) -> None:
    """Every process of the build's session ``group`` (its workers, its fork server) exits within 20 s."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(group, signal.SIGKILL)
    pytest.fail("a process of the stopped build is still alive")


def test_ctrl_c_during_a_multi_process_build_is_one_line(tmp_path):
    """SIGINT to the whole process group, as Ctrl-C in a terminal sends it, once 4 workers are
    tokenizing (PACKTRAIN_INTERRUPT_AT=mid_tokenize): one line, exit 130, nothing left."""
    project = make_project(tmp_path, n_rows=3000)
    env = {**os.environ, "PACKTRAIN_INTERRUPT_AT": "mid_tokenize"}
    proc = subprocess.Popen([sys.executable, "-m", "packtrain.cli", "pretokenize", "sql", "--configs-dir",
                             str(project["configs"]), "--cache-dir", str(project["cache"]), "--num-proc", "4",
                             "--no-progress"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=ctrl_c_as_in_a_terminal)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert [line for line in err.splitlines() if line.strip()] == ["aborted"], err
    assert "line cache: " in out  # it got as far as tokenizing
    root = project["cache"] / "sql"
    assert sorted(p.name for p in root.iterdir()) == [".lock", ".sources", ".stat-cache.json"]
    # no source cache: only the remembered tokenizer facts (the encoder's proof, still running beside
    # tokenizing, was stopped unanswered: nothing remembered)
    assert sorted(p.name for p in (root / ".sources").iterdir()) == [".tokenizer-facts"]
    assert_every_process_gone(proc.pid)


@pytest.mark.parametrize("to_the_group", [True, False])
def test_sigterm_stops_a_multi_process_build_as_ctrl_c_does(tmp_path, to_the_group):
    """SIGTERM (systemd stopping a service: the whole group; `docker stop`, `kill`: the build's process
    alone) while the workers tokenize ended the process at once, silently, its temporary files left for
    the next build. Now: one line, exit 143, nothing left, every worker gone; the next build finishes."""
    project = make_project(tmp_path, n_rows=3000 if to_the_group else 20000)
    env = {**os.environ, **({"PACKTRAIN_INTERRUPT_AT": "mid_tokenize", "PACKTRAIN_INTERRUPT_WITH": "SIGTERM"}
                            if to_the_group else {})}
    proc = subprocess.Popen([sys.executable, "-m", "packtrain.cli", "pretokenize", "sql", "--configs-dir",
                             str(project["configs"]), "--cache-dir", str(project["cache"]), "--num-proc", "2",
                             "--no-progress", "--set", "build.batch_rows=200"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    if not to_the_group:
        for line in proc.stdout:
            if line.startswith("fast encoder: "):  # the workers are about to tokenize
                proc.send_signal(signal.SIGTERM)
                break
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert [line for line in err.splitlines() if line.strip()] == [
        "stopped by SIGTERM: what this build had written is removed (the last finished build is kept)"], err
    root = project["cache"] / "sql"
    assert not (root / "CURRENT").exists() and not [p for p in root.iterdir() if p.name.startswith(".tmp")]
    assert [p.name for p in (root / ".sources").iterdir() if p.name != ".tokenizer-facts"] == []
    assert_every_process_gone(proc.pid)
    config = load_config("sql", project["configs"], {"build.num_proc": 2})
    assert build(config, project["cache"], log=lambda _: None, progress=False).build_id
