"""One micro-step, written once: a micro-batch of packed blocks in, its summed token loss out.

The training loop (trainer/loop.py), the evaluation (trainer/eval/evaluate.py) and the micro-batch
search (trainer/model/microbatch.py) all call :func:`forward_loss`: the batch goes to the device with the
attention path's inputs (packtrain.trainer.model.attention.attention_inputs), the model runs once under the
precision's autocast (trainer/model/model.py: :func:`packed_hidden_states`, or :func:`packed_forward` for
the full logits), and trainer/loss.py turns what it returned into the SUM of the supervised tokens'
losses. The forward lives here and in model.py; loss.py never calls the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from packtrain.trainer.model.attention import AttentionChoice
from packtrain.trainer.data.data import to_device
from packtrain.trainer.loss import check_hidden_states, chunked_supported, hidden_loss_sum, token_loss_sum
from packtrain.trainer.model.model import Precision, causal_lm, packed_forward, packed_hidden_states


@dataclass(frozen=True)
class LossPath:
    """How a micro-batch reaches its loss: where and in which precision the forward runs, the attention
    path (None: the mask-building reference), the fused loss kernel or None (trainer/loss.py), and
    ``train.chunked_loss``."""

    device: torch.device
    precision: Precision
    attention: AttentionChoice | None = None
    fused: Callable | None = None
    chunked: bool = True


def forward_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], path: LossPath) -> torch.Tensor:
    """The summed token loss of one collated ``batch`` (a 0-d fp32 tensor on ``path.device``):
    to the device, then forward + loss under autocast."""
    input_ids, position_ids, labels, sup_index, attention_kwargs = to_device(batch, path.device, path.attention)
    with path.precision.autocast(path.device):
        return packed_loss_sum(model, input_ids, position_ids, labels, chunked=path.chunked, fused=path.fused,
                               attention=attention_kwargs, sup_index=sup_index)


def packed_loss_sum(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor,
                    labels: torch.Tensor, chunked: bool = True, fused: Callable | None = None,
                    attention: dict | None = None, sup_index: torch.Tensor | None = None) -> torch.Tensor:
    """The summed token loss of a micro-batch of packed blocks already on the device (run it under the
    precision's autocast). ``chunked`` picks the path (trainer/loss.py's docstring): the final hidden
    states when the head allows it and they check out on first use, else the full logits; ``fused``
    (:func:`packtrain.trainer.loss.fused_kernel`) replaces the chunks where the head allows it;
    ``attention`` are the model's attention keyword arguments; ``sup_index`` the supervised positions the loader
    found (trainer/data/data.py's ``collate``; None: found here, a host sync on a GPU)."""
    attention = attention or {}
    if chunked and chunked_supported(model):
        hidden, last_logits = packed_hidden_states(model, input_ids, position_ids, **attention)
        head = causal_lm(model).get_output_embeddings()
        if check_hidden_states(model, head, hidden, last_logits):
            return hidden_loss_sum(head, hidden, labels, fused, sup_index)
    return token_loss_sum(packed_forward(model, input_ids, position_ids, **attention), labels)
