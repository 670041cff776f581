"""Learning-rate schedule: linear warmup, then cosine / linear decay to 0, or constant.

Warmup lasts ``warmup_steps`` optimizer steps when that is > 0, else ``ceil(warmup_ratio * total)``.
The multiplier at step ``s`` (0-based, applied to the update of step s + 1)::

    s < W:        (s + 1) / W         (never 0: the first update is not wasted)
    cosine:       0.5 * (1 + cos(pi * p)),  p = (s - W) / max(1, total - W)
    linear:       1 - p
    constant:     1
"""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

from packtrain.core.config_train import TrainConfig
from packtrain.trainer.data.epochs import steps_per_epoch


def warmup_steps(train: TrainConfig, total_steps: int) -> int:
    if train.warmup_steps > 0:
        return min(train.warmup_steps, total_steps)
    return math.ceil(train.warmup_ratio * total_steps)


def lr_multiplier(step: int, warmup: int, total: int, kind: str) -> float:
    if step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if kind == "linear":
        return 1.0 - progress
    if kind == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_scheduler_type {kind!r}: use cosine, linear or constant")


def build_scheduler(optimizer: torch.optim.Optimizer, train: TrainConfig, total_steps: int) -> LambdaLR:
    warmup = warmup_steps(train, total_steps)
    kind = train.lr_scheduler_type
    return LambdaLR(optimizer, lambda step: lr_multiplier(step, warmup, total_steps, kind))


def rates_at_restored_step(scheduler: LambdaLR) -> None:
    """After ``scheduler.load_state_dict``: give the optimizer this run's rates at the restored step. The
    optimizer's saved state holds the rate the checkpoint's own schedule gave next, so a resume that
    changed the schedule (more ``max_steps``, another ``lr_scheduler_type`` or warmup) trained its
    first step with the old schedule's rate (the end of a cosine: 0). The same schedule gives the same
    number, bit for bit (LambdaLR's own formula)."""
    rates = [base * rate(scheduler.last_epoch) for rate, base in zip(scheduler.lr_lambdas, scheduler.base_lrs)]
    for group, lr in zip(scheduler.optimizer.param_groups, rates):
        group["lr"] = lr
    scheduler._last_lr = rates


def total_training_steps(train, batches_per_epoch: int) -> int:
    """``max_steps`` when set (as in HF TrainingArguments), else ``num_train_epochs`` epochs of
    ``ceil(batches_per_epoch / gradient_accumulation_steps)`` steps (``batches_per_epoch``: micro-batches per
    rank; an epoch's last step takes the leftovers: trainer/data/epochs.py), HF Trainer's count.

    >>> from types import SimpleNamespace as Train
    >>> total_training_steps(Train(max_steps=None, num_train_epochs=3, gradient_accumulation_steps=4), 6)
    6
    """
    if train.max_steps is not None:
        return train.max_steps
    return train.num_train_epochs * steps_per_epoch(batches_per_epoch, train.gradient_accumulation_steps)
