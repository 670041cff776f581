"""Eval sources (``sources[].role: eval``): built into the val split with the training format, never
trained, each identifiable in the manifest (``outputs.eval_sets``: its val blocks) so the trainer and
``packtrain eval`` report it by name (docs/DATASETS.md, "Eval sources")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from build_fixtures import make_project, rows, write_jsonl
from packtrain.core.configfile import load_config
from packtrain.core.contract import EvalSet, Manifest
from packtrain.core.errors import PacktrainError
from packtrain.core.shardfile import open_shard
from packtrain.pipeline.build import build


def eval_project(tmp: Path, eval_rows: list[dict], extra: str = "", train_rows: int = 40) -> dict:
    """The tiny sql project (``train_rows`` training rows) with ``dev.jsonl`` as an eval source."""
    project = make_project(tmp, n_rows=train_rows)
    project["dev"] = write_jsonl(tmp / "data" / "dev.jsonl", eval_rows)
    config = project["configs"] / "sql.yaml"
    text = config.read_text().replace("  val_fraction: 0.1\n", "")
    config.write_text(text.replace("sources:\n", f"sources:\n  - name: {project['dev']}\n    role: eval\n{extra}", 1))
    return project


def build_of(project: dict):
    return build(load_config("sql", project["configs"]), project["cache"], log=lambda *a: None, progress=False)


def documents(build_dir: Path, split: str, blocks: range | None = None) -> list[str]:
    """The decoded text of every document in ``split``'s blocks (``blocks``: those val blocks only)."""
    manifest = Manifest.load(build_dir)
    tokenizer = Tokenizer.from_file(str(Path(json.loads((build_dir / "config.json").read_text())["model"]["name"])
                                        / "tokenizer.json"))
    out, block = [], 0
    for shard in (manifest.train if split == "train" else manifest.val):
        ids, _, doc_lens = open_shard(build_dir / shard.file, manifest.block_size).arrays()
        for row, lens in zip(ids, doc_lens):
            at = 0
            for n in lens:
                if blocks is None or block in blocks:
                    out.append(tokenizer.decode(row[at:at + n].tolist()))
                at += n
            block += 1
    return out


def questions(texts: list[str]) -> list[str]:
    return sorted(t.split("### Question\n")[1].split("\n")[0] for t in texts)


def test_eval_rows_are_the_val_split_and_never_trained(tmp_path):
    dev = rows(8, start=500) + rows(1, start=3)  # row 3 is also a training row: it is evaluated, not trained
    project = eval_project(tmp_path, dev)
    result = build_of(project)
    manifest = Manifest.load(result.path, full=True)
    val = documents(result.path, "val")
    train = documents(result.path, "train")
    assert questions(val) == questions([f"### Question\n{r['question']}\n" for r in dev])
    assert not set(questions(train)) & set(questions(val))
    assert len(train) == 39  # every training row but the one dev holds: nothing held out by val_fraction
    assert manifest.inputs["pack"]["val_fraction"] == 0.0
    assert manifest.inputs["sources"][0]["role"] == "eval" and "role" not in manifest.inputs["sources"][1]
    assert manifest.eval_sets == (EvalSet("dev.jsonl", 0, 0, manifest.totals["val"].blocks),)
    eval_set = manifest.outputs["eval_sets"][0]
    assert (eval_set["documents"], eval_set["supervised_tokens"]) == (9, manifest.totals["val"].supervised_tokens)


def test_two_eval_sources_never_share_a_block(tmp_path):
    project = eval_project(tmp_path, rows(6, start=500))
    test = write_jsonl(tmp_path / "data" / "test.jsonl", rows(5, start=700))
    config = project["configs"] / "sql.yaml"
    config.write_text(config.read_text().replace("sources:\n", f"sources:\n  - name: {test}\n    role: eval\n", 1))
    manifest = Manifest.load(build_of(project).path, full=True)
    sets = {e.name: e for e in manifest.eval_sets}
    assert [(e.name, e.source) for e in manifest.eval_sets] == [("test.jsonl", 0), ("dev.jsonl", 1)]
    assert sets["test.jsonl"].first_block == 0 and sets["dev.jsonl"].first_block == sets["test.jsonl"].stop
    assert sets["dev.jsonl"].stop == manifest.totals["val"].blocks
    path = Manifest.load(build_of(project).path).build_id
    build_dir = project["cache"] / "sql" / path
    for name, start, n in (("test.jsonl", 700, 5), ("dev.jsonl", 500, 6)):
        held = documents(build_dir, "val", range(sets[name].first_block, sets[name].stop))
        assert questions(held) == questions([f"### Question\n{r['question']}\n" for r in rows(n, start=start)])


def test_a_changed_eval_file_is_a_new_build(tmp_path):
    project = eval_project(tmp_path, rows(6, start=500))
    first = build_of(project).build_id
    write_jsonl(project["dev"], rows(6, start=501))
    assert build_of(project).build_id != first


def test_without_eval_sources_the_build_is_as_before(tmp_path):
    project = make_project(tmp_path, n_rows=40)
    manifest = Manifest.load(build_of(project).path, full=True)
    assert manifest.eval_sets == () and "eval_sets" not in manifest.outputs
    assert manifest.inputs["pack"]["val_fraction"] == 0.1 and "role" not in manifest.inputs["sources"][0]


@pytest.mark.parametrize("sources, pack, said", [
    ([{"name": "dev.jsonl", "role": "eval"}], {},
     "sources: every source has role: eval, so nothing would be trained"),
    ([{"name": "a.jsonl"}, {"name": "dev.jsonl", "role": "evaluation"}], {},
     "sources[1].role: must be one of 'train', 'eval', got 'evaluation'"),
    ([{"name": "a.jsonl"}, {"name": "dev.jsonl", "role": "eval", "weight": 2}], {},
     "sources[1].weight: 2.0 on an eval source, whose documents are never trained or weighted"),
    ([{"name": "a.jsonl"}, {"name": "/x/dev.jsonl", "role": "eval"}, {"name": "/y/dev.jsonl", "role": "eval"}], {},
     "sources[2]: an eval source named 'dev.jsonl' like sources[1]"),
    ([{"name": "a.jsonl"}, {"name": "dev.jsonl", "role": "eval"}], {"val_fraction": 0.05},
     "pack.val_fraction: 0.05 with an eval source (sources[1].role: eval): the eval sources are the validation "
     "split and the training sources hold nothing out; remove pack.val_fraction"),
])
def test_bad_eval_source_config_is_one_line(sources, pack, said):
    from packtrain.core.configfile import config_from_dict

    with pytest.raises(PacktrainError) as e:
        config_from_dict({"expert": "sql", "sources": sources, "pack": pack})
    assert said in str(e.value) and "\n" not in str(e.value)


def test_axolotl_and_hf_names_point_at_role_eval():
    from packtrain.core.configfile import config_from_dict

    for key in ("test_datasets", "eval_dataset"):
        with pytest.raises(PacktrainError, match=rf"{key}: unknown key \(did you mean sources with role: eval\?\)"):
            config_from_dict({"expert": "sql", "sources": [{"name": "a.jsonl"}], key: [{"name": "dev.jsonl"}]})


def test_val_fraction_zero_with_eval_sources_is_fine():
    from packtrain.core.configfile import config_from_dict

    config = config_from_dict({"expert": "sql", "sources": [{"name": "a.jsonl"}, {"name": "acme/sql", "split":
                                                                                  "validation", "role": "eval"}],
                               "pack": {"val_fraction": 0}})
    assert config.held_out_fraction() == 0.0 and [s.eval_name() for _, s in config.eval_sources()] == ["acme/sql:validation"]
