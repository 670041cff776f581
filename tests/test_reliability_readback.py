"""Issue 12, class 2: every file that packtrain wrote and reads back is checked before it is used.

What cannot be rebuilt here (CURRENT for read-only commands, a build's manifest.json and config.json,
run files, checkpoint state) gives one line naming the file and the fix, never a traceback; manifest
shard names are plain file names only. The checked reader itself is tested with literal messages.
(Damaged caches, rebuilt and said once: test_reliability_reuse.py.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from build_fixtures import rows, write_jsonl
from reuse_fixtures import flip_byte, reuse_project, run_build, run_cli
from packtrain.core.contract import Manifest, read_current
from packtrain.core.errors import ContractError
from packtrain.core.inputs import read_json
from packtrain.core.schema import COUNT, FILE_NAME, MapOf, TEXT, schema_problem
from packtrain.pipeline.orchestrate.rebuild import prune_builds
from packtrain.pipeline.review.status import expert_status


@pytest.fixture
def project(tmp_path):
    return reuse_project(tmp_path)


# ----------------------------------------------------------------------------------------------
# CURRENT: damaged is one line (read-only commands) or rewritten (pretokenize, rebuild)

CURRENT_CASES = {"not-utf8": b"\xff\xfe\x9c0123456789abcdef\n", "empty": b"", "short": b"0123\n",
                 "text": b"latest\n", "nul": b"\x00" * 16}


@pytest.mark.parametrize("case", CURRENT_CASES)
@pytest.mark.parametrize("command", ["verify", "inspect", "status", "train", "pretokenize", "rebuild"])
def test_a_damaged_current_is_one_line_or_rewritten(project, monkeypatch, capsys, case, command):
    reference, _ = run_build(project)
    current = project["cache"] / "sql" / "CURRENT"
    current.write_bytes(CURRENT_CASES[case])
    where = ["--cache-dir", project["cache"]]
    configs = ["--configs-dir", project["configs"]]
    args = {"verify": ["verify", "sql", *where], "inspect": ["inspect", "sql", *where],
            "status": ["status", "sql", *configs, *where], "train": ["train", "sql", *configs, *where],
            "pretokenize": ["pretokenize", "sql", *configs, *where, "--no-progress"],
            "rebuild": ["rebuild", "sql", *configs, *where]}[command]
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert "Traceback" not in out + err
    if command in ("verify", "inspect", "train"):
        assert code == 2
        assert err.count("\n") == 1 and err.startswith("error: ")
        assert f"{current} is damaged" in err and "`packtrain pretokenize sql " in err
    elif command == "status":
        assert code == 0 and f"{current} is damaged" in out
    else:  # the builders rewrite it, and say so
        assert code == 0 and read_current(project["cache"], "sql") == reference.build_id
        assert "CURRENT is damaged" in out + err or f"{current} is damaged" in out + err


def test_current_that_is_a_directory_is_one_line(project, monkeypatch, capsys):
    run_build(project)
    current = project["cache"] / "sql" / "CURRENT"
    current.unlink()
    current.mkdir()
    code, out, err = run_cli(monkeypatch, capsys, "verify", "sql", "--cache-dir", project["cache"])
    assert code == 2 and err.count("\n") == 1 and f"{current} cannot be read" in err


# ----------------------------------------------------------------------------------------------
# manifest.json: every field has its type; shard names are plain names inside the build directory


def set_field(manifest: dict, where: str, value) -> dict:
    *path, last = where.split(".")
    node = manifest
    for key in path:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return manifest


MANIFEST_CASES = [  # (field, value, what the error says)
    ("inputs.pack.block_size", "128", "field inputs.pack.block_size is '128', expected an integer > 0"),
    ("inputs.pack.block_size", 128.5, "field inputs.pack.block_size is 128.5, expected an integer > 0"),
    ("inputs.tokenizer.vocab_size", None, "field inputs.tokenizer.vocab_size is None, expected an integer > 0"),
    ("inputs.tokenizer.eos_id", True, "field inputs.tokenizer.eos_id is True, expected an integer >= 0"),
    ("inputs.tokenizer.pad_id", -1, "field inputs.tokenizer.pad_id is -1, expected an integer >= 0"),
    ("outputs.shards.train", {"file": "x"}, "field outputs.shards.train is {'file': 'x'}, expected a list"),
    ("outputs.shards.train.0.rows", "3", "field outputs.shards.train[0].rows is '3', expected an integer >= 0"),
    ("outputs.shards.train.0.bytes", -5, "field outputs.shards.train[0].bytes is -5, expected an integer >= 0"),
    ("outputs.shards.val.0.sha256", 7, "field outputs.shards.val[0].sha256 is 7, expected a sha256"),
    ("outputs.token_dtype", "float32", "field outputs.token_dtype is 'float32', expected 'uint16' or 'uint32'"),
    ("outputs.token_dtype", "uint32", "field outputs.token_dtype is 'uint32', but a vocabulary of 400 tokens"),
    ("build_id", "0000000000000000", "field build_id is '0000000000000000', but the build directory is"),
    ("build_id", 12, "field build_id is 12, expected a build id"),
    ("expert", ["sql"], "field expert is ['sql'], expected an expert name"),
    ("outputs.totals.train.tokens", "many", "field outputs.totals.train.tokens is 'many', expected an integer"),
    ("inputs.tokenizer", "x", "field inputs.tokenizer is 'x', expected an object"),
]
NAMES = ["../../etc/passwd", "/etc/passwd", "..", ".", ".hidden", "sub/train-00000.arrow", "a\\b",
         "train-00000.arrow\n", "", "~root"]


def damaged_manifest(project, change) -> Path:
    result, _ = run_build(project)
    path = result.path / "manifest.json"
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return path


def assert_refused(project, monkeypatch, capsys, path: Path, says: str) -> None:
    """verify, inspect and status each name the manifest and the problem, in one line, no traceback."""
    for command in ("verify", "inspect"):
        code, out, err = run_cli(monkeypatch, capsys, command, "sql", "--cache-dir", project["cache"])
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
        assert f"{path} is damaged (" in err and says in err
        assert f"delete {path.parent} and rebuild it with `packtrain pretokenize sql --cache-dir {project['cache']}`" in err
    code, out, err = run_cli(monkeypatch, capsys, "status", "sql", "--configs-dir", project["configs"],
                               "--cache-dir", project["cache"])
    assert code == 0 and says in out and "Traceback" not in out + err
    with pytest.raises(ContractError, match="is damaged"):
        Manifest.load(path.parent, full=True)


@pytest.mark.parametrize("field,value,says", MANIFEST_CASES, ids=[f"{f}={v!r}" for f, v, _ in MANIFEST_CASES])
def test_a_manifest_with_a_wrong_field_is_one_line(project, monkeypatch, capsys, field, value, says):
    path = damaged_manifest(project, lambda m: set_field(m, field, value))
    assert_refused(project, monkeypatch, capsys, path, says)


@pytest.mark.parametrize("name", NAMES, ids=repr)
def test_a_shard_name_outside_the_build_directory_is_refused_everywhere(project, monkeypatch, capsys, name):
    path = damaged_manifest(project, lambda m: set_field(m, "outputs.shards.train.0.file", name))
    read = []
    monkeypatch.setattr("packtrain.core.contract.sha256_file", lambda p, *a: read.append(p) or "0" * 64)
    assert_refused(project, monkeypatch, capsys, path,
                   f"field outputs.shards.train[0].file is {name!r}, expected a plain file name")
    assert read == []  # nothing was opened through that name
    monkeypatch.undo()
    _, lines = run_build(project)  # the builder does not reuse it either: rebuilt from its sources
    assert any("is damaged" in line and "plain file name" in line for line in lines)
    assert Manifest.load(path.parent).train[0].file == "train-00000.arrow"


def test_a_shard_listed_twice_is_refused(project, monkeypatch, capsys):
    def twice(m):
        m["outputs"]["shards"]["val"] = [m["outputs"]["shards"]["train"][0]]
        return m
    path = damaged_manifest(project, twice)
    assert_refused(project, monkeypatch, capsys, path, "a shard file is listed twice")


@pytest.mark.parametrize("text,says", [
    ("[]", "the top level is [], expected an object"),
    ('"manifest"', "the top level is 'manifest', expected an object"),
    ('{"format_version": 1, "build_id"', "not valid JSON"),
    ("\udcff", "not UTF-8 text"),
    ('{"format_version": "1"}', "field format_version is '1', expected an integer"),
    ('{"format_version": 1}', "field build_id is missing"),
    ("[" * 100000, "not valid JSON"),
])
def test_a_manifest_that_is_not_a_manifest_is_one_line(project, monkeypatch, capsys, text, says):
    result, _ = run_build(project)
    path = result.path / "manifest.json"
    path.write_bytes(text.encode("utf-8", errors="surrogateescape"))
    assert_refused(project, monkeypatch, capsys, path, says)


# ----------------------------------------------------------------------------------------------
# A build's config.json (read by inspect), run.json (status), checkpoint state.json (retention)


@pytest.mark.parametrize("text,says", [
    ('{"model": {"name": 5}}', "field model.name is 5, expected a string"),
    ('{"model": "bundled"}', "field model is 'bundled', expected an object"),
    ('{"train": {}}', "field model is missing"),
    ('{"model": {"name": "x", "tokenizer": 1, "revision": null}}', "field model.tokenizer is 1, expected a string or null"),
    ('{"model": {', "not valid JSON"),
    ("[1]", "the top level is [1], expected an object"),
])
def test_a_damaged_build_config_is_one_line_in_inspect(project, monkeypatch, capsys, text, says):
    result, _ = run_build(project)
    path = result.path / "config.json"
    path.write_text(text)
    code, out, err = run_cli(monkeypatch, capsys, "inspect", "sql", "--cache-dir", project["cache"])
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"{path} is damaged ({says}" in err and f"`packtrain pretokenize sql --cache-dir {project['cache']}`" in err
    path.unlink()
    code, out, err = run_cli(monkeypatch, capsys, "inspect", "sql", "--cache-dir", project["cache"])
    assert code == 2 and f"{path} is missing" in err


@pytest.mark.parametrize("text", ["[]", '"x"', "{", "\udcff", '{"build_id": ["a"]}', "null"])
def test_a_damaged_run_json_does_not_break_status(project, text):
    built, _ = run_build(project)
    good = project["runs"] / "sql" / "20261122-000000-good"
    bad = project["runs"] / "sql" / "20261123-000000-bad"
    for run_dir in (good, bad):
        run_dir.mkdir(parents=True)
    (good / "run.json").write_text(json.dumps({"build_id": built.build_id}))
    (good / "summary.json").write_text("{}")
    (bad / "run.json").write_bytes(text.encode("utf-8", errors="surrogateescape"))
    (status,) = expert_status("sql", project["configs"], project["cache"], {"train.output_dir": str(project["runs"])})
    assert status["last_run"] == "20261122-000000-good" and "error" not in status


@pytest.mark.parametrize("text", ["[]", "{", '{"step": 3}', '{"build_id": 7}', '{"build_id": "../x"}', "\udcff"])
def test_a_damaged_checkpoint_state_prunes_nothing(project, text):
    ids = []
    for n in (40, 41, 42):
        write_jsonl(project["data"], rows(n))
        ids.append(run_build(project)[0].build_id)
    checkpoint = project["runs"] / "sql" / "run-1" / "checkpoint-10"
    checkpoint.mkdir(parents=True)
    (checkpoint / "state.json").write_bytes(text.encode("utf-8", errors="surrogateescape"))
    with pytest.raises(ContractError, match=rf"{re.escape(str(checkpoint / 'state.json'))} is damaged .*no build of sql is pruned"):
        prune_builds(project["cache"], "sql", keep=1, runs_dir=project["runs"] / "sql")
    left = sorted(p.name for p in (project["cache"] / "sql").iterdir() if p.is_dir() and not p.name.startswith("."))
    assert left == sorted(ids)  # the checkpoint may need any of them: nothing was deleted
    (checkpoint / "state.json").write_text(json.dumps({"build_id": ids[0]}))
    assert sorted(prune_builds(project["cache"], "sql", keep=1, runs_dir=project["runs"] / "sql")) == [ids[1]]


# ----------------------------------------------------------------------------------------------
# The mechanism itself: literal messages, so it can fail


def test_schema_problem_names_the_first_bad_field():
    schema = {"a": {"b": [COUNT]}, "name": FILE_NAME, "m": MapOf(TEXT, COUNT)}
    assert schema_problem({"a": {"b": [1, 2]}, "name": "x.arrow", "m": {"k": 0}}, schema) is None
    assert schema_problem({"a": {"b": [1, -2]}, "name": "x", "m": {}}, schema) == \
        "field a.b[1] is -2, expected an integer >= 0"
    assert schema_problem({"a": {"b": [1]}, "name": "../x", "m": {}}, schema) == \
        "field name is '../x', expected a plain file name (no directory part)"
    assert schema_problem({"a": {"b": []}, "name": "x", "m": {"k": "1"}}, schema) == \
        "field m['k'] is '1', expected an integer >= 0"
    assert schema_problem({"a": {}, "name": "x", "m": {}}, schema) == "field a.b is missing"
    assert schema_problem(3, schema) == "the top level is 3, expected an object"


def test_read_json_names_the_file_the_problem_and_the_fix(tmp_path):
    path = tmp_path / "f.json"
    path.write_text('{"n": "1"}')
    with pytest.raises(ContractError) as e:
        read_json(path, "do X", schema={"n": COUNT})
    assert str(e.value) == f"{path} is damaged (field n is '1', expected an integer >= 0); do X"
    path.write_text('{"n": 1}')
    assert read_json(path, "do X", schema={"n": COUNT}) == {"n": 1}


@pytest.mark.parametrize("text,says", [
    ('{"step": "3"}', "field step is '3', expected int >= 0"),
    ('{"step": 3, "position": -1}', "field position is -1, expected int >= 0"),
    ('{"build_id": 5}', "field build_id is 5, expected str"),
    ('{"world_size": true}', "field world_size is True, expected int >= 0"),
    ("[]", "argument after ** must be a mapping"),
    ('{"step": 3, "lr": 1}', "unexpected keyword argument 'lr'"),
])
def test_a_checkpoint_state_with_wrong_types_is_refused_naming_the_file(tmp_path, text, says):
    from packtrain.trainer.run.checkpoint import CheckpointError, read_state

    (tmp_path / "state.json").write_text(text)
    with pytest.raises(CheckpointError) as e:
        read_state(tmp_path)
    assert f"checkpoint file {tmp_path / 'state.json'} is corrupt" in str(e.value) and says in str(e.value)
    assert "--resume PATH" in str(e.value)


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "adapter/../../x", "a\\b", "./state.json", ""])
def test_checkpoint_checksums_naming_a_file_outside_are_refused(tmp_path, monkeypatch, name):
    import packtrain.trainer.run.checkpoint
    from packtrain.trainer.run.checkpoint import CheckpointError, verify_checkpoint

    read = []
    monkeypatch.setattr(packtrain.trainer.run.checkpoint, "sha256_file", lambda p: read.append(p) or "0" * 64)
    (tmp_path / "checksums.json").write_text(json.dumps({"state.json": "0" * 64, name: "0" * 64}))
    (tmp_path / "state.json").write_text("{}")
    with pytest.raises(CheckpointError) as e:
        verify_checkpoint(tmp_path)
    assert str(e.value) == (f"checkpoint file {tmp_path / 'checksums.json'} is corrupt (it names {name!r}, not a file "
                            "inside the checkpoint); resume from another checkpoint with --resume PATH or start a new run")
    assert read == []


def test_damaged_metrics_lines_are_dropped_on_resume(tmp_path):
    from packtrain.trainer.report.metrics import MetricsFile

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n[1, 2]\n{"step": "2"}\n"text"\n\xff\xfe\n{"step": 3}\n'
                     b'{"step": 2, "loss": 1.5}\n{"step": 2, "lo')
    MetricsFile(path, truncate_after_step=2).close()
    assert path.read_text() == '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n'


def test_inspect_refuses_a_shard_that_differs_from_its_sha256(project, monkeypatch, capsys):
    result, _ = run_build(project)
    flip_byte(result.path / "train-00000.arrow")
    code, out, err = run_cli(monkeypatch, capsys, "inspect", "sql", "--cache-dir", project["cache"])
    assert code == 2 and err.count("\n") == 1
    assert err == (f"error: shard {result.path / 'train-00000.arrow'} differs from its sha256 in the manifest "
                   f"(corrupt); delete {result.path} and rebuild it with `packtrain pretokenize sql --cache-dir "
                   f"{project['cache']}`\n")
