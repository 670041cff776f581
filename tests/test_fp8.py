"""``model.base_precision``: which layers become fp8 (torchao's Float8Linear, emulated on CPU), what
auto decides, and the one-line refusals where fp8 cannot run. The real fp8 loss against bf16's is a
CUDA test (tests/test_gpu.py)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from packtrain.core.config import ConfigError
from packtrain.core.configfile import config_from_dict
from packtrain.core.config_train import LoraConfig
from packtrain.trainer.model import fp8
from packtrain.trainer.model.adapters import attach_adapters
from packtrain.trainer.model.fp8 import choose_base_precision, convert_base_to_fp8
from trainer_fixtures import make_config, random_blocks, tiny_model_dir, write_build

pytest.importorskip("torchao.float8")
from torchao.float8.float8_linear import Float8Linear  # noqa: E402

CUDA = torch.device("cuda")
BF16 = torch.bfloat16


@pytest.fixture
def gpu(monkeypatch):
    """A stand-in GPU of compute capability ``gpu(major, minor)`` (no CUDA needed: only these are asked)."""
    def set_capability(major: int, minor: int) -> None:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: f"GPU sm{major}{minor}")
    return set_capability


def test_auto_takes_fp8_for_7b_class_models_on_hopper_only(gpu):
    gpu(9, 0)
    assert choose_base_precision("auto", CUDA, 3584, BF16).name == "fp8"  # Qwen2.5-7B
    small = choose_base_precision("auto", CUDA, 896, BF16)  # Qwen2.5-0.5B
    assert small.name == "bf16" and "hidden size 896 < 3584" in small.note
    assert choose_base_precision("bf16", CUDA, 4096, BF16).name == "bf16"
    assert choose_base_precision("fp8", CUDA, 896, BF16).name == "fp8"  # asked for: converted whatever the size
    gpu(8, 0)
    a100 = choose_base_precision("auto", CUDA, 4096, BF16)
    assert a100.name == "bf16" and "compute capability 8.0" in a100.note
    cpu = choose_base_precision("auto", torch.device("cpu"), 4096, None)
    assert cpu.name == "bf16" and "this run is on cpu" in cpu.note


def test_auto_keeps_bf16_where_nothing_compiles(gpu, caplog):
    gpu(9, 0)
    eager = choose_base_precision("auto", CUDA, 4096, BF16, compiled=False)
    assert eager.name == "bf16" and "train.torch_compile is false" in eager.note
    assert choose_base_precision("fp8", CUDA, 4096, BF16, compiled=False).name == "fp8"
    assert "unused weight gradient" in caplog.text


def test_compiled_fp8_layers_compute_no_weight_gradient():
    """torchao's float8 backward returns the frozen weight's gradient too; compiled, AOTAutograd drops it:
    the backward graph holds one matmul (the input's gradient), not two."""
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func

    graphs = {}

    def keep(name):
        def compiler(graph_module, inputs):
            graphs[name] = graph_module
            return make_boxed_func(graph_module.forward)
        return compiler

    import dataclasses

    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    model = torch.nn.Sequential(torch.nn.Linear(64, 128, bias=False)).requires_grad_(False)
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(fp8.RECIPE), emulate=True)
    convert_to_float8_training(model, config=config)
    compiled = torch.compile(model, backend=aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward")))
    compiled(torch.randn(32, 64, requires_grad=True)).sum().backward()
    matmuls = {name: [n for n in g.graph.nodes if n.op == "call_function" and n.target == torch.ops.aten.mm.default]
               for name, g in graphs.items()}
    assert {name: len(found) for name, found in matmuls.items()} == {"forward": 1, "backward": 1}
    torch._dynamo.reset()


def test_fp8_where_it_cannot_run_is_one_line_naming_the_fix(gpu):
    gpu(8, 6)
    with pytest.raises(ConfigError) as raised:
        choose_base_precision("fp8", CUDA, 4096, BF16)
    assert str(raised.value) == ("model.base_precision: fp8 cannot run here: GPU sm86 has compute capability 8.6, "
                                 "fp8 matmuls need >= 8.9 (Ada, Hopper); set model.base_precision: auto or bf16")
    gpu(9, 0)
    with pytest.raises(ConfigError, match=r"need bf16 training \(train.bf16: true"):
        choose_base_precision("fp8", CUDA, 4096, torch.float16)
    with pytest.raises(ConfigError, match="this run is on cpu; set model.base_precision: auto or bf16"):
        choose_base_precision("fp8", torch.device("cpu"), 4096, None)


def test_fp8_without_torchao_says_how_to_install_it(gpu, monkeypatch):
    import sys

    gpu(9, 0)
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # import fails as when not installed
    with pytest.raises(ConfigError, match=r"torchao cannot be imported .*pip install 'packtrain\[fp8\]'"):
        choose_base_precision("fp8", CUDA, 4096, BF16)
    assert "pip install 'packtrain[fp8]'" in choose_base_precision("auto", CUDA, 4096, BF16).note


def test_qlora_with_fp8_is_refused_when_the_config_loads():
    with pytest.raises(ConfigError) as raised:
        config_from_dict({"expert": "sql", "sources": [{"name": "bundled"}], "model": {"base_precision": "fp8"},
                          "lora": {"method": "qlora"}})
    assert str(raised.value) == ("invalid config (<dict>): model.base_precision: fp8 with lora.method: qlora: the QLoRA "
                                 "base is NF4 already, there is no bf16 base to compute in fp8; use lora.method: lora "
                                 "with fp8, or base_precision: auto with qlora")


def test_only_the_base_linear_layers_become_fp8_and_the_adapters_wrap_them(tmp_path):
    directory = tiny_model_dir(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.requires_grad_(False)
    ids = torch.randint(4, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    names = convert_base_to_fp8(model, emulate=True)
    per_layer = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    assert sorted(names) == sorted(f"model.layers.{i}.{n}" for i in range(2) for n in per_layer)
    assert type(model.lm_head) is torch.nn.Linear and type(model.model.embed_tokens) is torch.nn.Embedding

    model = attach_adapters(model, LoraConfig(r=4), gradient_checkpointing=False)
    wrapped = [m for name, m in model.named_modules() if name.endswith("q_proj")]
    assert all(type(m.base_layer) is Float8Linear for m in wrapped) and len(wrapped) == 2
    adapters = [m for name, m in model.named_modules() if "lora_A" in name or "lora_B" in name]
    assert adapters and not any(isinstance(m, Float8Linear) for m in adapters)
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)

    got = model(input_ids=ids).logits  # LoRA B is zero: the base alone, through e4m3 casts
    assert (got - want).abs().max() <= 0.1 * want.abs().max()  # e4m3: ~3 significant bits per operand
    assert (got - want).abs().max() > 0  # the casts did happen
    got.float().logsumexp(-1).sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_a_run_with_fp8_records_it(tmp_path, monkeypatch):
    """The whole run through fp8 base layers (torchao's emulation standing in for the GPU): trained,
    checkpointed, its adapter saved, and run.json says which precision the base used."""
    monkeypatch.setattr(fp8, "fp8_unsupported", lambda device, dtype: None)
    model_dir = tiny_model_dir(tmp_path / "model")
    write_build(tmp_path / "cache", "sql", random_blocks(6, 64, 0), random_blocks(2, 64, 1), 64, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=2, sample_prompts=0, plots=False)
    config.model.base_precision = "fp8"
    from packtrain.trainer.run.train import run

    run_dir = run(config, tmp_path / "cache")
    info = json.loads((run_dir / "run.json").read_text())
    assert info["base_precision"] == "fp8"
    assert "base linear layers: fp8 (torchao float8, rowwise scaling; model.base_precision: fp8): 14 linear layers" \
        in (run_dir / "train.log").read_text()
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()
