"""Validation: token-weighted loss and perplexity over the build's val blocks."""

from __future__ import annotations

import math

import torch
from torch.utils.data import DataLoader

from packtrain.trainer.attention import AttentionChoice
from packtrain.trainer.data import to_device
from packtrain.trainer.loss import packed_loss_sum
from packtrain.trainer.model import Precision
from packtrain.trainer.progress import Progress


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: DataLoader, precision: Precision, device: torch.device,
             chunked: bool = True, fused=None,
             attention: AttentionChoice | None = None, progress: str | None = None) -> dict:
    """``{"eval/loss", "eval/ppl", "eval/tokens"}``: the mean loss over every supervised val token,
    computed by the training loss (:func:`packtrain.trainer.loss.packed_loss_sum`; ``chunked`` as
    ``train.chunked_loss``: the same number either way). ``progress``: what the console calls this
    evaluation while it runs (trainer/progress.py); None: nothing shown."""
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), device=device)
    tokens = 0
    shown = Progress(progress or "eval", len(loader), ("batch", "batches"), show=progress is not None)
    for batch in loader:  # the loader holds exactly the blocks to evaluate (train.max_eval_batches: train.py)
        input_ids, position_ids, labels, attention_kwargs = to_device(batch, device, attention)
        with precision.autocast(device):
            loss_sum += packed_loss_sum(model, input_ids, position_ids, labels, chunked=chunked, fused=fused,
                                        attention=attention_kwargs)
        tokens += int(batch["n_sup"].sum())
        shown.update()
    shown.close()
    model.train(was_training)
    loss = loss_sum.item() / max(tokens, 1)
    return {"eval/loss": loss, "eval/ppl": math.exp(min(loss, 80.0)), "eval/tokens": tokens}
