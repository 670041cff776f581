"""Shared fixtures: hermetic HF caches built in a tmp dir with the layouts the real libraries write."""

from __future__ import annotations

import gc
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import run_shared
from build_fixtures import make_tokenizer
from format_fixtures import Builder
from packtrain.pipeline.encode import encoders

SQL_ROWS = [
    {"question": f"q{i}", "context": f"CREATE TABLE t{i} (x INT)", "answer": f"SELECT x FROM t{i}"}
    for i in range(5)
]
SQL_COMMIT = "a" * 40
PARQUET_COMMIT = "b" * 40
MODEL_COMMIT = "c" * 40

# One torch thread in every command a test runs (train.cpu_threads: auto honours it): the count auto
# would choose follows the load average, and two runs a test compares must add in the same order.
os.environ["OMP_NUM_THREADS"] = "1"

# No store of fast-encoder proofs outside a test (pipeline/encode/machine_notes.py): each test gets its own
# (_hermetic_models), and a test that undoes its monkeypatch falls back to none, never to this machine's.
os.environ["PACKTRAIN_PROOFS_DIR"] = "off"
os.environ["PACKTRAIN_NEAR_TABLES_DIR"] = "off"  # the same for near dedup's token tables (pipeline/pack/near_tables.py)

# The Makefile as a fresh clone has it in every `make` a test runs. A make puts its command line's variables
# (`make test-latest` runs `make test VENV=.venv-latest LOCK_DIR=.venv-latest`) into its recipes' environment and
# into MAKEFLAGS, and every make below reads them there: a test's `make -n train` planned .venv-latest/bin/packtrain
# instead of the Makefile's .venv/bin/packtrain. Both go, with make's other variables.
def _forget_the_make_above() -> None:
    flags = re.split(r"(?:^| )-- ", os.environ.get("MAKEFLAGS", ""), maxsplit=1)  # after " -- ": NAME=value ...
    for assignment in re.split(r"(?<!\\) ", flags[1]) if len(flags) == 2 else ():  # a value's spaces are escaped
        os.environ.pop(re.match(r"[^:+?!=]*", assignment).group(), None)
    for name in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES"):
        os.environ.pop(name, None)


_forget_the_make_above()


# A test process keeps the encoders of 16 tokenizers (a build process keeps one): test after test it
# builds with the three real ones (loading Qwen's for fastokens takes 1-2 s) and tiny ones in between.
encoders.KEPT = 16


# The test files that take longest (10 s and more on 2 workers, measured 2026-11-26), longest first:
# `make test` hands files to its workers in collection order (--no-loadscope-reorder), so these start
# first and the run ends on short files instead of one worker waiting for the other's long one.
LONGEST_FIRST = ("test_exactness.py", "test_bench_contenders.py", "test_reliability_encoder_decision.py", "test_reliability_build.py",
                 "test_ray_build.py", "test_chat_tools.py", "test_console.py", "test_chat_tool_templates.py",
                 "test_bpe_fast.py", "test_reliability_runs_inputs.py", "test_trainer_fsdp.py",
                 "test_experiments.py", "test_fastokens.py")


def pytest_collection_modifyitems(items):
    """The files of :data:`LONGEST_FIRST` first, in its order; the others after, as collected."""
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_collection_finish(session):
    """Every test module is imported, and torch and transformers with them: freeze
    what is alive now, so that the automatic full garbage collections stop walking those ~450k
    long-lived objects (0.26 s each with torch loaded). What the tests create later is collected as
    before."""
    gc.collect()
    gc.freeze()


@pytest.fixture
def hf_home(tmp_path, monkeypatch) -> Path:
    """An empty HF_HOME with hub/ and datasets/ caches, set in the environment (read at call time)."""
    home = tmp_path / "hf"
    (home / "hub").mkdir(parents=True)
    (home / "datasets").mkdir()
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(home / "datasets"))
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    return home


def write_hub_repo(hub: Path, repo_type: str, repo_id: str, commit: str, files: dict[str, bytes],
                   refs: tuple[str, ...] = ("main",)) -> Path:
    """Lay out a repo as huggingface_hub's downloads do; returns the snapshot directory::

        datasets--org--name/blobs/<sha256>
                           /snapshots/<commit>/<path> -> ../../blobs/<sha256>   (relative symlink)
                           /refs/main                                           (the commit hash)
    """
    repo = hub / f"{repo_type}s--{repo_id.replace('/', '--')}"
    for rel, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return repo / "snapshots" / commit


def parquet_bytes(columns: dict[str, list]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


def tiny_tokenizer_json() -> bytes:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<eos>": 1, "select": 2, "from": 3, "x": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok.to_str().encode()


@pytest.fixture
def hub_cache(hf_home) -> SimpleNamespace:
    """Two dataset repos and one model repo in the hub cache:

    - ``b-mc2/sql-create-context``: one JSON array file (no split in its name), 5 rows;
    - ``org/parquet-ds``: data/train-00000-of-00001.parquet (3 rows) + data/test-... (2 rows);
    - ``org/tiny-model``: tokenizer.json + config.json.
    """
    hub = hf_home / "hub"
    sql = write_hub_repo(hub, "dataset", "b-mc2/sql-create-context", SQL_COMMIT, {
        "sql_create_context_v4.json": json.dumps(SQL_ROWS, indent=1).encode(),
        "README.md": b"# sql-create-context\n",
        ".gitattributes": b"*.json filter=lfs\n",
    })
    parquet = write_hub_repo(hub, "dataset", "org/parquet-ds", PARQUET_COMMIT, {
        "data/train-00000-of-00001.parquet": parquet_bytes({"text": ["t0", "t1", "t2"], "n": [0, 1, 2]}),
        "data/test-00000-of-00001.parquet": parquet_bytes({"text": ["e0", "e1"], "n": [10, 11]}),
        "README.md": b"---\nconfigs: []\n---\n",
    })
    model = write_hub_repo(hub, "model", "org/tiny-model", MODEL_COMMIT, {
        "tokenizer.json": tiny_tokenizer_json(),
        "config.json": json.dumps({"model_type": "llama", "vocab_size": 5}).encode(),
    })
    return SimpleNamespace(home=hf_home, hub=hub, sql=sql, parquet=parquet, model=model)


@pytest.fixture(autouse=True)
def _hermetic_models(tmp_path_factory, monkeypatch):
    """No test reads this machine's converted models (PACKTRAIN_MODELS_DIR) or its store of fast-encoder
    proofs (PACKTRAIN_PROOFS_DIR: each test has its own, in its models directory), and the shipped configs
    (model.name: smollm2-135m) run on the bundled random demo model unless a test names another
    (PACKTRAIN_MODEL replaces defaults.yaml's model.name, under the expert's own file; subprocesses
    inherit it)."""
    monkeypatch.setenv("PACKTRAIN_MODELS_DIR", str(tmp_path_factory.mktemp("models")))
    monkeypatch.setenv("PACKTRAIN_MODEL", "bundled")
    monkeypatch.delenv("PACKTRAIN_PROOFS_DIR", raising=False)  # the store of fast-encoder proofs: the default, in those models
    monkeypatch.delenv("PACKTRAIN_NEAR_TABLES_DIR", raising=False)  # near dedup's token tables: the same


def _quiet_datasets():
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


@pytest.fixture
def prepared_dataset(hf_home, tmp_path) -> Path:
    """``org/prepared-ds`` in the datasets cache, prepared by the real ``datasets`` builder (train: 5 rows
    in 2 shards, test: 2 rows), then given a hub dataset's names (``org___prepared-ds/.../prepared-ds-train-*``)."""
    datasets = _quiet_datasets()
    raw = tmp_path / "raw"
    raw.mkdir()
    for name, rows in {"a": SQL_ROWS[:3], "b": SQL_ROWS[3:], "t": SQL_ROWS[:2]}.items():
        (raw / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    builder = datasets.load_dataset_builder(
        "json", data_files={"train": [str(raw / "a.jsonl"), str(raw / "b.jsonl")], "test": str(raw / "t.jsonl")},
        cache_dir=str(hf_home / "datasets"))  # datasets reads HF_DATASETS_CACHE once, at import
    builder.download_and_prepare(num_proc=2)
    cache = hf_home / "datasets"
    (cache / "json").rename(cache / "org___prepared-ds")
    prepared = next((cache / "org___prepared-ds").glob("*/*/*/dataset_info.json")).parent
    for arrow in prepared.glob("json-*.arrow"):
        arrow.rename(prepared / arrow.name.replace("json-", "prepared-ds-", 1))
    return prepared


@pytest.fixture
def saved_datasets(tmp_path) -> SimpleNamespace:
    """A ``save_to_disk`` Dataset (5 rows) and DatasetDict (train 5 rows, test 2 rows)."""
    datasets = _quiet_datasets()
    train = datasets.Dataset.from_list(SQL_ROWS)
    test = datasets.Dataset.from_list(SQL_ROWS[:2])
    train.save_to_disk(str(tmp_path / "saved_ds"))
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "saved_dd"))
    return SimpleNamespace(dataset=tmp_path / "saved_ds", dataset_dict=tmp_path / "saved_dd")


@pytest.fixture(scope="module", autouse=True)
def signal_handlers_as_found():
    """Each test module leaves SIGTERM's and SIGINT's handlers as it found them: a handler left in the test
    process outlives its module, in this worker and in every process a later test forks (ray.init's SIGTERM
    handler, left by a module fixture, kept a datasets multiprocess pool's workers alive through its
    terminate(): the suite hung at 95%)."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    left = {sig.name: handler for sig, handler in before.items() if signal.getsignal(sig) != handler}
    assert not left, f"the module changed the handlers of {sorted(left)} and left them: restore them when done"


@pytest.fixture(scope="session", autouse=True)
def _run_shared(tmp_path_factory):
    """Where the test processes of this run share what they make once (tests/run_shared.py)."""
    run_shared.set_root(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="session")
def real_tokenizer():
    """``real_tokenizer(name)``: the directory of a real tokenizer (tests/real_tokenizers.py), made once
    per run, whichever worker asks first (read it, never write it: every test of the run shares it)."""
    from real_tokenizers import make_real_tokenizer

    def get(name: str) -> Path:
        return run_shared.made_once(f"tokenizer-{name}", lambda directory: make_real_tokenizer(name, directory))

    return get


# --- builders for the format tests (test_dataset_formats, test_chat_tools, test_chat_tool_templates) ---


@pytest.fixture(scope="module")
def real_builder(real_tokenizer, tmp_path_factory):
    made = {}

    def get(name: str) -> Builder:
        if name not in made:
            made[name] = Builder(tmp_path_factory.mktemp(f"formats-{name}"), real_tokenizer(name))
        return made[name]

    return get


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Builder:
    root = tmp_path_factory.mktemp("formats-tiny")
    return Builder(root, make_tokenizer(root / "model"))


@pytest.fixture(scope="module")
def qwen(real_builder):
    """The builder over Qwen3's real tokenizer, and the HF tokenizer (the reference)."""
    from transformers import AutoTokenizer

    builder = real_builder("qwen3")
    return builder, AutoTokenizer.from_pretrained(str(builder.tokenizer))


@pytest.fixture(scope="module")
def templated(real_tokenizer, tmp_path_factory):
    """``templated(name)``: a builder over Qwen3's tokenizer with the chat template of
    tests/chat_templates/<name>.jinja (or ``chat_template`` as given), its turns ending with Qwen's
    end-of-turn token (the build appends the EOS to a document that ends otherwise), and the HF tokenizer."""
    from transformers import AutoTokenizer

    made = {}

    def get(name: str, chat_template=None):
        if name not in made:
            directory = tmp_path_factory.mktemp(f"tools-{name}") / "tokenizer"
            shutil.copytree(real_tokenizer("qwen3"), directory)
            config = json.loads((directory / "tokenizer_config.json").read_text())
            config["chat_template"] = chat_template or (Path(__file__).parent / "chat_templates" / f"{name}.jinja"
                                                        ).read_text().replace("<|eot_id|>", "<|im_end|>")
            (directory / "tokenizer_config.json").write_text(json.dumps(config))
            builder = Builder(directory.parent, directory)
            made[name] = builder, AutoTokenizer.from_pretrained(str(directory))
        return made[name]

    return get


@pytest.fixture
def read_only_disk(tmp_path):
    """A tmpfs at ``tmp_path/disk``: ``remount()`` makes it read-only (skipped where mount is not allowed)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.decode().strip()}): the read-only cache test needs it")
    try:
        yield disk, lambda: subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    finally:
        subprocess.run(["umount", str(disk)], check=True)
