"""Issue 5, the build half: what the build id does and does not depend on. Every input that can
change the output changes it (one source byte, the tokenizer's files, the packing settings, the
format version); touching mtimes, moving the project or another process does not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

import packtrain.core.contract
import packtrain.pipeline.orchestrate.build
from build_fixtures import BUILD_SCRIPT, SQL_CONFIG, make_relative_project, rows, seed_decision, write_jsonl
from packtrain.pipeline.orchestrate.build import build
from packtrain.core.configfile import load_config
from packtrain.core.contract import Manifest, verify_checksums


def quiet(*_):
    pass


def write_config(project_dir: Path, sources: list[str], block_size: int = 128) -> None:
    (project_dir / "configs" / "sql.yaml").write_text(SQL_CONFIG.format(
        data="\n  - name: ".join(sources), model="model", block_size=block_size, val_fraction=0.1))


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A project with two sources, named by relative paths, and its build id."""
    directory = tmp_path_factory.mktemp("template")
    make_relative_project(directory)
    write_jsonl(directory / "data" / "extra.jsonl", rows(30, start=500))
    write_config(directory, ["data/sql.jsonl", "data/extra.jsonl"])
    seed_decision(directory / "cache", directory / "model")
    return directory


def build_from(directory: Path) -> str:
    """Build from ``directory`` as the working directory (its config names relative paths)."""
    cwd = os.getcwd()
    os.chdir(directory)
    try:
        return build(load_config("sql", "configs"), "cache", log=quiet, progress=False).build_id
    finally:
        os.chdir(cwd)


@pytest.fixture
def copy(template, tmp_path):
    """A fresh copy of the template (inputs only) and the template's build id."""
    directory = tmp_path / "project"
    for name in ("data", "model", "configs"):
        shutil.copytree(template / name, directory / name)
    seed_decision(directory / "cache", directory / "model")  # as a first build leaves it (proven once per content)
    return directory, build_from(template)


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def flip_source_byte(d: Path) -> None:
    """One byte of a source, same size, and the modification time put back: content decides."""
    path = d / "data" / "sql.jsonl"
    stat = path.stat()
    data = path.read_bytes()
    at = data.index(b"t1 ")
    path.write_bytes(data[:at + 1] + b"2" + data[at + 2:])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def add_special_token(d: Path) -> None:
    tokenizer = Tokenizer.from_file(str(d / "model" / "tokenizer.json"))
    tokenizer.add_special_tokens(["<|extra|>"])
    tokenizer.save(str(d / "model" / "tokenizer.json"))


def add_vocab_entry(d: Path) -> None:
    def change(t):
        t["model"]["vocab"]["zzqq"] = max(t["model"]["vocab"].values()) + 1
    edit_json(d / "model" / "tokenizer.json", change)


def set_format_version(monkeypatch) -> None:
    monkeypatch.setattr(packtrain.pipeline.orchestrate.build, "FORMAT_VERSION", packtrain.core.contract.FORMAT_VERSION + 1)
    monkeypatch.setattr(packtrain.core.contract, "FORMAT_VERSION", packtrain.core.contract.FORMAT_VERSION + 1)


CHANGES = {
    "one-source-byte": flip_source_byte,
    "source-added": lambda d: (write_jsonl(d / "data" / "more.jsonl", rows(10, start=900)),
                               write_config(d, ["data/sql.jsonl", "data/extra.jsonl", "data/more.jsonl"])),
    "source-removed": lambda d: write_config(d, ["data/sql.jsonl"]),
    "vocab": add_vocab_entry,
    "merges": lambda d: edit_json(d / "model" / "tokenizer.json", lambda t: t["model"]["merges"].pop()),
    "special-token-added": add_special_token,
    "chat-template": lambda d: edit_json(d / "model" / "tokenizer_config.json",
                                         lambda c: c.update(chat_template=c["chat_template"] + "\n")),
    "eos-id": lambda d: edit_json(d / "model" / "tokenizer_config.json", lambda c: c.update(eos_token="<|im_end|>")),
    "pad-id": lambda d: edit_json(d / "model" / "tokenizer_config.json", lambda c: c.update(pad_token="<|im_start|>")),
    "block-size": lambda d: write_config(d, ["data/sql.jsonl", "data/extra.jsonl"], block_size=64),
    "packing-strategy": lambda d: (d / "configs" / "sql.yaml").write_text(
        (d / "configs" / "sql.yaml").read_text().replace("pack:\n", "pack:\n  strategy: wrap\n")),
    "format-version": None,  # monkeypatched
}


@pytest.fixture(scope="module")
def changed(template, tmp_path_factory) -> dict[str, tuple[str, str, list]]:
    """Each change of CHANGES made to its own copy of the template and built once, both tests below
    read what it gave: change -> (build id, the build id its manifest holds, its checksum mismatches),
    read back while the change holds (format-version: a manifest of another version); "base": the
    template's own build id."""
    builds = {"base": (build_from(template), None, None)}
    for change, apply in CHANGES.items():
        directory = tmp_path_factory.mktemp(change)
        for name in ("data", "model", "configs"):
            shutil.copytree(template / name, directory / name)
        seed_decision(directory / "cache", directory / "model")  # a changed tokenizer is proven again
        with pytest.MonkeyPatch.context() as m:
            set_format_version(m) if apply is None else apply(directory)
            build_id = build_from(directory)
            build_dir = directory / "cache" / "sql" / build_id
            manifest = Manifest.load(build_dir)
            builds[change] = build_id, manifest.build_id, verify_checksums(build_dir, manifest)
    return builds


@pytest.mark.parametrize("change", list(CHANGES))
def test_build_id_changes_with_every_input(changed, change):
    build_id, manifest_id, mismatches = changed[change]
    assert build_id != changed["base"][0]
    assert manifest_id == build_id and mismatches == []


def test_build_id_changes_are_all_distinct(changed):
    ids = {change: build_id for change, (build_id, _, _) in changed.items()}
    assert len(set(ids.values())) == len(ids), ids


@pytest.mark.parametrize("same", ["touched-mtime", "moved-project", "fresh-process"])
def test_build_id_stays_without_a_content_change(copy, tmp_path, same):
    directory, base = copy
    if same == "touched-mtime":
        assert build_from(directory) == base
        for path in directory.rglob("*"):
            os.utime(path, (1_000_000, 1_000_000))
        cwd = os.getcwd()
        os.chdir(directory)
        try:  # same id, and nothing to do
            assert build(load_config("sql", "configs"), "cache", log=quiet, progress=False).up_to_date
        finally:
            os.chdir(cwd)
    elif same == "moved-project":
        moved = tmp_path / "elsewhere" / "checkout"
        shutil.move(str(directory), str(moved))
        assert build_from(moved) == base
    else:
        proc = subprocess.run([sys.executable, "-c", BUILD_SCRIPT, "configs", "cache", "-", "{}"], cwd=directory,
                              capture_output=True)
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
        assert json.loads(proc.stdout)["build_id"] == base
