"""``train.torch_compile``: the whole model, or each decoder layer (regional), or nothing.

Compiling the whole model traces every layer one after the other into one graph: a 7B model's first
step spent minutes in the compiler (85-135 s on an H100, docs/BENCHMARKS.md). The decoder layers are
one class repeated: **regional** compilation (the PyTorch recipe "Reducing torch.compile cold start
compilation time with regional compilation"; accelerate's ``compile_regions``; torchtitan compiles
each ``TransformerBlock``) compiles each layer in place (``nn.Module.compile``). Every layer runs the
same code object (``Module._call_impl`` over the same ``forward``), and with Dynamo's default
``inline_inbuilt_nn_modules`` the layer's parameters are graph inputs, not constants: the graph traced
for layer 0 serves every layer (one compile instead of N), and the dynamic-shape recompile happens
once. What lies outside the layers (embeddings, rotary tables, final norm, the loss head) runs eager:
a few percent of a step.

In place, so nothing else changes: the module tree, the state dict's keys (no ``_orig_mod.``), peft,
DDP and FSDP see the same modules; a layer under gradient checkpointing runs its compiled call inside
the checkpoint. tests/test_compilation.py checks on CPU that the layers are compiled, that the loss
and gradients equal eager ones, and how many graphs Dynamo made (its counters), not how long it took.
"""

from __future__ import annotations

import logging

import torch

from packtrain.core.config import ConfigError

log = logging.getLogger("packtrain.train")


def choose_compile(setting: bool | str, device: torch.device) -> tuple[bool | str, str]:
    """``train.torch_compile`` resolved for ``device``: ``"regional"``, True (the whole model) or False, and
    the log's words. ``auto``: regional on CUDA, off elsewhere."""
    if setting == "auto":
        if device.type == "cuda":
            return "regional", "regional: each decoder layer (auto on cuda)"
        return False, f"off (auto on {device.type})"
    words = {"regional": "regional: each decoder layer", True: "the whole model", False: "off"}
    return setting, words[setting]


def repeated_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of ``model`` (through peft and DDP): transformers' ``GradientCheckpointingLayer``
    subclasses, the blocks its models repeat."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def compile_for_training(model: torch.nn.Module, mode: bool | str, backend: str = "inductor") -> torch.nn.Module:
    """What the loop runs forward through: ``torch.compile(model)`` for True, ``model`` itself with each
    decoder layer compiled in place for ``"regional"``, ``model`` for False. ``backend``: tests use
    ``aot_eager``."""
    if mode is False:
        return model
    if mode is True:
        return torch.compile(model, backend=backend)
    layers = repeated_layers(model)
    if not layers:
        raise ConfigError(f"train.torch_compile: regional, but {type(model).__name__} has no decoder layers "
                          "transformers marks as repeated (GradientCheckpointingLayer); set train.torch_compile: true "
                          "(the whole model) or false")
    for layer in layers:
        layer.compile(backend=backend)
    kinds = sorted({type(layer).__name__ for layer in layers})
    log.info("torch.compile: %d decoder layers (%s) compiled in place; one graph serves them all",
             len(layers), ", ".join(kinds))
    return model
