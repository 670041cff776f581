"""The packtrain CLI on the bundled defaults and on a hub-cache dataset; its error messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from build_fixtures import bundled_cache
from inprocess_cli import QUICK_END, cli
from packtrain.cli.commands import main
from packtrain.core.contract import read_current

ROOT = Path(__file__).resolve().parents[1]


def invoke(*args, catch=False):
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=catch)
    return result


def run_cli(*args, cwd=ROOT):
    """The real entry point in a subprocess: exit codes and stderr as a user sees them."""
    return subprocess.run([sys.executable, "-m", "packtrain.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True)


@pytest.mark.parametrize("expert", ["sql", "json", "neo4j", "typescript"])
def test_every_expert_builds_from_the_bundled_sample(expert, hf_home, tmp_path):
    cache = bundled_cache(tmp_path / "cache")
    result = invoke("pretokenize", expert, "--cache-dir", cache, "--num-proc", 1)
    assert result.exit_code == 0, result.output
    assert f"note: {expert} uses the bundled sample" in result.output
    assert "built from the BUNDLED SAMPLE" in result.output
    last = json.loads(result.output.strip().splitlines()[-1])
    assert last["up_to_date"] is False and (cache / expert / "CURRENT").read_text().strip() == last["build_id"]
    report = json.loads((cache / expert / last["build_id"] / "report.json").read_text())
    assert report["used_bundled_sample"] is True
    assert report["train"]["documents"] + report["val"]["documents"] == 3000
    assert report["bad_rows"] == 0
    again = invoke("pretokenize", expert, "--cache-dir", cache, "--num-proc", 1)
    assert "is up to date: nothing to do" in again.output
    assert json.loads(again.output.strip().splitlines()[-1])["build_id"] == last["build_id"]


def test_inspect_and_verify(hf_home, tmp_path):
    cache = bundled_cache(tmp_path / "cache")
    assert invoke("pretokenize", "sql", "--cache-dir", cache, "--num-proc", 1).exit_code == 0
    shown = invoke("inspect", "sql", "--cache-dir", cache, "--blocks", 1)
    assert shown.exit_code == 0, shown.output
    assert "═══ block 0:" in shown.output and "### Schema\nCREATE TABLE" in shown.output
    assert "⟦SELECT" in shown.output and "<|endoftext|>⟧" in shown.output
    ok = invoke("verify", "sql", "--cache-dir", cache)
    assert ok.exit_code == 0 and "all checksums match" in ok.output

    build = cache / "sql" / read_current(cache, "sql")
    shard = build / "train-00000.arrow"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    bad = run_cli("verify", "sql", "--cache-dir", cache)
    assert bad.returncode == 2
    assert f"{shard}: sha256 differs from the manifest (corrupt)" in bad.stderr
    assert f"rebuild with `packtrain pretokenize sql --cache-dir {cache}`" in bad.stderr  # the user's own options


def test_dataset_switch_reads_a_hub_snapshot(hub_cache, tmp_path):
    cache = bundled_cache(tmp_path / "cache")
    result = invoke("pretokenize", "sql", "--cache-dir", cache, "--num-proc", 1,
                    "--dataset", "b-mc2/sql-create-context", "--set", "pack.val_fraction=0")
    assert result.exit_code == 0, result.output
    assert "source: hub dataset b-mc2/sql-create-context@aaaaaaaa [train]" in result.output
    assert "bundled" not in result.output.split("source:")[1].splitlines()[0]
    report = json.loads((cache / "sql" / json.loads(result.output.strip().splitlines()[-1])["build_id"]
                         / "report.json").read_text())
    assert report["train"]["documents"] == 5 and report["used_bundled_sample"] is False
    manifest = json.loads((cache / "sql" / report["build_id"] / "manifest.json").read_text())
    source = manifest["inputs"]["sources"][0]["source"]
    assert (source["kind"], source["revision"]) == ("hub", "a" * 40)


def test_config_prints_the_resolved_config_with_overrides(tmp_path):
    result = invoke("config", "neo4j", "--set", "pack.block_size=1024", "--set", "train.learning_rate=1e-4",
                    "--set", "cpu.enabled=false")  # on a CPU the cpu section would set the block size
    resolved = yaml.safe_load(result.output)
    assert json.loads(invoke("config", "neo4j", "--set", "pack.block_size=1024", "--set", "train.learning_rate=1e-4",
                             "--set", "cpu.enabled=false", "--json").output) == resolved
    # YAML one can paste back: as configs/neo4j.yaml it resolves to the same config
    (tmp_path / "neo4j.yaml").write_text(result.output)
    assert yaml.safe_load(invoke("config", "neo4j", "--configs-dir", str(tmp_path)).output) == resolved
    assert resolved["pack"]["block_size"] == 1024 and resolved["train"]["learning_rate"] == 1e-4
    assert resolved["format"]["answer"] == "{cypher}"
    assert resolved["sources"] == [{"name": "bundled", "split": "train", "revision": None, "config": None, "columns": {},
                                    "max_rows": None, "where": [], "role": "train", "weight": 1.0}]


def test_errors_say_what_is_wrong_and_how_to_fix_it(hf_home, tmp_path):
    unknown = run_cli("pretokenize", "cobol", "--cache-dir", tmp_path)
    assert unknown.returncode == 2
    assert "no config for expert 'cobol'" in unknown.stderr and "json, neo4j, sql, typescript" in unknown.stderr

    escape = run_cli("pretokenize", "../etc", "--cache-dir", tmp_path)
    assert escape.returncode == 2 and "invalid expert name '../etc'" in escape.stderr

    missing = run_cli("pretokenize", "sql", "--cache-dir", tmp_path, "--dataset", "nobody/nothing")
    assert missing.returncode == 2
    assert str(hf_home / "hub") in missing.stderr and str(hf_home / "datasets") in missing.stderr

    bad_key = run_cli("pretokenize", "sql", "--cache-dir", tmp_path, "--set", "pack.blocksize=8",
                        "--set", "train.lr=1")
    assert bad_key.returncode == 2
    assert "pack.blocksize: unknown key" in bad_key.stderr and "train.lr: unknown key" in bad_key.stderr

    no_build = run_cli("inspect", "sql", "--cache-dir", tmp_path)
    assert no_build.returncode == 2 and f"run `packtrain pretokenize sql --cache-dir {tmp_path}` first" in no_build.stderr
    assert "Traceback" not in unknown.stderr + escape.stderr + missing.stderr + bad_key.stderr + no_build.stderr


def test_discover_lists_the_hub_cache(hub_cache):
    result = invoke("discover")
    assert result.exit_code == 0, result.output
    assert "b-mc2/sql-create-context" in result.output and "org/parquet-ds" in result.output


def test_train_on_the_bundled_sample_writes_a_loadable_adapter(hf_home, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    from packtrain.core.contract import BUNDLED_MODEL_DIR

    cache, runs = bundled_cache(tmp_path / "cache"), tmp_path / "runs"
    assert invoke("pretokenize", "sql", "--cache-dir", cache, "--num-proc", 1).exit_code == 0
    result = invoke("train", "sql", "--cache-dir", cache, "--max-steps", 2, "--set", f"train.output_dir={runs}",
                    "--set", "train.per_device_train_batch_size=1", "--set", "train.max_eval_batches=1",
                    "--set", "train.dataloader_num_workers=0", *QUICK_END)
    assert result.exit_code == 0, result.output
    run_dir = Path(json.loads(result.output.strip().splitlines()[-1])["run_dir"])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r and "eval/loss" not in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert {"loss", "lr", "grad_norm", "tok_s", "sup_tok_s", "data_wait", "mem/peak_gib"} <= set(steps[0])
    base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(BUNDLED_MODEL_DIR))
    model = PeftModel.from_pretrained(base, run_dir / "adapter")
    assert model(torch.tensor([[5, 6, 7]])).logits.shape == (1, 3, 8192)


def test_train_refuses_a_build_made_with_another_tokenizer(hf_home, tmp_path):
    from build_fixtures import make_tokenizer

    cache = bundled_cache(tmp_path / "cache")
    assert invoke("pretokenize", "sql", "--cache-dir", cache, "--num-proc", 1).exit_code == 0
    other = make_tokenizer(tmp_path / "other-model")
    (other / "config.json").write_text((ROOT / "packtrain/core/assets/demo-model/config.json").read_text())
    refused = cli("train", "sql", "--cache-dir", cache, "--model", other, "--max-steps", 1,
                  "--set", f"train.output_dir={tmp_path / 'runs'}")  # in this process: no torch import
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "tokenizer.json" in refused.stderr and f"`packtrain pretokenize sql --cache-dir {cache} --model {other}`" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "runs" / "sql").exists() or not any((tmp_path / "runs" / "sql").rglob("adapter"))


def test_a_bad_option_or_argument_is_one_line(tmp_path):
    cases = [
        (["eval", "sql", "--max-examples", "0"],
         "error: Invalid value for '--max-examples': 0 is not in the range x>=1. (see `packtrain eval --help`)"),
        (["eval"], "error: Missing argument 'EXPERT'. (see `packtrain eval --help`)"),
        (["plot", "sql", "--nope"], "error: No such option '--nope'. (see `packtrain plot --help`)"),
        (["evl", "sql"], "error: No such command 'evl'. Did you mean 'eval'? (see `packtrain --help`)"),
        (["inspect", "sql", "--blocks", "-3"],  # was "showing -3" and exit 0 (attack 53)
         "error: Invalid value for '--blocks': -3 is not in the range x>=1. (see `packtrain inspect --help`)"),
    ]
    for args, line in cases:
        refused = run_cli(*args, cwd=tmp_path)
        stderr = refused.stderr.replace("python -m packtrain.cli", "packtrain")  # the program name click sees here
        assert (refused.returncode, stderr) == (2, line + "\n")
    help_text = run_cli(cwd=tmp_path)  # `packtrain` alone still shows the help
    assert "Commands:" in help_text.stdout + help_text.stderr
