"""The loss of one micro-batch as a SUM over its supervised tokens, from what the model returned
(its final hidden states, or its logits): this module never calls the model; the forward is
trainer/step.py's :func:`packtrain.trainer.step.forward_loss` (one micro-step for the loop, the
evaluation and the micro-batch search) over trainer/model/model.py's packed forwards.

The loop divides by the number of supervised tokens in the whole accumulation window, so every
token weighs the same whatever micro-batch it falls in: ``bs=1 x ga=8`` and ``bs=8 x ga=1`` give
the same loss and gradients (a mean of per-micro-batch means would not).

``labels`` are unshifted (HF convention): ``labels[i]`` is the target predicted from position
``i - 1``; the shift happens here, on the labels (cheaper than slicing the logits).

Two ways to the same number (``train.chunked_loss``, default true):

- **chunked** (:func:`chunked_loss_sum`): the model returned its final hidden states, those of the
  supervised positions only are gathered (``[N, H]``, N = supervised targets), and the output head
  + cross-entropy run over them ``CHUNK_TOKENS`` rows at a time, each chunk under
  ``torch.utils.checkpoint``: the forward keeps only the chunk's loss, the backward recomputes the
  chunk's logits. The ``[B, T, V]`` logits (fp32: 2 x 2048 x 151,936 x 4 bytes = 2.5 GB per
  pair of blocks, twice that with their gradient) never exist; at most one chunk's logits do
  (4096 x V: 2.5 GB in fp32 for Qwen2.5's vocabulary), and the head's matmul skips the prompt and
  padding positions.
- **fused** (CUDA, ``train.fused_loss``): the same gathered hidden states go to cut-cross-entropy's
  ``linear_cross_entropy`` (a Triton kernel: head matmul, log-softmax and gradient in one pass, no
  logits kept, no weight gradient for the frozen head). Used for a plain bias-free ``nn.Linear``
  head in bf16/fp16; anything else takes the chunked path. tests/test_gpu.py compares it with the
  chunked loss, which stays the CPU path and the reference.
- **reference** (:func:`token_loss_sum` over :func:`packtrain.trainer.model.model.packed_forward`'s logits): the
  full logits; used when ``chunked_loss`` is false and for architectures whose head does more than
  a linear layer (logit soft-capping or scaling: Gemma 2, Cohere, Granite...), said once in the
  log. tests/test_trainer_loss.py checks both give the same loss and gradients.
"""

from __future__ import annotations

import logging
import weakref
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from packtrain.core.config import ConfigError
from packtrain.trainer.data.data import IGNORE_INDEX
from packtrain.trainer.model.model import causal_lm

log = logging.getLogger("packtrain.train")

CHUNK_TOKENS = 4096
"""Supervised positions per head + cross-entropy chunk."""

# model types whose *ForCausalLM.forward computes ``logits = self.lm_head(hidden_states)`` and
# nothing more (checked in transformers 5.23's modeling files)
PLAIN_HEAD_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral")
# config fields by which other heads post-process their logits
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_softcapping", "logit_scale", "logits_scaling")

_checked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # causal LM -> chunked path usable
_said: set[str] = set()


def shifted_targets(labels: torch.Tensor) -> torch.Tensor:
    """``targets[:, i] = labels[:, i + 1]``: the token predicted from position ``i`` (-100 at the end)."""
    return F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of the cross-entropy of every supervised target (fp32), a 0-d tensor: the reference path."""
    targets = shifted_targets(labels)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")


def hidden_loss_sum(head: torch.nn.Module, hidden: torch.Tensor, labels: torch.Tensor,
                    fused: Callable | None = None, sup_index: torch.Tensor | None = None) -> torch.Tensor:
    """The summed token loss from the final hidden states ``[B, T, H]``: through ``fused``
    (:func:`fused_kernel`) where the head allows it, else :func:`chunked_loss_sum`. ``sup_index``: the
    supervised positions, found by the loader (:func:`_supervised_rows`)."""
    if fused is not None and _fusable(head, hidden):
        return fused_loss_sum(fused, head, hidden, labels, sup_index)
    return chunked_loss_sum(head, hidden, labels, sup_index=sup_index)


def fused_kernel(setting: bool | str, device: torch.device) -> Callable | None:
    """cut-cross-entropy's ``linear_cross_entropy`` when ``train.fused_loss`` asks for it on CUDA,
    else None (the chunked loss). ``auto``: on CUDA when the package is installed, said either way;
    ``true`` where it cannot run is an error that says how to fix it."""
    if setting is False:
        return None
    if device.type != "cuda":
        if setting is True:
            raise ConfigError(f"train.fused_loss: true needs CUDA (this run is on {device.type}); "
                               "set it to auto or false")
        return None
    try:
        from cut_cross_entropy import linear_cross_entropy
    except ImportError as e:
        if setting is True:
            raise ConfigError(f"train.fused_loss: true, but cut-cross-entropy cannot be imported ({e}): "
                               "pip install 'packtrain[cuda]', or set train.fused_loss: auto") from None
        _say_once("fused-missing", f"fused_loss: cut-cross-entropy is not installed ({e}); using the chunked "
                  "loss (same result, slower): pip install 'packtrain[cuda]'")
        return None
    log.info("loss: fused linear cross-entropy (cut-cross-entropy) on the supervised positions")
    return linear_cross_entropy


def fused_loss_sum(kernel: Callable, head: torch.nn.Module, hidden: torch.Tensor, labels: torch.Tensor,
                   sup_index: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`chunked_loss_sum` through the fused kernel: same gathered rows, same sum."""
    states, targets = _supervised_rows(hidden, labels, sup_index)
    if len(targets) == 0:
        return states.sum() * 0.0  # connected to the graph: zero gradients, as the other paths
    return kernel(states, head.weight, targets, reduction="sum").float()


def _fusable(head: torch.nn.Module, hidden: torch.Tensor) -> bool:
    plain = type(head) is torch.nn.Linear and head.bias is None
    if plain and hidden.dtype in (torch.bfloat16, torch.float16) and head.weight.dtype == hidden.dtype:
        return True
    _say_once(f"unfusable-{type(head).__name__}-{hidden.dtype}",
              f"fused_loss: the output head ({type(head).__name__}, weight {head.weight.dtype if hasattr(head, 'weight') else '?'}, "
              f"hidden states {hidden.dtype}) is not a plain bf16/fp16 linear layer; using the chunked loss")
    return False


def _supervised_rows(hidden: torch.Tensor, labels: torch.Tensor,
                     index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The hidden states ``[N, H]`` of the N positions that predict a supervised target, and the targets.

    ``index``: those positions over the flattened ``[B, T]``, as the loader found them on the CPU
    (trainer/data/data.py's ``collate``: ``sup_index``), so N is known without asking the GPU; None: found here
    with ``nonzero``, whose output size makes the host wait for the GPU (a sync)."""
    targets = shifted_targets(labels).flatten()
    if index is None:
        index = (targets != IGNORE_INDEX).nonzero().squeeze(1)
    return hidden.flatten(0, 1).index_select(0, index), targets.index_select(0, index)


def chunked_loss_sum(head: torch.nn.Module, hidden: torch.Tensor, labels: torch.Tensor,
                     chunk_tokens: int | None = None, sup_index: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`token_loss_sum` of ``head(hidden)`` without the full logits.

    ``head`` is called as a module, so a tied embedding, a bias or a LoRA-adapted head all work.
    ``chunk_tokens`` defaults to :data:`CHUNK_TOKENS`. A micro-batch without supervised tokens gives
    a 0 connected to the graph (zero gradients, as the reference path gives). ``sup_index``: the supervised
    positions the loader found (:func:`_supervised_rows`); without it, counting them on CUDA is a host sync.
    """
    states, targets = _supervised_rows(hidden, labels, sup_index)
    chunk_tokens = chunk_tokens or CHUNK_TOKENS
    total = None
    for start in range(0, max(len(targets), 1), chunk_tokens):
        h, t = states[start:start + chunk_tokens], targets[start:start + chunk_tokens]
        if torch.is_grad_enabled():
            part = checkpoint(_head_loss_sum, head, h, t, use_reentrant=False)
        else:
            part = _head_loss_sum(head, h, t)
        total = part if total is None else total + part
    return total


def _head_loss_sum(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """One chunk: logits (the compute dtype), upcast to fp32 for the log-softmax, summed loss."""
    return F.cross_entropy(head(hidden).float(), targets, reduction="sum")


def chunked_supported(model: torch.nn.Module) -> bool:
    """Does ``model``'s head only apply a linear layer (so the chunked and fused paths give its loss)?
    Said once in the log when not."""
    lm = causal_lm(model)
    config = getattr(lm, "config", None)
    model_type = getattr(config, "model_type", type(lm).__name__)
    transforms = [f"{k}={getattr(config, k)}" for k in LOGIT_TRANSFORMS if getattr(config, k, None) not in (None, 1, 1.0)]
    if model_type in PLAIN_HEAD_MODEL_TYPES and not transforms and lm.get_output_embeddings() is not None:
        return True
    _say_once(model_type, f"chunked_loss: not supported for model type {model_type!r}"
              + (f" (its head transforms the logits: {', '.join(transforms)})" if transforms else
                 f" (supported: {', '.join(PLAIN_HEAD_MODEL_TYPES)})")
              + "; using the full-logits loss (more memory, same result)")
    return False


def check_hidden_states(model: torch.nn.Module, head: torch.nn.Module, hidden: torch.Tensor,
                        last_logits: torch.Tensor) -> bool:
    """Once per model: is ``hidden`` really the head's input? (head(last position) == the model's
    own logits there). One host sync, on the first micro-batch only."""
    lm = causal_lm(model)
    if lm not in _checked:
        with torch.no_grad():
            ours = head(hidden[:, -1:].detach()).float()
            theirs = last_logits.detach().float()
            scale = theirs.abs().max().clamp_min(1e-6)
            # a wrong tensor differs by O(scale); bf16 rounding and a compiled head by ~1e-2 of it
            _checked[lm] = bool(((ours - theirs).abs().max() <= 3e-2 * scale).item())
        if not _checked[lm]:
            _say_once(f"check-{id(lm)}", "chunked_loss: the model's last hidden states are not its head's input "
                      "(transformers changed output_hidden_states?); using the full-logits loss")
    return _checked[lm]


def _say_once(key: str, message: str) -> None:
    if key not in _said:
        _said.add(key)
        log.warning(message)
