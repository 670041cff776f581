"""Document-isolated attention: per-document flash attention on CUDA, the block-mask reference elsewhere.

A packed block holds several documents and a padding tail; no token may attend across a boundary.
Two ways, chosen once per run (:func:`choose_attention`) and logged:

- **varlen** (CUDA, sm80+, torch with ``torch.nn.attention.varlen``): the block's segments go to
  ``varlen_attn`` (FlashAttention-2 inside the torch wheel) as one ragged batch. Each segment is
  causal on its own, no mask exists, K/V are not repeated for GQA where the kernel takes
  ``enable_gqa``. The segment boundaries arrive as ``cu_seq_lens_q/k`` (int32, computed by the
  loader on the CPU from ``doc_lens``) and ``max_length_q/k`` (Python ints), passed to the model's
  forward as keyword arguments that transformers hands through to every attention call: no host
  sync. It is registered with transformers' ``AttentionInterface`` under :data:`VARLEN_NAME`, a
  name transformers' mask registry does not know, so ``create_causal_mask`` builds no mask at all.
- **sdpa** (the reference: CPU, older GPUs, ``model.use_sdpa: false`` gives eager): position ids
  that restart per document and no mask; transformers builds the dense ``[B, 1, T, T]``
  block-diagonal causal mask from them. Exact, slower on a GPU (no flash kernel with a mask).

Segments of one block, for ``doc_lens [3, 2]`` in a block of 6 (``.`` = padding)::

    tokens        a a a b b .
    position_ids  0 1 2 0 1 0
    segments      [3, 2, 1]           (the padding tail is a segment of its own)
    cu_seq_lens   0 3 5 6             (over a micro-batch: the blocks' segments one after another)
    max_length    6                   (the block length: a bound on every segment, constant for compile)

Both paths give the same attention: tests/test_attention.py checks the varlen wiring on CPU with a
pure-torch per-segment kernel standing in for ``varlen_attn`` (and the call contract: the causal
window as the tuple ``(-1, 0)``, int32 ``cu_seq_lens``, an int max length); tests/test_gpu.py checks
the real kernel against the reference on CUDA.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

log = logging.getLogger("packtrain.train")

VARLEN_NAME = "packtrain_varlen"
"""The name registered with transformers' AttentionInterface. It must not contain "flash":
transformers treats such names as its own flash-attention paths."""

CAUSAL_WINDOW = (-1, 0)
"""``varlen_attn`` has no ``is_causal`` (torch >= 2.10): causal is this window, and only as a tuple
(a list ``[-1, 0]`` would silently mean full, non-causal attention)."""


@dataclass(frozen=True)
class AttentionChoice:
    name: str          # "varlen", "sdpa" or "eager"
    implementation: str  # what transformers is given as attn_implementation
    note: str          # why, for the log

    @property
    def varlen(self) -> bool:
        return self.name == "varlen"


SCORE_TRANSFORMS = ("attn_logit_softcapping",)
"""Config fields by which a model changes its attention scores (Gemma 2's soft cap): the flash
kernel cannot apply them, so such models keep the reference path."""


def choose_attention(device: torch.device, use_sdpa: bool, block_size: int, model: torch.nn.Module,
                     varlen: bool = True, dtype: torch.dtype | None = torch.bfloat16) -> AttentionChoice:
    """The attention path for this run (``model``: the transformers causal LM), decided once and
    logged by the caller; for varlen the caller sets ``model.set_attn_implementation(choice.implementation)``."""
    config = model.config.get_text_config()  # a multimodal model's (Gemma 3 from 4B) window is its text config's
    sliding_window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    if not use_sdpa:
        return AttentionChoice("eager", "eager", "eager attention with a block mask (model.use_sdpa: false)")
    reference = "sdpa with a block-diagonal mask (exact, no flash kernel)"
    if not varlen:
        return AttentionChoice("sdpa", "sdpa", f"{reference}: model.varlen_attention is false")
    if device.type != "cuda":
        return AttentionChoice("sdpa", "sdpa", f"{reference}: {device.type} has no varlen flash kernel")
    kernel = varlen_kernel()
    if kernel is None:
        return AttentionChoice("sdpa", "sdpa", f"{reference}: torch {torch.__version__} has no "
                               "torch.nn.attention.varlen (torch >= 2.9 has it)")
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return AttentionChoice("sdpa", "sdpa", f"{reference}: varlen flash attention needs compute capability "
                               f">= 8.0, this GPU has {major}.{minor}")
    if dtype not in (torch.bfloat16, torch.float16):
        return AttentionChoice("sdpa", "sdpa", f"{reference}: flash attention needs bf16 or fp16, this run "
                               "computes in fp32 (train.bf16 and train.fp16 are off)")
    transforms = [f"{k}={getattr(config, k)}" for k in SCORE_TRANSFORMS if getattr(config, k, None) is not None]
    if transforms:
        return AttentionChoice("sdpa", "sdpa", f"{reference}: the model transforms its attention scores "
                               f"({', '.join(transforms)})")
    if not getattr(type(model), "_supports_attention_backend", False):
        return AttentionChoice("sdpa", "sdpa", f"{reference}: {type(model).__name__} does not take a custom "
                               "attention function")
    if any(getattr(module, "is_causal", True) is False for module in model.modules()):
        return AttentionChoice("sdpa", "sdpa", f"{reference}: {type(model).__name__} has attention layers that are "
                               "not causal (the varlen kernel is called causal)")
    if sliding_window is not None and sliding_window < block_size:
        return AttentionChoice("sdpa", "sdpa", f"{reference}: the model's sliding window ({sliding_window}) is "
                               f"shorter than the block ({block_size})")
    register(kernel)
    return AttentionChoice("varlen", VARLEN_NAME, "varlen flash attention per document "
                           "(torch.nn.attention.varlen, no mask)")


def varlen_kernel() -> Callable | None:
    """``torch.nn.attention.varlen.varlen_attn``, or None where this torch lacks it. Tests substitute a
    pure-torch kernel here."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@dataclass(frozen=True)
class KernelCall:
    """How the installed ``varlen_attn`` is called (its signature moved between torch releases)."""

    window: bool     # window_size=(-1, 0) (torch >= 2.10) rather than is_causal=True (2.9)
    gqa: bool        # enable_gqa=True (torch >= 2.12) rather than repeating K/V

    @classmethod
    def of(cls, kernel: Callable) -> "KernelCall":
        params = inspect.signature(kernel).parameters
        if "window_size" not in params and "is_causal" not in params:
            raise RuntimeError(f"varlen_attn{inspect.signature(kernel)} takes neither window_size nor is_causal: "
                               "this torch's varlen API is unknown to packtrain; set model.use_sdpa or upgrade")
        return cls(window="window_size" in params, gqa="enable_gqa" in params)


_active: tuple[Callable, KernelCall] | None = None
"""The kernel :func:`register` installed and how to call it (read once, not per layer call)."""


def varlen_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, scaling: float | None = None,
                             dropout: float = 0.0, cu_seq_lens_q: torch.Tensor | None = None,
                             cu_seq_lens_k: torch.Tensor | None = None, max_length_q: int | None = None,
                             max_length_k: int | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query [B, Hq, T, D]``, ``key``/``value``
    ``[B, Hkv, T, D]`` in, ``([B, T, Hq, D], None)`` out; every segment attends causally to itself only."""
    if cu_seq_lens_q is None or max_length_q is None:
        raise RuntimeError("varlen attention was called without cu_seq_lens_q / max_length_q: the batch did not "
                           "come through packtrain.trainer.data.data.collate (pass attention_inputs(batch) to the model)")
    if attention_mask is not None:
        raise RuntimeError("varlen attention got an attention mask; packed blocks must not build one")
    if dropout:
        raise RuntimeError(f"varlen attention: attention dropout {dropout} is not supported; set the model "
                           "config's attention_dropout to 0")
    unsupported = [k for k in ("softcap", "s_aux", "sinks") if kwargs.get(k) is not None]
    if unsupported:
        raise RuntimeError(f"varlen attention cannot apply {', '.join(unsupported)} (the model changes its "
                           "attention scores); set model.varlen_attention: false")
    if _active is None:
        raise RuntimeError("varlen attention is not registered: call packtrain.trainer.model.attention.register() first")
    kernel, call = _active
    batch, heads, length, dim = query.shape
    kv_heads, value_dim = key.shape[1], value.shape[-1]
    q = query.transpose(1, 2).reshape(batch * length, heads, dim)
    k = key.transpose(1, 2).reshape(batch * length, kv_heads, dim)
    v = value.transpose(1, 2).reshape(batch * length, kv_heads, value_dim)
    options: dict = {"scale": scaling}
    if call.window:
        options["window_size"] = CAUSAL_WINDOW
    else:
        options["is_causal"] = True
    if kv_heads != heads:
        if call.gqa:
            options["enable_gqa"] = True
        else:
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
    out = kernel(q, k, v, cu_seq_lens_q, cu_seq_lens_k if cu_seq_lens_k is not None else cu_seq_lens_q,
                 int(max_length_q), int(max_length_k if max_length_k is not None else max_length_q), **options)
    return out.view(batch, length, heads, value_dim), None


def register(kernel: Callable | None = None) -> None:
    """Make :data:`VARLEN_NAME` a transformers attention implementation running ``kernel`` (default:
    torch's ``varlen_attn``; tests pass a pure-torch stand-in). Idempotent."""
    from transformers import AttentionInterface

    global _active
    kernel = kernel or varlen_kernel()
    if kernel is None:
        raise RuntimeError(f"torch {torch.__version__} has no torch.nn.attention.varlen")
    _active = (kernel, KernelCall.of(kernel))
    AttentionInterface.register(VARLEN_NAME, varlen_attention_forward)


@contextlib.contextmanager
def reference_attention_for_generation(causal_lm: torch.nn.Module) -> Iterator[None]:
    """Within: ``causal_lm`` (the transformers model) attends with SDPA if it trains with varlen.

    varlen attention serves packed training blocks, whose segment boundaries come from the loader;
    ``model.generate`` has none (a left-padding mask and a KV cache instead), so generation switches
    to the reference and switches back after, also when it fails."""
    current = causal_lm.config._attn_implementation
    if current != VARLEN_NAME:
        yield
        return
    causal_lm.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        causal_lm.set_attn_implementation(current)


def attention_inputs(batch: dict, device: torch.device, choice: AttentionChoice | None) -> dict:
    """The keyword arguments the model's forward needs for ``choice``: the segment boundaries on the
    device (copied without blocking) for varlen, nothing for the mask-building reference."""
    if choice is None or not choice.varlen:
        return {}
    cu = batch["cu_seq_lens"].to(device, non_blocking=True)
    # its length (segments + 1) changes every batch: dynamic from the start, so torch.compile traces
    # one graph for all of them instead of recompiling (a no-op without compile)
    torch._dynamo.mark_dynamic(cu, 0)
    longest = int(batch["max_length"])
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}
