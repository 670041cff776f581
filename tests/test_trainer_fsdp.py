"""FSDP2 (``train.fsdp``): 2 CPU processes (gloo) with the model sharded compute what 1 process with a
2x batch computes, save a full PEFT adapter from rank 0 and resume exactly.

The ranks are started as in tests/test_trainer_distributed.py (its helpers are reused: the same
settings, 14 train blocks, each epoch ending in a short step whose last micro-batch holds padding, warmup, cosine decay,
clipping, evaluation of 5 val blocks, i.e. 3 on rank 0 and 2 + 1 padding block on rank 1) and held to
the same tolerances: losses, eval losses and gradient norms to 1e-5 relative, adapter weights to 1e-4
absolute.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

from test_trainer_distributed import SETTINGS, assert_same_run, records, run_two_ranks, single_process_reference
from packtrain.trainer.run.checkpoint import complete_checkpoints
from packtrain.core.config import ConfigError
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build

FSDP = {**SETTINGS, "fsdp": True}


@pytest.mark.skipif(sys.platform != "linux", reason="gloo over TCP on localhost, tested on Linux")
def test_fsdp_two_ranks_match_one_process_and_resume_exactly(tmp_path, monkeypatch):
    model_dir, single = single_process_reference(tmp_path, monkeypatch)
    fsdp, calls = run_two_ranks(tmp_path, model_dir, "fsdp", settings=FSDP)
    assert_same_run(fsdp, single)

    # every rank takes part in gathering each checkpoint; only rank 0 writes metrics
    assert calls["rank1"] == ["checkpoint 2", "checkpoint 4"]
    assert [c for c in calls["rank0"] if c.startswith("checkpoint")] == ["checkpoint 2", "checkpoint 4"]
    assert [p.name for p in complete_checkpoints(fsdp)] == ["checkpoint-2", "checkpoint-4"]
    blob = torch.load(fsdp / "checkpoint-4" / "trainer_state.pt", weights_only=True)
    assert blob["optimizer_layout"] == "fsdp-full"
    state = json.loads((fsdp / "checkpoint-4" / "state.json").read_text())
    single_state = json.loads((single / "checkpoint-4" / "state.json").read_text())
    assert {k: state[k] for k in ("step", "epoch", "position", "tokens", "sup_tokens")} == \
           {k: single_state[k] for k in ("step", "epoch", "position", "tokens", "sup_tokens")}

    # the adapter (and the checkpoint's) holds full, unsharded weights in PEFT format
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    def adapted(path):
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        return PeftModel.from_pretrained(base, path)

    got, want = adapted(fsdp / "adapter"), adapted(single / "adapter")
    lora_got = {k: v for k, v in got.state_dict().items() if "lora_" in k}
    lora_want = {k: v for k, v in want.state_dict().items() if "lora_" in k}
    assert lora_got.keys() == lora_want.keys() and len(lora_got) > 0
    for key in lora_got:
        torch.testing.assert_close(lora_got[key], lora_want[key], rtol=0, atol=1e-4)
    saved = load_file(fsdp / "adapter" / "adapter_model.safetensors")
    # full shapes, not a rank's half (assert_same_run compared them with the single process's too)
    assert all((t.shape[0] == 8) if "lora_A" in k else (t.shape[1] == 8) for k, t in saved.items())
    assert saved.keys() == load_file(fsdp / "checkpoint-4" / "adapter" / "adapter_model.safetensors").keys()
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    with torch.no_grad():
        torch.testing.assert_close(got(input_ids=ids).logits, want(input_ids=ids).logits, rtol=0, atol=1e-4)

    # resuming with fsdp from checkpoint-2 redoes steps 3-4 exactly
    before = records(fsdp)
    _, calls = run_two_ranks(tmp_path, model_dir, "fsdp", settings=FSDP, resume=str(fsdp / "checkpoint-2"))
    again = fsdp.with_name("fsdp-from-2")  # fsdp is finished: it continues in a new run beside it
    assert records(again) == before and records(fsdp) == before
    assert calls["rank0"] == ["metrics 3", "metrics 4", "metrics 4", "checkpoint 4"]


@pytest.mark.parametrize("lora, train, message", [
    ({"method": "qlora"}, {}, "cannot shard a QLoRA base"),
    ({}, {"merge_adapter": True}, "merging needs the whole base on one device"),
])
def test_fsdp_refuses_qlora_and_merge(tmp_path, lora, train, message):
    model_dir = tiny_model_dir(tmp_path / "model")
    write_build(tmp_path / "cache", "sql", random_blocks(6, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    with pytest.raises(ConfigError, match=message):  # a cross-field rule: refused when the config is made
        make_config(model_dir, tmp_path / "runs", lora=lora, fsdp=True, **train)
    config = make_config(model_dir, tmp_path / "runs")
    config.train.fsdp, config.lora.method = True, lora.get("method", "lora")  # set in code after validation
    config.train.merge_adapter = train.get("merge_adapter", False)
    with pytest.raises(ConfigError, match=message):  # run() validates the config it is given again
        run(config, tmp_path / "cache")
    assert not (tmp_path / "runs").exists()  # refused before any run directory
