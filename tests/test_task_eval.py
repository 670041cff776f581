"""Task evaluation: the metrics (pure functions, literal cases), the validation prompts read back
from a build's shards, and end-to-end runs that write eval.json / eval.jsonl and print samples."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from packtrain.cli.commands import main
from packtrain.core.contract import Manifest, resolve_build
from packtrain.trainer.eval.generate import left_pad, until_eos
from packtrain.trainer.eval.task_eval import Example, split_document, val_examples
from packtrain.trainer.eval.task_metrics import aggregate, metric_for, normalize_sql, normalize_text, score
from packtrain.trainer.run.train import run
from trainer_fixtures import EOS_ID, make_config, tiny_model_dir, write_build


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


# --- metrics -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("select  name from T where ID=1;", "SELECT name FROM T WHERE ID = 1"),
    ("SELECT COUNT(*)\nFROM head\nWHERE age > 56", "SELECT COUNT(*) FROM head WHERE age > 56"),
    ("SELECT a FROM t WHERE b = 'x y'", "SELECT a FROM t WHERE b = 'x y'"),
    ("SELEC x FRM", None),
    ("", None),
    ("SELECT 1; SELECT 2", None),  # two statements are not one answer
    ("SELEC name", None),  # sqlglot alone reads it as a column with an alias
    ("DROP TABLE t", "DROP TABLE t"),
])
def test_normalize_sql(text, expected):
    assert normalize_sql(text) == expected


def test_sql_scores_parse_and_normalized_exact_match():
    assert score("sql", "select name from T where ID=1;", "SELECT name FROM T WHERE ID = 1") == {
        "parses": True, "exact_match": True}
    assert score("sql", "SELECT name FROM T WHERE ID = 2", "SELECT name FROM T WHERE ID = 1") == {
        "parses": True, "exact_match": False}
    assert score("sql", "SELEC name", "SELECT name FROM T") == {"parses": False, "exact_match": False}


def test_json_scores_parse_and_value_match():
    assert score("json", '{"b": [1, 2], "a": null}', '{"a":null,"b":[1,2]}') == {"parses": True, "exact_match": True}
    assert score("json", '{"a": 1}', '{"a": 1.5}') == {"parses": True, "exact_match": False}
    assert score("json", '{"a": 1', '{"a": 1}') == {"parses": False, "exact_match": False}
    assert score("json", "[1, 2]", "[2, 1]") == {"parses": True, "exact_match": False}


def test_exact_match_normalizes_whitespace_and_a_trailing_semicolon():
    assert normalize_text("  MATCH (n)\n\tRETURN n ; ") == "MATCH (n) RETURN n"
    assert score("exact", "MATCH (n)\n  RETURN n;", "MATCH (n) RETURN n") == {"exact_match": True}
    assert score("exact", "match (n) return n", "MATCH (n) RETURN n") == {"exact_match": False}  # case counts


def test_metric_by_expert_name_and_aggregate():
    assert [metric_for(e) for e in ("sql", "sql.stage2", "json", "neo4j", "typescript", "poems")] == [
        "sql", "sql", "json", "exact", "exact", "exact"]
    assert metric_for("poems", "json") == "json"
    assert aggregate([{"parses": True, "exact_match": False}, {"parses": True, "exact_match": True}]) == {
        "parses": 1.0, "exact_match": 0.5}
    assert aggregate([]) == {}


# --- prompts from the shards ---------------------------------------------------------------------

def test_left_pad_and_until_eos():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=3)
    assert ids.tolist() == [[5, 6, 7], [3, 3, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert until_eos([9, 4, 0, 3, 3], 0) == [9, 4] and until_eos([9, 4], 0) == [9, 4]


def test_split_document_takes_the_prompt_and_the_first_supervised_span():
    assert split_document([7, 8, 9, 5, 6, 0], [0, 0, 0, 1, 1, 1], 0) == Example([7, 8, 9], [5, 6])
    # multi-turn: the prompt ends at the first answer, the reference is that answer only
    assert split_document([7, 5, 0, 8, 6, 0], [0, 1, 1, 0, 1, 1], 0) == Example([7], [5])
    assert split_document([5, 6, 0], [1, 1, 1], 0) is None  # the tail of a split document: no prompt
    assert split_document([5, 6], [0, 0], 0) is None


def test_val_examples_are_read_from_the_val_shards_in_order(tmp_path, model_dir):
    val = [[([10, 11, 12, 20, 21, EOS_ID], 3), ([13, 22, EOS_ID], 1)], [([14, 15, 23, EOS_ID], 2)]]
    write_build(tmp_path / "cache", "sql", [[([4, 5, EOS_ID], 1)]] * 2, val, 16, model_dir, rows_per_shard=1)
    build_dir = resolve_build(tmp_path / "cache", "sql")
    manifest = Manifest.load(build_dir)
    assert val_examples(build_dir, manifest, 10) == [Example([10, 11, 12], [20, 21]), Example([13], [22]),
                                                     Example([14, 15], [23])]
    assert val_examples(build_dir, manifest, 2) == [Example([10, 11, 12], [20, 21]), Example([13], [22])]


# --- end to end ----------------------------------------------------------------------------------

def memorization_build(cache, model_dir, expert="neo4j"):
    """Four fixed documents (4 prompt tokens, 5 answer tokens, eos), train = val: an adapter that
    memorizes them answers every validation prompt exactly."""
    rng = np.random.default_rng(0)
    docs = [(rng.integers(4, 256, 4).tolist() + rng.integers(4, 256, 5).tolist() + [EOS_ID], 4) for _ in range(4)]
    blocks = [[docs[i % 4], docs[(i + 1) % 4]] for i in range(8)]
    write_build(cache, expert, blocks, [docs[:2], docs[2:]], 32, model_dir)
    return docs


def test_a_run_ends_with_samples_and_a_task_eval_that_shows_the_adapter_learned(tmp_path, model_dir, caplog):
    memorization_build(tmp_path / "cache", model_dir)
    config = make_config(model_dir, tmp_path / "runs", expert="neo4j", max_steps=60, per_device_train_batch_size=8,
                         learning_rate=1e-2, logging_steps=20, task_eval=True, max_new_tokens=8, sample_prompts=2,
                         plots=False)
    with caplog.at_level(logging.INFO, logger="packtrain.train"):
        run_dir = run(config, tmp_path / "cache")

    summary = json.loads((run_dir / "eval.json").read_text())
    assert summary == {"expert": "neo4j", "metric": "exact", "examples": 4, "max_new_tokens": 8,
                       "base": {"exact_match": 0.0}, "adapter": {"exact_match": 1.0}}
    assert json.loads((run_dir / "summary.json").read_text())["task_eval"] == {
        "base": {"exact_match": 0.0}, "adapter": {"exact_match": 1.0}, "examples": 4}
    rows = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    assert set(rows[0]) == {"prompt", "reference", "base", "adapter", "base_scores", "adapter_scores"}
    assert all(r["adapter"] == r["reference"] and len(r["reference"].split()) == 5 for r in rows)
    assert all(len(r["prompt"].split()) == 4 and r["base"] != r["reference"] for r in rows)
    assert "base model vs adapter on 2 validation prompts:" in caplog.text
    assert f"adapter   {rows[0]['reference']}" in caplog.text
    assert "task eval (exact, 4 examples): exact_match base 0.00 -> adapter 1.00" in caplog.text


def test_task_eval_is_off_on_cpu_by_default_and_the_cli_evaluates_afterwards(tmp_path, model_dir, caplog):
    memorization_build(tmp_path / "cache", model_dir, expert="sql")
    config = make_config(model_dir, tmp_path / "runs", max_steps=2, max_new_tokens=40, sample_prompts=3, plots=False)
    with caplog.at_level(logging.INFO, logger="packtrain.train"):
        run_dir = run(config, tmp_path / "cache")
    assert not (run_dir / "eval.json").exists()
    assert "base model vs adapter on 3 validation prompts:" in caplog.text
    assert "task eval: off (auto: off on CPU)" in caplog.text
    shown = [line.split("base      ")[1] for line in caplog.text.splitlines() if "   base      " in line]
    assert len(shown) == 3 and max(len(a.split()) for a in shown) == 2 * 5 + 8  # samples: 2 x reference + 8

    from click.testing import CliRunner

    result = CliRunner().invoke(main, ["eval", "sql", "--runs-dir", str(tmp_path / "runs"), "--max-examples", "3"])
    assert result.exit_code == 0, result.output
    line = json.loads(result.output[result.output.rindex('{"run_dir"'):])  # after transformers' progress bar
    assert line["run_dir"] == str(run_dir) and line["metric"] == "sql" and line["examples"] == 3
    assert set(line["base"]) == set(line["adapter"]) == {"parses", "exact_match"}
    rows = [json.loads(r) for r in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and max(len(r["base"].split()) for r in rows) == 40  # scored: train.max_new_tokens

    again = CliRunner().invoke(main, ["eval", "sql", "--run", str(run_dir)])
    assert again.exit_code != 0 and "this run was evaluated already; move it away" in str(again.exception)
    assert len((run_dir / "eval.jsonl").read_text().splitlines()) == 3  # never overwritten


def test_eval_without_a_finished_run_says_what_to_do(tmp_path):
    from click.testing import CliRunner

    result = CliRunner().invoke(main, ["eval", "sql", "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code != 0
    assert str(result.exception) == (f"expert 'sql' has no finished run under {tmp_path / 'runs' / 'sql'}: train it "
                                     f"(`packtrain train sql --set train.output_dir={tmp_path / 'runs'}`), or name a "
                                     "run directory with --run")


def test_a_sample_prompt_keeps_its_special_tokens_as_inspect_shows_them():
    """A chat prompt is shown as the model was prompted, ``<|im_start|>`` and all (as ``packtrain inspect``
    shows a block's text); the answers and the reference stay the texts that are scored."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from packtrain.trainer.eval.task_eval import Answers

    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1, "SELECT": 2, "1": 3}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<|im_start|>", "<|im_end|>"])  # ids 4 and 5
    answers = Answers.__new__(Answers)
    answers.tokenizer = tokenizer
    answers.answer = lambda examples, adapter, **_: ["SELECT 1" if adapter else "hi"] * len(examples)
    rows = answers.side_by_side([Example([4, 1, 5, 4], [2, 3, 5])])
    assert rows == [{"prompt": "<|im_start|> hi <|im_end|> <|im_start|>", "reference": "SELECT 1", "base": "hi",
                     "adapter": "SELECT 1"}]
