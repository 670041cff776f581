"""pipeline/pack/report.py: how documents fit the block, and the block size that would hold 99% of them
(not capped at the current block size), in report.json and in the build's summary line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from build_fixtures import make_project, rows, write_jsonl
from packtrain.core.configfile import load_config
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.pack.report import block_fit, block_fit_line, summary


def ten_thousand() -> dict[str, np.ndarray]:
    """8,900 documents of 1,000 tokens, 1,000 of 2,100 and 100 of 5,000; 200 of them in val."""
    lengths = np.array([1000] * 8900 + [2100] * 1000 + [5000] * 100)
    return {"train": lengths[200:], "val": lengths[:200]}


def test_split_documents_and_the_block_size_that_holds_99_percent():
    fit = block_fit(ten_thousand(), {"train": {"split": 1090, "truncated": 0, "dropped_overlong": 0},
                                     "val": {"split": 10}}, 2048, "bfd", "split")
    assert fit == {"block_size": 2048, "strategy": "bfd", "overlong": "split", "documents": 10000,
                   "longer_than_block": 1100, "split": 1100, "truncated": 0, "dropped": 0,
                   "holds_99_tokens": 2100, "suggested_block_size": 2112}
    assert block_fit_line(fit) == ("1,100 of 10,000 documents (11.0%) are longer than the 2048-token block and "
                                   "were split; pack.block_size 2112 holds 99%")


@pytest.mark.parametrize("overlong, totals, said", [
    ("truncate", {"truncated": 1100}, "were truncated to it"),
    ("drop", {"dropped_overlong": 1100}, "were dropped"),
])
def test_truncated_or_dropped_documents_are_said_so(overlong, totals, said):
    fit = block_fit(ten_thousand(), {"train": totals, "val": {}}, 2048, "bfd", overlong)
    assert (fit["split"], fit["truncated"] + fit["dropped"]) == (0, 1100)
    assert block_fit_line(fit) == (f"1,100 of 10,000 documents (11.0%) are longer than the 2048-token block and "
                                   f"{said}; pack.block_size 2112 holds 99%")


def test_when_the_block_holds_99_percent_no_larger_block_is_suggested():
    lengths = {"train": np.array([100] * 995 + [3000] * 5), "val": np.array([], np.int64)}
    fit = block_fit(lengths, {"train": {"split": 5}, "val": {}}, 2048, "bfd", "split")
    assert (fit["holds_99_tokens"], fit["suggested_block_size"]) == (100, 128)
    assert block_fit_line(fit) == ("5 of 1,000 documents (0.5%) are longer than the 2048-token block and were split; "
                                   "99% have <= 100 tokens")
    short = block_fit({"train": np.array([5, 60, 70]), "val": np.array([9])}, {"train": {}, "val": {}}, 2048, "bfd",
                      "split")
    assert block_fit_line(short) == "every document fits the 2048-token block; 99% have <= 70 tokens"


def test_wrap_counts_every_document_cut_at_a_block_edge():
    # train: [0, 6) crosses 4, [6, 11) crosses 8, [11, 12) does not; val: [0, 3) does not
    fit = block_fit({"train": np.array([6, 5, 1]), "val": np.array([3])}, {"train": {}, "val": {}}, 4, "wrap",
                    "split")
    assert (fit["split"], fit["longer_than_block"], fit["suggested_block_size"]) == (2, 2, 64)
    assert block_fit_line(fit) == ("2 of 4 documents (50.0%) were cut at a block edge (pack.strategy wrap), 2 of them "
                                   "longer than the 4-token block; pack.block_size 64 holds 99%")


def test_the_build_reports_the_fit_of_its_own_documents(tmp_path):
    project = make_project(tmp_path, n_rows=40, block_size=128)
    write_jsonl(project["data"], rows(40))
    lines = []
    config = load_config("sql", project["configs"], {"pack.block_size": 32, "build.num_proc": 1})
    result = build(config, project["cache"], log=lines.append)
    report = json.loads((result.path / "report.json").read_text())
    fit = report["block_fit"]
    assert "suggested_max_seq_length" not in report
    assert {key: type(value) for key, value in fit.items()} == {
        "block_size": int, "strategy": str, "overlong": str, "documents": int, "longer_than_block": int, "split": int,
        "truncated": int, "dropped": int, "holds_99_tokens": int, "suggested_block_size": int}
    totals = report["train"]["documents"] + report["val"]["documents"]
    assert (fit["block_size"], fit["documents"]) == (32, totals)
    assert fit["split"] == fit["longer_than_block"] == report["train"]["split"] + report["val"].get("split", 0) > 0
    assert fit["suggested_block_size"] > 32  # not capped at the block
    assert f"  {block_fit_line(fit)}" in "\n".join(lines)


def small_build_report(tokens_per_second: int, num_proc: int, processes: int, blocks: int) -> dict:
    """report.json of a small build, the fields its summary reads."""
    split = {"documents": blocks, "tokens": 40 * blocks, "supervised_tokens": 12 * blocks, "blocks": blocks,
             "packing_efficiency": 0.3125, "length_histogram": "40: 1"}
    return {"build_id": "0123456789abcdef", "expert": "sql", "seconds": 0.5, "tokens_per_second": tokens_per_second,
            "num_proc": num_proc, "processes": processes, "train": split, "val": split, "sources": [],
            "duplicates": 0, "dedup": "exact", "bad_rows": 0, "default_system_prompt": None, "previous": None,
            "block_fit": block_fit({"train": np.array([40] * blocks), "val": np.array([40] * blocks)},
                                   {"train": {}, "val": {}}, 128, "bfd", "split"),
            "used_bundled_sample": False}


@pytest.mark.parametrize("tokens_per_second, num_proc, processes, blocks, said", [
    # a small build: the rate in units that show it (it said `0.00M tokens/s`), one block (it said `1 blocks`),
    # and the processes that tokenized (it said `num_proc=8` after `num_proc 8 capped at 3`)
    (812, 8, 3, 1, ["build 0123456789abcdef of sql: 0.5 s, 812 tokens/s tokenizing with num_proc=3 (build.num_proc 8, "
                    "capped: 3 batches to tokenize)",
                    "  train: 1 document, 40 tokens (12 supervised) in 1 block, packing efficiency 31.2%",
                    "  val:   1 document, 40 tokens in 1 block"]),
    (45_678, 2, 2, 3, ["build 0123456789abcdef of sql: 0.5 s, 45.7k tokens/s tokenizing with num_proc=2",
                       "  train: 3 documents, 120 tokens (36 supervised) in 3 blocks, packing efficiency 31.2%",
                       "  val:   3 documents, 120 tokens in 3 blocks"]),
    (2_345_678, 8, 8, 2, ["build 0123456789abcdef of sql: 0.5 s, 2.35M tokens/s tokenizing with num_proc=8",
                          "  train: 2 documents, 80 tokens (24 supervised) in 2 blocks, packing efficiency 31.2%",
                          "  val:   2 documents, 80 tokens in 2 blocks"]),
])
def test_the_summary_of_a_small_build_reads_right(tokens_per_second, num_proc, processes, blocks, said):
    assert summary(small_build_report(tokens_per_second, num_proc, processes, blocks)).splitlines()[:3] == said
