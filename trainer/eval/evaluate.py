"""Validation: token-weighted loss and perplexity over the build's val blocks."""

from __future__ import annotations

import math

import torch
from torch.utils.data import DataLoader

from packtrain.trainer.report.progress import Progress
from packtrain.trainer.step import LossPath, forward_loss


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: DataLoader, path: LossPath, progress: str | None = None) -> dict:
    """``{"eval/loss", "eval/ppl", "eval/tokens"}``: the mean loss over every supervised val token,
    computed by the training's micro-step (:func:`packtrain.trainer.step.forward_loss`; ``path.chunked``
    as ``train.chunked_loss``: the same number either way). ``progress``: what the console calls this
    evaluation while it runs (trainer/report/progress.py); None: nothing shown."""
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), device=path.device)
    tokens = 0
    shown = Progress(progress or "eval", len(loader), ("batch", "batches"), show=progress is not None)
    for batch in loader:  # the loader holds exactly the blocks to evaluate (train.max_eval_batches: train.py)
        loss_sum += forward_loss(model, batch, path)
        tokens += int(batch["n_sup"].sum())
        shown.update()
    shown.close()
    model.train(was_training)
    loss = loss_sum.item() / max(tokens, 1)
    return {"eval/loss": loss, "eval/ppl": math.exp(min(loss, 80.0)), "eval/tokens": tokens}


def per_set(parts: list[tuple[str | None, dict]]) -> dict:
    """One evaluation's record from the results of its parts: the whole val split (name None), or each
    eval source (``outputs.eval_sets``), whose ``eval/<name>/loss``, ``/ppl`` and ``/tokens`` are kept
    beside ``eval/loss`` over all of them (token-weighted)::

        >>> r = per_set([("dev", {"eval/loss": 1.0, "eval/ppl": 2.7, "eval/tokens": 30}),
        ...              ("test", {"eval/loss": 2.0, "eval/ppl": 7.4, "eval/tokens": 10})])
        >>> r["eval/loss"], r["eval/tokens"], r["eval/test/loss"]
        (1.25, 40, 2.0)
    """
    if len(parts) == 1 and parts[0][0] is None:
        return dict(parts[0][1])
    tokens = sum(part["eval/tokens"] for _, part in parts)
    loss = sum(part["eval/loss"] * part["eval/tokens"] for _, part in parts) / max(tokens, 1)
    out = {"eval/loss": loss, "eval/ppl": math.exp(min(loss, 80.0)), "eval/tokens": tokens}
    for name, part in parts:
        out.update({f"eval/{name}/{key[5:]}": value for key, value in part.items()})
    return out
