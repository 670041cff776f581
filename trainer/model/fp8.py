"""FP8 for the frozen base (``model.base_precision``): its linear layers compute in float8, the adapters do not.

A LoRA step spends nearly all its FLOPs in the frozen base's matrices (forward, and the gradient of
their input; never a weight gradient). torchao's float8 training linear layer (``Float8Linear``,
rowwise scaling: one scale per row of each operand, the recipe that keeps large models' loss) casts
the input, the weight and the output gradient to float8 e4m3 on the fly and multiplies them with the
fp8 tensor cores of compute capability >= 8.9 (Ada, Hopper and later). What is converted, and what
is not::

    model.embed_tokens            Embedding    kept (not a matmul)
    layers.*.self_attn.q_proj     Linear       -> Float8Linear, then peft wraps it: lora.Linear(base_layer=Float8Linear)
    layers.*.mlp.down_proj        Linear       -> Float8Linear
    lm_head                       Linear       kept (the loss' logits stay in bf16)
    lora_A / lora_B               Linear       never (made by peft after the conversion, bf16/fp32 as without fp8)

The conversion runs on the loaded base, before peft attaches the adapters: peft then wraps each
``Float8Linear`` (an ``nn.Linear``) as it wraps any linear layer, so the adapters, their optimizer
and the saved adapter are exactly what a bf16 run has. The base weights stay bf16 in memory (cast
per step), so fp8 saves time, not memory. ``auto`` takes it only where it gains: torchao's own
benchmarks (``torchao/float8/README.md``) show fp8 slower than bf16 on small shapes (M, K, N = 1024,
2048, 1024: 0.80x) and faster on 7B-class ones (4096, 8192, 16384: 1.39x), so ``auto`` needs a
hidden size of at least :data:`AUTO_MIN_HIDDEN` (Qwen2.5-7B: 3584, Llama-3-8B: 4096; Qwen2.5-0.5B's
896 and 1.5B's 1536 stay bf16). Layers whose sizes are not multiples of 16 (the fp8 matmul's
requirement) are never converted.

On CPU (tests) torchao's emulation (``Float8LinearConfig(emulate=True)``) runs the same casts with a
plain matmul: the plumbing is tested there; tests/test_gpu.py compares real fp8 losses with bf16's.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from packtrain.core.config import ConfigError

log = logging.getLogger("packtrain.train")

AUTO_MIN_HIDDEN = 3584
"""``base_precision: auto`` converts models whose hidden size is at least this (7B class)."""

MIN_CAPABILITY = (8, 9)
"""fp8 tensor cores: Ada (8.9), Hopper (9.0) and later."""

RECIPE = "rowwise"
"""torchao's float8 recipe: a scale per row of every operand (tensorwise loses accuracy on large models)."""


@dataclass(frozen=True)
class BasePrecision:
    name: str   # "fp8" or "bf16" (the training precision)
    note: str   # why, for the log


def choose_base_precision(setting: str, device: torch.device, hidden_size: int | None,
                          autocast_dtype: torch.dtype | None, compiled: bool = True) -> BasePrecision:
    """``model.base_precision`` decided for this device and model; ``fp8`` where it cannot run is a
    ConfigError (one line: what is missing, what to set). QLoRA with fp8 never gets here (the config refuses it).

    ``compiled``: the run uses torch.compile. torchao's float8 backward computes the weight's gradient even
    for a frozen weight; compiled, that matmul is dead code and removed (tests/test_fp8.py checks the
    backward graph), eager it is a third matmul per layer: ``auto`` then keeps bf16, ``fp8`` warns."""
    if setting == "bf16":
        return BasePrecision("bf16", "the training precision (model.base_precision: bf16)")
    missing = fp8_unsupported(device, autocast_dtype)
    if setting == "fp8":
        if missing:
            raise ConfigError(f"model.base_precision: fp8 cannot run here: {missing}; set model.base_precision: "
                              "auto or bf16")
        if not compiled:
            log.warning("model.base_precision: fp8 with train.torch_compile: false: torchao's float8 backward computes "
                        "an unused weight gradient in every base layer (compiled, it is removed); expect fp8 to be "
                        "slower than bf16 unless train.torch_compile is auto or regional")
        return BasePrecision("fp8", f"fp8 (torchao float8, {RECIPE} scaling; model.base_precision: fp8)")
    if missing:
        return BasePrecision("bf16", f"the training precision (auto: {missing})")
    if not compiled:
        return BasePrecision("bf16", "the training precision (auto: train.torch_compile is false, and eager fp8 layers "
                             "compute an unused weight gradient)")
    if hidden_size is None or hidden_size < AUTO_MIN_HIDDEN:
        return BasePrecision("bf16", f"the training precision (auto: hidden size {hidden_size} < {AUTO_MIN_HIDDEN}, "
                             "too small for fp8 to gain)")
    return BasePrecision("fp8", f"fp8 (torchao float8, {RECIPE} scaling; auto: hidden size {hidden_size} >= "
                         f"{AUTO_MIN_HIDDEN} on a GPU of compute capability >= 8.9)")


def fp8_unsupported(device: torch.device, autocast_dtype: torch.dtype | None) -> str | None:
    """Why fp8 cannot run on ``device`` with this torch and torchao (None: it can)."""
    if device.type != "cuda":
        return f"fp8 matmuls need a CUDA GPU of compute capability >= 8.9, this run is on {device.type}"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        return (f"{torch.cuda.get_device_name(device)} has compute capability {capability[0]}.{capability[1]}, fp8 "
                "matmuls need >= 8.9 (Ada, Hopper)")
    if autocast_dtype != torch.bfloat16:
        return "fp8 base layers need bf16 training (train.bf16: true on a GPU with bf16)"
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no float8 matmul (torch >= 2.11 has it)"
    try:
        import torchao.float8  # noqa: F401
    except ImportError as e:
        return f"torchao cannot be imported ({e}): pip install 'packtrain[fp8]'"
    return None


def fp8_eligible(name: str, module: torch.nn.Module, head: torch.nn.Module | None) -> bool:
    """A base linear layer to convert: a plain ``nn.Linear`` below the output head, not an adapter's, with
    both sizes multiples of 16."""
    if type(module) is not torch.nn.Linear or module is head or "lora_" in name:
        return False
    out_features, in_features = module.weight.shape
    return out_features % 16 == 0 and in_features % 16 == 0


def convert_base_to_fp8(model: torch.nn.Module, emulate: bool = False) -> list[str]:
    """Swap the base's eligible linear layers (:func:`fp8_eligible`) for torchao ``Float8Linear`` in place;
    returns their names. ``model`` is the transformers causal LM before peft wraps it. ``emulate``: torchao's
    CPU emulation (tests)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    head = model.get_output_embeddings()
    converted: list[str] = []

    def take(module: torch.nn.Module, name: str) -> bool:
        if fp8_eligible(name, module, head):
            converted.append(name)
            return True
        return False

    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(RECIPE), emulate=emulate)
    convert_to_float8_training(model, module_filter_fn=take, config=config)
    if not converted:
        raise ConfigError("model.base_precision: fp8, but the model has no linear layer whose sizes are multiples of 16 "
                          "to convert; set model.base_precision: bf16")
    return converted
