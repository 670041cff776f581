"""Issue 12, class 2: every intermediate that packtrain reads back is verified before it is reused.

Caches (per-source token caches and partitioned parts, the stat cache, an existing build directory)
that are damaged are rebuilt and said once, never trusted. (The artifacts that cannot be rebuilt
here, CURRENT, manifest.json, config.json, run files: test_reliability_readback.py.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from build_fixtures import empty_cache
from reuse_fixtures import build_bytes, config_of, flip_byte, reuse_project, run_build
from packtrain.pipeline.orchestrate.build import plan
from packtrain.pipeline.pack.spill import SOURCE_STATS, SOURCES, source_cache_problem
from packtrain.pipeline.hashcache import STAT_CACHE, StatCache
from packtrain.pipeline.orchestrate.partition import PARTS, merge, pretokenize_part
from packtrain.pipeline.orchestrate.rebuild import RebuildOptions
from packtrain.pipeline.orchestrate.rebuild import rebuild as run_rebuild


@pytest.fixture
def project(tmp_path):
    return reuse_project(tmp_path)


def one_source_dir(project) -> Path:
    (directory,) = [p for p in (project["cache"] / "sql" / SOURCES).iterdir() if not p.name.startswith(".")]
    return directory


# ----------------------------------------------------------------------------------------------
# Per-source token caches: checksummed, damaged means tokenized again (said once), never reused


def damage_tokens_same_size(d):
    flip_byte(d / "train.tokens")
    return "train.tokens"


def damage_tokens_truncated(d):
    (d / "train.tokens").write_bytes((d / "train.tokens").read_bytes()[:-2])
    return "train.tokens"


def damage_lengths(d):
    flip_byte(d / "train.lengths.npy", at=-1)
    return "train.lengths.npy"


def damage_missing_file(d):
    (d / "val.prompts.npy").unlink()
    return "val.prompts.npy"


def damage_stats_truncated(d):
    (d / SOURCE_STATS).write_text((d / SOURCE_STATS).read_text()[:40])
    return SOURCE_STATS


def damage_stats_wrong_top_level(d):
    (d / SOURCE_STATS).write_text("[]")
    return SOURCE_STATS


def damage_stats_wrong_type(d):
    stats = json.loads((d / SOURCE_STATS).read_text())
    stats["rows"] = "60"
    (d / SOURCE_STATS).write_text(json.dumps(stats))
    return SOURCE_STATS


def damage_stats_same_size_number(d):  # a count edited in place: same size, valid JSON, right shape
    text = (d / SOURCE_STATS).read_text()
    stats = json.loads(text)
    old = f'"rows": {stats["rows"]}'
    new = f'"rows": {stats["rows"] + 1 if stats["rows"] % 10 != 9 else stats["rows"] - 1}'
    assert old in text and len(old) == len(new)
    (d / SOURCE_STATS).write_text(text.replace(old, new))
    return SOURCE_STATS


def damage_stats_not_utf8(d):
    (d / SOURCE_STATS).write_bytes(b"\xff\xfe{}")
    return SOURCE_STATS


def damage_stats_checksum_of_a_file(d):  # the recorded sha256 of a file no longer matches it
    stats = json.loads((d / SOURCE_STATS).read_text())
    digest = stats["files"]["val.tokens"]
    stats["files"]["val.tokens"] = ("0" if digest[0] != "0" else "1") + digest[1:]
    (d / SOURCE_STATS).write_text(json.dumps(stats))
    return SOURCE_STATS


def damage_cache_is_a_file(d):
    shutil.rmtree(d)
    d.write_text("not a directory")
    return SOURCE_STATS


def damage_cache_is_a_broken_link(d):
    shutil.rmtree(d)
    d.symlink_to(d.parent / "nowhere")
    return SOURCE_STATS


SOURCE_DAMAGES = [damage_cache_is_a_file, damage_cache_is_a_broken_link, damage_tokens_same_size, damage_tokens_truncated, damage_lengths, damage_missing_file,
                  damage_stats_truncated, damage_stats_wrong_top_level, damage_stats_wrong_type,
                  damage_stats_same_size_number, damage_stats_not_utf8, damage_stats_checksum_of_a_file]


@pytest.mark.parametrize("damage", SOURCE_DAMAGES, ids=lambda f: f.__name__.removeprefix("damage_"))
def test_a_damaged_source_cache_is_tokenized_again_and_said_once(project, damage):
    reference, _ = run_build(project)
    expected = build_bytes(reference.path)
    source = one_source_dir(project)
    assert source_cache_problem(source) is None
    shutil.rmtree(reference.path)  # the next build must pack again, from the source cache
    named = damage(source)
    again, lines = run_build(project)
    said = [line for line in lines if "damaged source token cache" in line]
    assert len(said) == 1 and str(source / named) in said[0]
    assert not any("reusing its tokens" in line for line in lines)
    assert again.build_id == reference.build_id and build_bytes(again.path) == expected
    assert source_cache_problem(source) is None  # replaced by a good one

    shutil.rmtree(again.path)
    third, lines = run_build(project)  # now intact: reused, and nothing said
    assert [line for line in lines if "damaged source" in line or "is damaged" in line] == []
    assert any("unchanged, reusing its tokens" in line for line in lines)
    assert build_bytes(third.path) == expected


def test_an_intact_source_cache_is_reused(project):
    """The control: without damage the tokens are reused and nothing is called damaged."""
    reference, _ = run_build(project)
    shutil.rmtree(reference.path)
    again, lines = run_build(project)
    assert [line for line in lines if "damaged source" in line or "is damaged" in line] == []
    assert any("unchanged, reusing its tokens" in line for line in lines)
    assert build_bytes(again.path) == build_bytes(reference.path)


def test_a_damaged_part_is_refused_by_merge_and_replaced_by_its_rerun(project, tmp_path):
    single, _ = run_build(project)
    expected = build_bytes(single.path)
    empty_cache(project)
    config = config_of(project)
    for i in range(2):
        pretokenize_part(config, project["cache"], (i, 2), log=lambda _: None)
    (part,) = (project["cache"] / "sql" / SOURCES / PARTS).glob("*/1-of-2")
    flip_byte(part / "train.tokens")
    with pytest.raises(Exception, match=r"damaged part: .*1-of-2/train.tokens differs from its sha256.*"
                                        r"--part 1/2` again"):
        merge(config, project["cache"], 2, log=lambda _: None)
    lines = []
    pretokenize_part(config, project["cache"], (1, 2), log=lines.append)
    assert sum("damaged part" in line for line in lines) == 1
    merged = merge(config, project["cache"], 2, log=lambda _: None)
    assert merged.build_id == single.build_id and build_bytes(merged.path) == expected


# ----------------------------------------------------------------------------------------------
# An existing build is reused only when it is intact (shards by sha256, manifest and config.json by schema)


@pytest.mark.parametrize("damage", ["shard-byte-same-size", "config-wrong-type", "config-truncated",
                                    "manifest-wrong-type"])
def test_an_existing_damaged_build_is_rebuilt_not_called_up_to_date(project, damage):
    reference, _ = run_build(project)
    expected = build_bytes(reference.path)
    if damage == "shard-byte-same-size":
        flip_byte(reference.path / "train-00000.arrow")
    elif damage == "config-wrong-type":
        (reference.path / "config.json").write_text(json.dumps({"model": {"name": 5}}))
    elif damage == "config-truncated":
        (reference.path / "config.json").write_text('{"model": {"na')
    else:
        manifest = json.loads((reference.path / "manifest.json").read_text())
        manifest["outputs"]["totals"]["train"]["tokens"] = "many"
        (reference.path / "manifest.json").write_text(json.dumps(manifest))
    again, lines = run_build(project)
    assert not again.up_to_date
    assert sum(f"existing build {reference.build_id} is damaged" in line for line in lines) == 1
    assert build_bytes(again.path) == expected
    assert json.loads((again.path / "config.json").read_text())["model"]["name"] == str(project["model"])


def test_a_damaged_previous_manifest_does_not_break_the_next_build(project):
    old, _ = run_build(project)
    manifest = json.loads((old.path / "manifest.json").read_text())
    manifest["inputs"]["sources"] = {"not": "a list"}
    (old.path / "manifest.json").write_text(json.dumps(manifest))
    new, _ = run_build(project, **{"pack.block_size": 64})
    assert new.build_id != old.build_id and new.report["previous"] is None


# ----------------------------------------------------------------------------------------------
# The stat cache: checked (shape and its own sha256), a damaged one is dropped, said once, rewritten


def stat_cache_damages(path: Path) -> dict[str, bytes]:
    good = json.loads(path.read_text())
    name = sorted(good["entries"])[0]  # the source file and the tokenizer's files: damage one entry
    entry = good["entries"][name]
    edited = dict(good, entries={**good["entries"],
                                 name: [*entry[:4], ("0" if entry[4][0] != "0" else "1") + entry[4][1:]]})
    return {
        "wrong-top-level": b"[]",
        "wrong-shape": json.dumps({name: {"size": 1}}).encode(),
        "old-plain-format": json.dumps({name: entry}).encode(),
        "entry-too-short": json.dumps(dict(good, entries={name: entry[:4]})).encode(),
        "entry-size-a-string": json.dumps(dict(good, entries={name: [str(entry[0]), *entry[1:]]})).encode(),
        "digest-edited-same-size": json.dumps(edited).encode(),
        "truncated": path.read_bytes()[:30],
        "not-utf8": b"\xff\xfe\xfd",
        "empty": b"",
    }


STAT_CASES = ["wrong-top-level", "wrong-shape", "old-plain-format", "entry-too-short", "entry-size-a-string",
              "digest-edited-same-size", "truncated", "not-utf8", "empty"]


@pytest.mark.parametrize("case", STAT_CASES)
def test_a_damaged_stat_cache_is_rebuilt_and_said_once(project, case):
    reference, _ = run_build(project)
    path = project["cache"] / "sql" / STAT_CACHE
    path.write_bytes(stat_cache_damages(path)[case])
    assert StatCache(path).problem is not None and str(path) in StatCache(path).problem

    again, lines = run_build(project)
    assert again.build_id == reference.build_id and again.up_to_date
    assert sum(f"{path} is damaged" in line for line in lines) == 1
    assert StatCache(path).problem is None  # rewritten, good again

    lines = []
    assert plan(config_of(project), project["cache"], lines.append)[3] == reference.build_id
    assert lines == []  # said once, not on every run

    path.write_bytes(stat_cache_damages(path)[case])  # the scheduled job goes on too
    emitted = []
    code = run_rebuild(["sql"], project["configs"], project["cache"],
                       RebuildOptions(3, True, {"train.output_dir": str(project["runs"])}), emitted.append, lambda _: None)
    assert code == 0 and json.loads(emitted[0])["action"] == "up-to-date"
