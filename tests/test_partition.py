"""Partitioned builds: parts tokenized apart and merged give the single-machine build, byte for byte."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from build_fixtures import make_project, rows, seed_decision, write_jsonl
from packtrain.pipeline.orchestrate.build import SOURCES, build
from packtrain.pipeline.errors import BuildError
from packtrain.core.configfile import load_config
from packtrain.core.contract import read_current
from packtrain.pipeline.orchestrate.partition import PARTS, merge, parse_part, pretokenize_part

ROOT = Path(__file__).resolve().parents[1]


def quiet(*_):
    pass


@pytest.fixture
def project(tmp_path):
    project = make_project(tmp_path, n_rows=90)  # batch_rows 16: 6 batches per source
    records = rows(90)
    records[20]["answer"] = None  # a bad row in batch 1 and one in batch 4
    records[70]["question"] = None
    write_jsonl(project["data"], records)
    second = write_jsonl(project["data"].parent / "more.jsonl", rows(40, start=300))
    config = project["configs"] / "sql.yaml"
    config.write_text(config.read_text().replace(f"  - name: {project['data']}\n",
                                                 f"  - name: {project['data']}\n  - name: {second}\n"))
    return project


def config_of(project):
    return load_config("sql", project["configs"])


def files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.suffix in (".arrow", ".json") and p.name != "report.json"}


def test_three_machines_then_merge_equals_one_machine(project, tmp_path):
    for cache in ("one", "machine0", "machine1", "machine2"):
        seed_decision(tmp_path / cache, project["model"])
    single = build(config_of(project), tmp_path / "one", log=quiet, progress=False)
    # three "machines", each with its own cache; their parts are then copied into one cache
    for i in range(3):
        result = pretokenize_part(config_of(project), tmp_path / f"machine{i}", (i, 3), log=quiet)
        assert result["build_id"] == single.build_id and len(result["tokenized"]) == 2
        assert read_current(tmp_path / f"machine{i}", "sql") is None  # a part publishes nothing
        shutil.copytree(tmp_path / f"machine{i}" / "sql" / SOURCES / PARTS, project["cache"] / "sql" / SOURCES / PARTS,
                        dirs_exist_ok=True)
    merged = merge(config_of(project), project["cache"], 3, log=quiet)
    assert merged.build_id == single.build_id and not merged.up_to_date
    assert files(merged.path) == files(single.path)  # shards, manifest and config: same bytes
    report, reference = (json.loads((p / "report.json").read_text()) for p in (merged.path, single.path))
    assert report["sources"][0]["first_bad_rows"] == reference["sources"][0]["first_bad_rows"]
    assert [r["row"].rsplit(":", 1)[1] for r in report["sources"][0]["first_bad_rows"]] == ["sql.jsonl#20", "sql.jsonl#70"]
    assert not (project["cache"] / "sql" / SOURCES / PARTS).exists() or not any((project["cache"] / "sql" / SOURCES / PARTS).iterdir())


def test_merge_names_the_missing_part(project):
    for i in (0, 2):
        pretokenize_part(config_of(project), project["cache"], (i, 3), log=quiet)
    with pytest.raises(BuildError, match=r"has no part\(s\) 1-of-3 in .*\.parts.*--part i/3"):
        merge(config_of(project), project["cache"], 3, log=quiet)
    assert read_current(project["cache"], "sql") is None


def test_parts_counted_differently_do_not_merge(project):
    for i in range(2):
        pretokenize_part(config_of(project), project["cache"], (i, 2), log=quiet)
    with pytest.raises(BuildError, match="has no part"):
        merge(config_of(project), project["cache"], 3, log=quiet)


def test_parts_run_in_parallel_processes_through_the_cli(project):
    def cli(*args):
        return subprocess.Popen([sys.executable, "-m", "packtrain.cli", *map(str, args)], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    common = ("--configs-dir", project["configs"], "--cache-dir", project["cache"], "--num-proc", 1)
    procs = [cli("pretokenize", "sql", "--part", f"{i}/2", *common) for i in range(2)]
    outs = [p.communicate() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    assert sorted(json.loads(out.splitlines()[-1])["part"] for out, _ in outs) == ["0/2", "1/2"]
    done = cli("merge-parts", "sql", "--parts", 2, *common)
    out, err = done.communicate()
    assert done.returncode == 0, err
    build_id = json.loads(out.splitlines()[-1])["build_id"]
    assert read_current(project["cache"], "sql") == build_id
    bad = cli("pretokenize", "sql", "--part", "3/2", *common)
    assert bad.wait() == 2 and "expected i/n with 0 <= i < n" in bad.stderr.read()


def test_parse_part():
    assert parse_part("0/1") == (0, 1) and parse_part("2/3") == (2, 3)
    for text in ("3/3", "-1/2", "1", "a/b", "1/0"):
        with pytest.raises(ValueError):
            parse_part(text)


def test_parts_cut_with_different_batch_rows_do_not_merge(project):
    """40+ rows, part 0 in batches of 16 and part 1 in batches of 20: interleaving would drop rows
    16-19 and repeat 32-39 (the counts can line up by chance), so merge must refuse."""
    pretokenize_part(config_of(project), project["cache"], (0, 2), log=quiet)
    other = load_config("sql", project["configs"], {"build.batch_rows": 20})
    pretokenize_part(other, project["cache"], (1, 2), log=quiet)
    with pytest.raises(BuildError, match=r"cut differently .* run every part with the same build.batch_rows"):
        merge(config_of(project), project["cache"], 2, log=quiet)
    assert read_current(project["cache"], "sql") is None


def test_a_part_remembers_the_encoder_decision_where_every_build_of_the_expert_reads_it(project):
    pretokenize_part(config_of(project), project["cache"], (0, 2), log=quiet)
    notes = project["cache"] / ".fast-encoder"
    assert [json.loads(p.read_text())["answer"]["encoder"] for p in notes.glob("*.json")] == ["fastokens"]
    lines: list[str] = []
    pretokenize_part(config_of(project), project["cache"], (1, 2), log=lines.append)
    assert [line for line in lines if line.startswith("fast encoder:")] == [
        "fast encoder: on (fastokens) (fastokens: the HF tokenizer's ids on the probe text)"]


def test_merge_with_another_parts_count_names_the_one_made(project):
    for i in range(2):
        pretokenize_part(config_of(project), project["cache"], (i, 2), log=quiet)
    with pytest.raises(BuildError, match=r"has no part\(s\) 0-of-3, 1-of-3, 2-of-3 in \S+ \(the parts there were made "
                                         r"with --parts 2: merge with --parts 2\); run"):
        merge(config_of(project), project["cache"], 3, log=quiet)


def test_parts_of_another_config_are_named_as_such(project):
    other = load_config("sql", project["configs"], {"pack.val_fraction": 0.2})  # another split: other tokens
    for i in range(2):
        pretokenize_part(other, project["cache"], (i, 2), log=quiet)
    parts = project["cache"] / "sql" / SOURCES / PARTS
    with pytest.raises(BuildError) as e:
        merge(config_of(project), project["cache"], 2, log=quiet)
    assert f"({parts} holds parts of 2 other source, config or tokenizer version(s): run every part with the " \
           "configs, sources and tokenizer of this merge)" in str(e.value)
    assert "\n" not in str(e.value)
    assert read_current(project["cache"], "sql") is None


def test_an_incomplete_part_is_named_incomplete(project):
    for i in range(2):
        pretokenize_part(config_of(project), project["cache"], (i, 2), log=quiet)
    cut = next((project["cache"] / "sql" / SOURCES / PARTS).glob("*/1-of-2"))
    (cut / "stats.json").unlink()  # a copy cut short: stats.json is written last
    with pytest.raises(BuildError, match=r"has no part\(s\) 1-of-2 in \S+ \(1-of-2 is there but incomplete, without "
                                         r"stats.json: a copy cut short, or a part still running\); run"):
        merge(config_of(project), project["cache"], 2, log=quiet)


def test_a_part_retried_under_the_same_pid_is_not_stopped_by_the_killed_try(project):
    """In a container every try of a part may have the same pid (a restarted pod's command is pid 1
    again): the killed try's temporary directory, same name but for a random suffix, stops nothing."""
    pretokenize_part(config_of(project), project["cache"], (0, 2), log=quiet)
    for key in (project["cache"] / "sql" / SOURCES / PARTS).iterdir():  # what a try killed mid-part leaves
        (key / f".tmp-1-of-2-{os.getpid()}").mkdir()
        (key / f".tmp-1-of-2-{os.getpid()}" / "train.tokens").write_bytes(b"\x00" * 10)
    pretokenize_part(config_of(project), project["cache"], (1, 2), log=quiet)
    merged = merge(config_of(project), project["cache"], 2, log=quiet)
    assert read_current(project["cache"], "sql") == merged.build_id
    assert list((project["cache"] / "sql").rglob(".tmp-*")) == []


def test_a_part_copied_under_another_name_is_named(project):
    """Two machines' parts copied together, one under the wrong name: the part is named, with the fix."""
    for i in range(2):
        pretokenize_part(config_of(project), project["cache"], (i, 2), log=quiet)
    wrong = sorted((project["cache"] / "sql" / SOURCES / PARTS).glob("*/1-of-2"))[0]
    shutil.rmtree(wrong)
    shutil.copytree(wrong.parent / "0-of-2", wrong)  # part 0 again, as 1-of-2
    with pytest.raises(BuildError) as e:
        merge(config_of(project), project["cache"], 2, log=quiet)
    assert str(e.value) == (f"part {wrong} holds the batches of part 0/2, not 1/2 (copied under another name?): "
                            "delete it and run `packtrain pretokenize sql --part 1/2` again")
    assert read_current(project["cache"], "sql") is None
