"""Activation memory (issue 45): ``train.gradient_checkpointing`` (auto, every k-th layer, offload) on a tiny
model, its choice against a memory model, the estimate against a meta-device count of what autograd saves,
and the memory budget ``train.max_memory_gib``. No GPU: CUDA calls are stood in for where they are reached."""

from __future__ import annotations

import json
import logging
import types
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from packtrain.core.config import ConfigError
from packtrain.core.config_train import LoraConfig
from packtrain.trainer.model import activations, memory, microbatch
from packtrain.trainer.model.activations import FULL, LADDER, OFF, OFFLOAD, Checkpointing
from packtrain.trainer.model.adapters import attach_adapters
from packtrain.trainer.model.memory import GIB, Budget, MemoryModel, choose_by_estimate, layer_bytes_per_token
from packtrain.trainer.model.microbatch import Trial, choose
from packtrain.trainer.run.run_checks import TrainError
from packtrain.trainer.step import packed_loss_sum
from packtrain.trainer.run.train import run
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"), layers=4)


def lora_model(model_dir, checkpointing):
    base = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32)
    base.config.use_cache = False
    model = attach_adapters(base, LoraConfig(r=4, alpha=8, dropout=0.0), checkpointing)
    torch.manual_seed(1)
    with torch.no_grad():  # lora_B starts at zero: make every adapter matter, so lora_A gets gradients too
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return model.train()


def loss_and_grads(model) -> tuple[float, dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 200, (2, 24), generator=gen)
    positions = torch.cat([torch.arange(10), torch.arange(14)]).repeat(2, 1)  # two packed documents a block
    loss = packed_loss_sum(model, ids, positions, ids.clone())
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("value, layers", [(False, []), (2, [0, 2]), (3, [0, 3]), (True, [0, 1, 2, 3]),
                                           ("offload", [0, 1, 2, 3]), ("auto", [])])
def test_which_layers_recompute(model_dir, value, layers):
    """Selective: layers 0, k, 2k, ... (transformers' every_n_layers); auto starts with none (decided later)."""
    model = lora_model(model_dir, value)
    assert activations.checkpointed_layers(model) == layers
    runs = {i: 0 for i in range(4)}
    for i, layer in enumerate(activations.decoder_layers(model)):
        layer.mlp.register_forward_pre_hook(lambda *_, i=i: runs.__setitem__(i, runs[i] + 1))
    loss_and_grads(model)
    assert [i for i, n in runs.items() if n == 2] == layers  # recomputed in the backward: its forward ran twice
    assert all(n in (1, 2) for n in runs.values())


@pytest.mark.parametrize("value", [2, True, "offload"])
def test_checkpointing_changes_neither_the_loss_nor_the_gradients(model_dir, value, monkeypatch):
    import transformers.modeling_utils as hf

    offloads = []
    real = hf.save_on_cpu

    def recorded(**kwargs):  # pinned memory needs an accelerator: this CPU copies to plain memory
        offloads.append(kwargs)
        return real(**{**kwargs, "pin_memory": False})
    monkeypatch.setattr(hf, "save_on_cpu", recorded)
    monkeypatch.setattr(activations, "offload_possible", lambda model: True)  # as on a GPU
    reference_loss, reference = loss_and_grads(lora_model(model_dir, False))
    loss, grads = loss_and_grads(lora_model(model_dir, value))
    assert loss == pytest.approx(reference_loss, rel=1e-6)
    assert grads.keys() == reference.keys() and len(grads) == 4 * 7 * 2
    for name, grad in grads.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(grad, reference[name], rtol=1e-5, atol=1e-7)
    # offload: each layer's checkpoint ran inside save_on_cpu, pinned, once a layer a forward
    assert offloads == ([{"pin_memory": True, "device_type": "cpu"}] * 4 if value == "offload" else [])


def test_offload_on_a_cpu_is_every_layer_and_said(model_dir, caplog):
    with caplog.at_level(logging.INFO, "packtrain.train"):
        model = lora_model(model_dir, "offload")
    assert activations.checkpointed_layers(model) == [0, 1, 2, 3]
    assert "offload on cpu: the activations live in host memory already; every layer recomputes" in caplog.text
    loss_and_grads(model)  # transformers' save_on_cpu(pin_memory=True) would fail here: no pinned allocator


def test_switching_plans_on_a_peft_model(model_dir):
    model = lora_model(model_dir, True)
    assert activations.apply(model, Checkpointing(2)) == [0, 2]
    assert activations.apply(model, OFF) == [] and activations.checkpointed_layers(model) == []
    assert activations.apply(model, OFFLOAD) == [0, 1, 2, 3]


@pytest.mark.parametrize("value, message", [
    (0, "train.gradient_checkpointing: must be in [1, 65536] (or true, false, auto, offload), got 0"),
    (-2, "train.gradient_checkpointing: must be in [1, 65536] (or true, false, auto, offload), got -2"),
    ("sometimes", "train.gradient_checkpointing: expected true, false, an integer or 'auto', 'offload', got 'sometimes'"),
    (2.5, "train.gradient_checkpointing: expected true, false, an integer or 'auto', 'offload', got 2.5"),
])
def test_bad_checkpointing_values_are_refused_in_one_line(tmp_path, value, message):
    with pytest.raises(ConfigError) as err:
        make_config(tmp_path, tmp_path, gradient_checkpointing=value)
    assert message in str(err.value)


@pytest.mark.parametrize("value, message", [
    (0, "train.max_memory_gib: must be in (0, 1048576] (or unset: the whole GPU), got 0"),
    (-1.5, "train.max_memory_gib: must be in (0, 1048576] (or unset: the whole GPU), got -1.5"),
    (float("nan"), "train.max_memory_gib: must be a finite number in (0, 1048576]"),
    ("lots", "train.max_memory_gib: expected a number or null, got 'lots'"),
])
def test_bad_budgets_are_refused_in_one_line(tmp_path, value, message):
    with pytest.raises(ConfigError) as err:
        make_config(tmp_path, tmp_path, max_memory_gib=value)
    assert message in str(err.value)
    assert make_config(tmp_path, tmp_path, max_memory_gib=24).train.max_memory_gib == 24.0


def test_the_budget_caps_the_process_at_its_share_of_the_card(monkeypatch, caplog):
    capped = []
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: types.SimpleNamespace(total_memory=80 * GIB, name="NVIDIA H100 80GB HBM3"))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, device: capped.append((f, device)))
    cuda = torch.device("cuda", 0)
    with caplog.at_level(logging.INFO, "packtrain.train"):
        assert memory.apply_budget(24, cuda) == Budget(24 * GIB, 80 * GIB, True)
    assert capped == [(0.3, cuda)]
    assert "budget 24.0 GiB (train.max_memory_gib, of the GPU's 80.0)" in caplog.text
    assert memory.apply_budget(None, cuda) == Budget(80 * GIB, 80 * GIB, False) and len(capped) == 1  # not capped
    with pytest.raises(memory.MemoryBudgetError, match=r"^train.max_memory_gib: 96 GiB is more than NVIDIA H100 80GB "
                       r"HBM3 has \(80.0 GiB\): lower it, or unset it to use the whole GPU$"):
        memory.apply_budget(96, cuda)
    assert len(capped) == 1
    assert Budget(24 * GIB, 80 * GIB, True).usable == pytest.approx(0.85 * 24 * GIB)


def test_a_budget_on_a_cpu_is_ignored_and_said(caplog):
    with caplog.at_level(logging.WARNING, "packtrain.train"):
        assert memory.apply_budget(24, torch.device("cpu")) is None
    assert ("train.max_memory_gib: 24 GiB is a GPU memory budget; on cpu it is ignored (host memory is not capped)"
            in caplog.text)


def saved_bytes(hidden, intermediate, heads, kv_heads, layers, tokens=64) -> int:
    """What autograd saves for the backward of a LoRA r16 all-linear Qwen2 forward on the meta device (no
    memory used), counted once per storage, the parameters left out; attention through a stand-in that saves
    what flash / varlen attention saves (q, k, v, the output, an fp32 log-sum-exp per head and position)."""
    from transformers import AttentionInterface, AutoConfig

    class SavesLikeFlash(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            out = torch.empty_like(q)
            ctx.save_for_backward(q, k, v, out, torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device))
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v, *_ = ctx.saved_tensors
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    AttentionInterface.register("saves_like_varlen", lambda module, q, k, v, mask, **kw:
                                (SavesLikeFlash.apply(q, k, v).transpose(1, 2), None))
    config = AutoConfig.for_model("qwen2", hidden_size=hidden, intermediate_size=intermediate, vocab_size=512,
                                  num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=layers)
    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="saves_like_varlen")
    base.requires_grad_(False)
    model = attach_adapters(base, LoraConfig(), False).to(torch.bfloat16)
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    saved = {}

    def pack(t):
        if t.untyped_storage()._cdata not in params:
            saved[t.untyped_storage()._cdata] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=torch.zeros(1, tokens, dtype=torch.long, device="meta"), use_cache=False)
    return sum(saved.values())


@pytest.mark.parametrize("name, hidden, intermediate, heads, kv_heads, expected", [
    ("Qwen2.5-0.5B", 896, 4864, 14, 2, 54048), ("Qwen2.5-7B", 3584, 18944, 28, 4, 211288)])
def test_the_layer_estimate_is_what_autograd_saves_on_the_meta_device(name, hidden, intermediate, heads, kv_heads,
                                                                      expected):
    per_layer = (saved_bytes(hidden, intermediate, heads, kv_heads, 2) - saved_bytes(hidden, intermediate, heads,
                                                                                     kv_heads, 1)) / 64
    head_dim = hidden // heads
    assert per_layer == expected
    assert layer_bytes_per_token(hidden, intermediate, hidden, kv_heads * head_dim, heads, 16 * 7) == expected


QWEN_7B = MemoryModel(fixed=int(15.5 * GIB), layers=28, layer_bytes=211288, input_bytes=2 * 3584,
                      other_bytes=6 * 3584, loss_row_bytes=0)
"""Qwen2.5-7B LoRA r16 bf16 with the fused loss: 15.2 GB of weights, the adapters' states; per token the estimate."""


def fake_7b(monkeypatch, tokens_per_block=2048):
    """A stand-in for the measurement: the peak from QWEN_7B, the time from the FLOP model (4N per token, a
    recomputed layer's forward again: + 2N x its share) plus a fixed 40 ms of launches per forward."""
    plan_now = {"plan": OFF}

    def measure(step, micro, plan, limit, device):
        peak = QWEN_7B.peak(micro * tokens_per_block, plan)
        seconds = micro * tokens_per_block * 7.6e9 * (4 + 2 * plan.recompute) / 400e12 + 0.040
        return Trial(micro, plan, peak / GIB, seconds if peak <= limit else None)
    monkeypatch.setattr(microbatch, "_measure", measure)
    return lambda plan: plan_now.update(plan=plan)


def test_a_7b_lora_on_80_gb_ends_without_full_recompute(monkeypatch):
    use = fake_7b(monkeypatch)
    trials = microbatch.search(None, 16, Budget(80 * GIB, 80 * GIB, False).usable, LADDER, use, None)
    chosen = choose(trials)
    assert [(t.micro, t.plan.label, t.fits) for t in trials] == [
        (1, "off", True), (2, "off", True), (4, "off", True), (8, "off", False),
        (8, "every 4th layer", False), (8, "every 2nd layer", True), (16, "every 2nd layer", False),
        (16, "every layer", True)]
    assert (chosen.micro, chosen.plan) == (4, OFF)  # 4 x 2048 without recompute beats 16 with it


def test_a_7b_lora_in_24_gib_recomputes(monkeypatch):
    use = fake_7b(monkeypatch)
    trials = microbatch.search(None, 16, Budget(24 * GIB, 80 * GIB, True).usable, LADDER, use, None)
    chosen = choose(trials)
    assert (chosen.micro, chosen.plan) == (4, FULL)
    assert (1, "off", False) in [(t.micro, t.plan.label, t.fits) for t in trials]


def test_the_estimate_picks_the_least_recompute_that_fits():
    usable = Budget(80 * GIB, 80 * GIB, False).usable
    assert [choose_by_estimate(QWEN_7B, micro * 2048, usable)[0] for micro in (2, 4, 8, 16)] == [
        OFF, OFF, Checkpointing(2), FULL]
    plan, lines = choose_by_estimate(QWEN_7B, 2048, Budget(16 * GIB, 80 * GIB, True).usable)
    # nothing fits (the weights alone are over 85% of 16 GiB): the last resort, and the log says so plan by plan
    assert plan == OFFLOAD and lines == ["off: 26.8 GiB (over)", "every 4th layer: 24.5 GiB (over)",
                                         "every 2nd layer: 21.8 GiB (over)", "every layer: 16.3 GiB (over)",
                                         "every layer, offloaded: 15.9 GiB (over)"]
    assert choose_by_estimate(QWEN_7B, 2048, Budget(24 * GIB, 80 * GIB, True).usable)[0] == FULL


def test_auto_with_a_fixed_micro_batch_follows_the_estimate(model_dir, monkeypatch, caplog):
    """On a (stood-in) CUDA budget the estimate of the tiny model picks the least recompute that fits; the model
    is switched to it and the resolved value is what the run records."""
    from packtrain.trainer.model.model import choose_precision
    from packtrain.trainer.step import LossPath

    model = lora_model(model_dir, "auto")
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)  # nothing loaded on a device here
    cpu = torch.device("cpu")
    path = LossPath(cpu, choose_precision(make_config(model_dir, ".").train, cpu))  # fp32: 4-byte activations
    adapters = 12 * sum(p.numel() for p in model.parameters() if p.requires_grad)  # fp32 gradients and AdamW states
    estimate = memory.model_for(model, adapters, 4, 4, fused_loss=False)
    # hidden 64, MLP 128, 4 heads of 16, 2 kv heads, r4 on 7 linear layers: 3,976 bytes a token a layer in fp32
    assert estimate == MemoryModel(adapters, 4, 3976, 256, 768, 12 * 256)
    train = make_config(model_dir, ".", per_device_train_batch_size=4).train  # 4 x 512 = 2048 tokens a forward
    train_set = types.SimpleNamespace(seq_length=512)
    resolved = {}
    for plan in (OFF, Checkpointing(2), FULL):
        budget = Budget(int(estimate.peak(2048, plan) / 0.85) + 1, 80 * GIB, True)  # just fits
        resolved[plan.label] = (microbatch.resolve(train, model, train_set, path, None, budget).gradient_checkpointing,
                                activations.checkpointed_layers(model))
    assert resolved == {"off": (False, []), "every 2nd layer": (2, [0, 2]), "every layer": (True, [0, 1, 2, 3])}
    with caplog.at_level(logging.INFO, "packtrain.train"):
        microbatch.resolve(train, model, train_set, path, None, Budget(10**6, 80 * GIB, True))  # nothing fits
    assert "activation checkpointing auto: every layer, offloaded, the least recompute whose estimated peak fits " \
           "0.0 GiB (budget 0.0 GiB (train.max_memory_gib, of the GPU's 80.0) less 15%) at 2048 tokens per forward: " \
           "off: 0.0 GiB (over);" in caplog.text


@pytest.fixture
def build(tmp_path, model_dir):
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    return tmp_path / "cache"


def test_auto_on_a_cpu_trains_without_checkpointing_and_a_number_is_kept(tmp_path, model_dir, build):
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=1, max_memory_gib=24), build)
    assert json.loads((run_dir / "run.json").read_text())["gradient_checkpointing"] is False
    log = (run_dir / "train.log").read_text()
    assert "activation checkpointing auto on cpu: off (no device memory to budget)" in log
    assert "train.max_memory_gib: 24 GiB is a GPU memory budget; on cpu it is ignored" in log
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=1, gradient_checkpointing=2), build)
    assert json.loads((run_dir / "run.json").read_text())["gradient_checkpointing"] == 2


def test_running_out_of_memory_is_one_line_and_keeps_the_checkpoints(tmp_path, model_dir, build, monkeypatch):
    from packtrain.trainer import loop
    from packtrain.trainer.run.checkpoint import verify_checkpoint

    calls = {"n": 0}
    real = loop.forward_loss

    def forward_loss(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # step 3 (one micro-batch a step)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, **kwargs)
    monkeypatch.setattr(loop, "forward_loss", forward_loss)
    config = make_config(model_dir, tmp_path / "runs", max_steps=4, save_steps=1)
    with pytest.raises(TrainError) as err:
        run(config, build)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("out of memory of the device at 2 sequence(s) of 32 tokens per forward, activation "
                              "checkpointing off; reduce memory with: train.per_device_train_batch_size (now 2; ")
    assert "train.gradient_checkpointing: true (every layer) or offload" in message
    run_dir = next((tmp_path / "runs" / "sql").iterdir())
    for name in ("checkpoint-1", "checkpoint-2"):
        verify_checkpoint(run_dir / name)  # written before the failure, still whole
    monkeypatch.setattr(loop, "forward_loss", real)
    assert run(config, build, resume="auto") == run_dir  # and the run goes on from step 2


def test_running_out_of_memory_while_loading_names_the_budget_and_creates_nothing(tmp_path, model_dir, build,
                                                                                  monkeypatch):
    from packtrain.trainer.run import context

    def load(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")
    monkeypatch.setattr(context, "load_base_model", load)
    monkeypatch.setattr(context, "apply_budget", lambda gib, device: Budget(24 * GIB, 80 * GIB, True))
    with pytest.raises(TrainError, match=r"^out of memory within the budget 24.0 GiB \(train.max_memory_gib, of the "
                       r"GPU's 80.0\) at 2 sequence\(s\) of 32 tokens per forward, activation checkpointing auto \(not "
                       r"yet chosen\); reduce memory with: .*; or raise train.max_memory_gib \(at most the GPU's 80.0 "
                       r"GiB\)$"):
        run(make_config(model_dir, tmp_path / "runs"), build)
    assert not (tmp_path / "runs" / "sql").exists() or not any((tmp_path / "runs" / "sql").iterdir())


def test_the_cli_refuses_a_budget_that_is_no_number(tmp_path):
    from click.testing import CliRunner

    from packtrain.cli.commands import main

    result = CliRunner().invoke(main, ["train", "sql", "--max-memory-gib", "nan"])
    assert result.exit_code == 2 and "--max-memory-gib" in result.output and "finite" in result.output


def test_the_cli_option_sets_the_budget_of_every_stage(tmp_path, monkeypatch):
    from click.testing import CliRunner

    import packtrain.core.preflight as preflight
    import packtrain.trainer.run.curriculum as curriculum
    from packtrain.cli import commands

    trained = []
    monkeypatch.setattr(preflight, "check_train_inputs", lambda *args, **kwargs: None)
    monkeypatch.setattr(commands, "ensure_converted", lambda cfg: None)
    monkeypatch.setattr(curriculum, "train_expert", lambda cfg, *args, **kwargs: trained.append(cfg.train))
    configs = str(Path(__file__).resolve().parents[1] / "configs")
    result = CliRunner().invoke(commands.main, ["train", "sql", "--configs-dir", configs, "--model", "bundled",
                                                "--max-memory-gib", "24"])
    assert result.exit_code == 0, result.output
    assert [t.max_memory_gib for t in trained] == [24.0]
    result = CliRunner().invoke(commands.main, ["train", "sql", "--configs-dir", configs, "--max-memory-gib", "0"])
    assert result.exit_code == 2 and "--max-memory-gib" in result.output
