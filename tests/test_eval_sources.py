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
from packtrain.pipeline.orchestrate.build import build


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


def test_a_written_config_with_eval_sources_reads_back_the_same():
    """The config written beside a build and a run (``to_dict``) says val_fraction 0, and is read back as
    it was (``packtrain eval`` reads the run's config.json; ``packtrain config`` is pasted back)."""
    from packtrain.core.configfile import config_from_dict

    config = config_from_dict({"expert": "sql", "sources": [{"name": "a.jsonl"}, {"name": "dev.jsonl", "role": "eval"}]})
    assert config.pack.val_fraction == 0.0
    assert config_from_dict(config.to_dict()) == config


def test_val_fraction_zero_with_eval_sources_is_fine():
    from packtrain.core.configfile import config_from_dict

    config = config_from_dict({"expert": "sql", "sources": [{"name": "a.jsonl"}, {"name": "acme/sql", "split":
                                                                                  "validation", "role": "eval"}],
                               "pack": {"val_fraction": 0}})
    assert config.held_out_fraction() == 0.0 and [s.eval_name() for _, s in config.eval_sources()] == ["acme/sql:validation"]


# --- the trainer and `packtrain eval`: each eval source reported by name -----------------------------

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from trainer_fixtures import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def two_set_build(cache: Path, model_dir: Path, eval_sets: bool = True) -> list:
    """Four fixed documents (4 prompt tokens, 5 answer tokens, eos: 6 supervised targets each), trained;
    val block 0 holds documents 0 and 1 (eval source ``dev.jsonl``), val block 1 documents 2 and 3
    (``test.jsonl``): the manifest's ``outputs.eval_sets`` as the build writes it."""
    import numpy as np
    from trainer_fixtures import EOS_ID, write_build

    rng = np.random.default_rng(0)
    docs = [(rng.integers(4, 256, 4).tolist() + rng.integers(4, 256, 5).tolist() + [EOS_ID], 4) for _ in range(4)]
    build_id = write_build(cache, "neo4j", [[docs[i % 4], docs[(i + 1) % 4]] for i in range(8)], [docs[:2], docs[2:]],
                           32, model_dir)
    if eval_sets:
        path = cache / "neo4j" / build_id / "manifest.json"
        manifest = json.loads(path.read_text())
        manifest["outputs"]["eval_sets"] = [{"name": "dev.jsonl", "source": 1, "first_block": 0, "blocks": 1},
                                            {"name": "test.jsonl", "source": 2, "first_block": 1, "blocks": 1}]
        path.write_text(json.dumps(manifest))
    return docs


def test_train_and_eval_report_loss_and_task_metric_per_eval_source(tmp_path, model_dir, caplog):
    import logging

    from click.testing import CliRunner
    from packtrain.cli.commands import main
    from packtrain.trainer.run.train import run
    from trainer_fixtures import make_config

    two_set_build(tmp_path / "cache", model_dir)
    config = make_config(model_dir, tmp_path / "runs", expert="neo4j", max_steps=2, eval_steps=2, task_eval=True,
                         max_new_tokens=4, sample_prompts=1, plots=False)
    with caplog.at_level(logging.INFO, logger="packtrain.train"):
        run_dir = run(config, tmp_path / "cache")
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"eval/loss"' in line]
    assert [e["step"] for e in evals] == [0, 2]
    for e in evals:
        assert (e["eval/dev.jsonl/tokens"], e["eval/test.jsonl/tokens"], e["eval/tokens"]) == (12, 12, 24)
        assert e["eval/loss"] == pytest.approx((e["eval/dev.jsonl/loss"] + e["eval/test.jsonl/loss"]) / 2)
    assert "step 2: eval loss" in caplog.text and "; dev.jsonl: loss" in caplog.text and "; test.jsonl: loss" in caplog.text
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_sets"]["test.jsonl"] == {"loss": evals[-1]["eval/test.jsonl/loss"],
                                                  "loss_before": evals[0]["eval/test.jsonl/loss"]}
    assert "base model vs adapter on 1 validation prompts of dev.jsonl:" in caplog.text
    scored = json.loads((run_dir / "eval.json").read_text())
    assert {name: part["examples"] for name, part in scored["eval_sets"].items()} == {"dev.jsonl": 2, "test.jsonl": 2}
    rows = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [r["eval_set"] for r in rows] == ["dev.jsonl", "dev.jsonl", "test.jsonl", "test.jsonl"]
    assert "task eval, dev.jsonl (exact, 2 examples): exact_match base" in caplog.text

    for name in ("eval.json", "eval.jsonl"):  # evaluated again, by the command
        (run_dir / name).rename(tmp_path / name)
    result = CliRunner().invoke(main, ["eval", "neo4j", "--run", str(run_dir), "--max-examples", "1"])
    assert result.exit_code == 0, result.output
    again = json.loads((run_dir / "eval.json").read_text())
    assert {name: part["examples"] for name, part in again["eval_sets"].items()} == {"dev.jsonl": 1, "test.jsonl": 1}
    assert [json.loads(r)["reference"] for r in (run_dir / "eval.jsonl").read_text().splitlines()] == \
        [rows[0]["reference"], rows[2]["reference"]]  # each set's first prompt, from its own blocks


def test_a_cpu_run_sizes_its_end_of_run_answers_to_cpu_generate_tokens(tmp_path, model_dir, caplog):
    import dataclasses
    import logging

    from packtrain.trainer.run.train import run
    from trainer_fixtures import make_config

    two_set_build(tmp_path / "cache", model_dir, eval_sets=False)  # 4 val prompts of 4 tokens
    config = make_config(model_dir, tmp_path / "runs", expert="neo4j", max_steps=1, task_eval=True, max_new_tokens=4,
                         sample_prompts=2, sample_max_new_tokens=4, plots=False)
    config = dataclasses.replace(config, cpu=dataclasses.replace(config.cpu, enabled=True, generate_tokens=30))
    with caplog.at_level(logging.INFO, logger="packtrain.train"):
        run_dir = run(config, tmp_path / "cache")
    # samples: 2 prompts would get 15 tokens each, 4 of them new: fewer than 16 prompt tokens, so one is shown
    assert "samples: 1 of 2 prompts shown: cpu.generate_tokens 30 a model on a CPU, each prompt 4 new tokens" in caplog.text
    assert "base model vs adapter on 1 validation prompts:" in caplog.text
    # the task eval: prompts of 4 + 4 new tokens, taken while they fit 30: 3 of the 4
    assert json.loads((run_dir / "eval.json").read_text())["examples"] == 3
    assert "task eval: 3 of 4 prompts fit cpu.generate_tokens 30 a model on a CPU (prompt + 4 new tokens each); " \
           "1 skipped" in caplog.text


def test_the_cpu_profile_evaluates_two_sequences_unless_the_batch_is_set():
    from packtrain.core.configfile import config_from_dict

    config = config_from_dict({"expert": "sql", "sources": [{"name": "a.jsonl"}], "cpu": {"enabled": True}})
    trained = config.for_device(cuda=False)
    assert (trained.train.per_device_eval_batch_size, trained.train.max_eval_batches) == (2, 1)
    assert config.for_device(False, frozenset({"train.per_device_eval_batch_size"})).train.per_device_eval_batch_size == 8
    assert config.for_device(cuda=True).train.per_device_eval_batch_size == 8


def test_the_build_says_which_source_is_evaluation_only(tmp_path):
    project = eval_project(tmp_path, rows(6, start=500))
    said: list[str] = []
    build(load_config("sql", project["configs"]), project["cache"], log=said.append, progress=False)
    text = "\n".join(said)
    assert f"source: local files {project['dev']} [train] (1 file, " in text
    assert "), evaluation only (role: eval), reported as 'dev.jsonl'" in text
    assert "\n    eval source dev.jsonl: 6 documents, 402 tokens (94 supervised) in val blocks 0-3\n" in text

