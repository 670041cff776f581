"""Device memory: the run's budget (``train.max_memory_gib``), an estimate of a step's peak, the
checkpointing that estimate chooses, and the one line a run that runs out of memory ends with.

**Budget.** On CUDA the run may use the whole GPU, or ``train.max_memory_gib`` of it: the process is
capped there with ``torch.cuda.set_per_process_memory_fraction`` (the allocator raises
``torch.OutOfMemoryError`` beyond it, as a card of that size would), so a 24 GB RTX 4090's fit can be
checked on an 80 GB H100. More than the GPU has is refused; on a CPU it is ignored, said in the log.
Every ``auto`` choice keeps ``1 - HEADROOM`` of the budget.

**Estimate** (:class:`MemoryModel`), for ``gradient_checkpointing: auto`` with a fixed micro-batch,
where nothing is measured: what is allocated once the model is loaded, the adapters' gradients and
AdamW states, and per token, what each decoder layer saves for the backward (eager, bf16:
:func:`layer_bytes_per_token`, checked against a meta-device count of the tensors autograd saves in
tests/test_activation_memory.py), or only its input where it recomputes, plus the loss head's chunk
of logits. For Qwen2.5-7B that is 211 KB per token per layer kept, 7 KB recomputed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from packtrain.core.errors import PacktrainError
from packtrain.trainer.model.activations import LADDER, OFFLOAD, Checkpointing
from packtrain.trainer.loss import CHUNK_TOKENS as LOSS_CHUNK_ROWS  # the rows of logits the chunked loss holds at once

log = logging.getLogger("packtrain.train")

GIB = 2**30
HEADROOM = 0.15
"""Share of the budget left free by every ``auto`` choice (allocator fragmentation, evaluation, the
optimizer's first step, what an estimate misses)."""


class MemoryBudgetError(PacktrainError):
    """``train.max_memory_gib`` cannot be honoured; the message says what to set."""


@dataclass(frozen=True)
class Budget:
    """The device memory a run may use (bytes), of the GPU's ``card`` bytes; ``capped``: by ``train.max_memory_gib``."""

    limit: int
    card: int
    capped: bool

    @property
    def usable(self) -> float:
        """What an ``auto`` choice may fill: the budget less the headroom."""
        return (1 - HEADROOM) * self.limit

    @property
    def note(self) -> str:
        """
        >>> Budget(24 * GIB, 80 * GIB, True).note
        "budget 24.0 GiB (train.max_memory_gib, of the GPU's 80.0)"
        >>> Budget(80 * GIB, 80 * GIB, False).note
        "budget 80.0 GiB (the whole GPU's)"
        """
        if self.capped:
            return f"budget {self.limit / GIB:.1f} GiB (train.max_memory_gib, of the GPU's {self.card / GIB:.1f})"
        return f"budget {self.limit / GIB:.1f} GiB (the whole GPU's)"


def budget_fraction(max_memory_gib: float, card_bytes: int, card_name: str = "this GPU") -> float:
    """The share of the card that ``max_memory_gib`` is, for ``set_per_process_memory_fraction``.

    >>> budget_fraction(24, 80 * GIB)
    0.3
    >>> budget_fraction(100, 80 * GIB, "NVIDIA H100 80GB HBM3")
    Traceback (most recent call last):
    ...
    packtrain.trainer.model.memory.MemoryBudgetError: train.max_memory_gib: 100 GiB is more than NVIDIA H100 80GB HBM3 has (80.0 GiB): lower it, or unset it to use the whole GPU
    """
    fraction = max_memory_gib * GIB / card_bytes
    if fraction > 1:
        raise MemoryBudgetError(f"train.max_memory_gib: {max_memory_gib:g} GiB is more than {card_name} has "
                                f"({card_bytes / GIB:.1f} GiB): lower it, or unset it to use the whole GPU")
    return fraction


def apply_budget(max_memory_gib: float | None, device: torch.device) -> Budget | None:
    """Cap this process's CUDA memory at ``max_memory_gib`` (None: the whole GPU); returns the budget, or
    None on a CPU (where the setting is ignored, with a warning: host memory is not capped)."""
    if device.type != "cuda":
        if max_memory_gib is not None:
            log.warning("train.max_memory_gib: %g GiB is a GPU memory budget; on %s it is ignored (host memory is "
                        "not capped)", max_memory_gib, device.type)
        return None
    props = torch.cuda.get_device_properties(device)
    if max_memory_gib is None:
        return Budget(props.total_memory, props.total_memory, False)
    fraction = budget_fraction(max_memory_gib, props.total_memory, props.name)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    budget = Budget(int(fraction * props.total_memory), props.total_memory, True)
    log.info("memory: %s; this process is capped there (torch.cuda.set_per_process_memory_fraction %.3f)",
             budget.note, fraction)
    return budget


def layer_bytes_per_token(hidden: int, intermediate: int, q_dim: int, kv_dim: int, heads: int, lora_rows: int,
                          act_bytes: int = 2) -> int:
    """Bytes one decoder layer (attention + gated MLP, RMSNorms, LoRA on its linear layers) keeps per token
    for the backward, eager, activations of ``act_bytes``; ``lora_rows``: rank x adapted linear layers.

    Each RMSNorm keeps its fp32 input and inverse RMS; the LoRA A matrices their inputs (the normed
    attention and MLP inputs; o_proj's is the attention output) and the B matrices theirs (rank each);
    attention (flash or varlen) q, k, v, its output and an fp32 log-sum-exp per head; the MLP gate, up,
    act(gate) and their product.

    >>> layer_bytes_per_token(3584, 18944, 3584, 512, 28, 16 * 7)  # Qwen2.5-7B, r16 all-linear
    211288
    """
    b = act_bytes
    norms = 2 * (4 * hidden + 4)
    lora_inputs = b * 2 * hidden
    attention = b * (2 * q_dim + 2 * kv_dim) + 4 * heads
    mlp = b * 4 * intermediate
    return norms + lora_inputs + attention + mlp + b * lora_rows


@dataclass(frozen=True)
class MemoryModel:
    """A step's peak device memory, in bytes, as a function of the tokens of a micro-batch and the checkpointing."""

    fixed: int          # weights and adapters as loaded, the adapters' gradients and AdamW states
    layers: int
    layer_bytes: int    # per token, kept by a decoder layer that does not recompute
    input_bytes: int    # per token, kept by one that recomputes (its input)
    other_bytes: int    # per token, outside the decoder layers (final norm, hidden states for the loss)
    loss_row_bytes: int  # per supervised row of the chunked loss's logits (0: fused loss, none kept)

    def peak(self, tokens: int, plan: Checkpointing) -> int:
        n = plan.checkpointed(self.layers)
        kept = (self.layers - n) * self.layer_bytes + (0 if plan.offload else n * self.input_bytes)
        rebuilt = self.layer_bytes if n else 0  # the backward rebuilds one recomputed layer at a time
        return self.fixed + tokens * (kept + rebuilt + self.other_bytes) + min(tokens, LOSS_CHUNK_ROWS) * self.loss_row_bytes


def model_for(model: torch.nn.Module, fixed: int, rank: int, act_bytes: int, fused_loss: bool) -> MemoryModel | None:
    """The :class:`MemoryModel` of a loaded PeftModel ``model``; None when its config lacks the sizes the
    estimate needs (not a decoder of attention + gated MLP)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    from packtrain.trainer.model.activations import decoder_layers
    from packtrain.trainer.model.model import causal_lm

    lm = causal_lm(model)
    cfg = lm.config
    layers = decoder_layers(model)
    sizes = [getattr(cfg, name, None) for name in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                   "num_hidden_layers")]
    if None in sizes or not layers or not isinstance(sizes[1], int):
        return None
    hidden, intermediate, heads, n_layers = sizes
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    adapted = sum(isinstance(m, BaseTunerLayer) for m in layers[0].modules())
    per_layer = layer_bytes_per_token(hidden, intermediate, heads * head_dim, kv_heads * head_dim, heads,
                                      rank * adapted, act_bytes)
    return MemoryModel(fixed, n_layers, per_layer, act_bytes * hidden, 4 * hidden + 2 * act_bytes * hidden,
                       0 if fused_loss else 12 * lm.get_output_embeddings().weight.shape[0])  # fp32 logits, their log-softmax and gradient


def choose_by_estimate(memory: MemoryModel, tokens: int, usable: float) -> tuple[Checkpointing, list[str]]:
    """The least recompute of :data:`LADDER` whose estimated peak fits in ``usable`` bytes (none fits:
    ``offload``, the last resort); and a line per plan weighed, for the log.

    >>> m = MemoryModel(fixed=16 * GIB, layers=28, layer_bytes=211288, input_bytes=7168, other_bytes=35840, loss_row_bytes=0)
    >>> choose_by_estimate(m, 4096, 68 * GIB)[0].label, choose_by_estimate(m, 12288, 68 * GIB)[0].label
    ('off', 'every 2nd layer')
    """
    lines = []
    for plan in LADDER:
        peak = memory.peak(tokens, plan)
        fits = peak <= usable
        lines.append(f"{plan.label}: {peak / GIB:.1f} GiB{'' if fits else ' (over)'}")
        if fits:
            return plan, lines
    return OFFLOAD, lines


def out_of_memory_message(budget: Budget | None, micro: int | str, seq_length: int, plan_label: str,
                          lower: str) -> str:
    """The one line a run that ran out of device memory ends with: the budget, the micro-batch, the
    checkpointing and what to lower (``lower``: the knobs, trainer/report/metrics.py:oom_advice).

    >>> out_of_memory_message(Budget(24 * GIB, 80 * GIB, True), 4, 2048, "off", "reduce memory with: X")
    "out of memory within the budget 24.0 GiB (train.max_memory_gib, of the GPU's 80.0) at 4 sequence(s) of 2048 tokens per forward, activation checkpointing off; reduce memory with: X; or raise train.max_memory_gib (at most the GPU's 80.0 GiB)"
    """
    where = f"within the {budget.note}" if budget is not None else "of the device"
    line = (f"out of memory {where} at {micro} sequence(s) of {seq_length} tokens per forward, activation "
            f"checkpointing {plan_label}; {lower}")
    if budget is not None and budget.capped:
        line += f"; or raise train.max_memory_gib (at most the GPU's {budget.card / GIB:.1f} GiB)"
    return line
