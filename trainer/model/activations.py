"""Activation memory: which decoder layers recompute their activations in the backward, and where the
inputs they keep wait (``train.gradient_checkpointing``).

A :class:`Checkpointing` is one point on the memory/compute ladder, least recompute first:

======================  ==============================================================================
``false``               every layer keeps its activations: no recompute, the most memory
``k`` (an integer)      layers 0, k, 2k, ... recompute (``ceil(L / k)`` of L), the others keep theirs
``true`` (``1``)        every layer recomputes: it keeps only its input (a LoRA step ~1.5x the FLOPs)
``offload``             every layer recomputes, and its input waits in pinned CPU memory (copies each step)
======================  ==============================================================================

They are applied through transformers' own switch (``activation_checkpointing_enable(every_n_layers=,
offload=)``, non-reentrant ``torch.utils.checkpoint``; ``offload`` wraps each checkpoint in
``torch.autograd.graph.save_on_cpu(pin_memory=True)``, so only the layer inputs the recompute starts from
leave the GPU). ``auto`` is decided elsewhere: with the micro-batch by measurement
(trainer/model/microbatch.py), from a memory estimate (trainer/model/memory.py), or off on a CPU.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass

import torch

from packtrain.core.errors import PacktrainError

log = logging.getLogger("packtrain.train")


class CheckpointingError(PacktrainError):
    """The model or the installed transformers cannot checkpoint as asked; the message says what to set."""


@dataclass(frozen=True, order=True)
class Checkpointing:
    """``every``: 0 none, 1 every decoder layer, k every k-th; ``offload``: inputs in pinned CPU memory."""

    every: int
    offload: bool = False

    @property
    def value(self) -> bool | int | str:
        """The ``train.gradient_checkpointing`` value that asks for it (what run.json records).

        >>> [c.value for c in (OFF, Checkpointing(2), FULL, OFFLOAD)]
        [False, 2, True, 'offload']
        """
        if self.offload:
            return "offload"
        return self.every if self.every > 1 else self.every == 1

    @property
    def label(self) -> str:
        """How the log names it.

        >>> [c.label for c in (OFF, Checkpointing(2), Checkpointing(4), Checkpointing(12), FULL, OFFLOAD)]
        ['off', 'every 2nd layer', 'every 4th layer', 'every 12th layer', 'every layer', 'every layer, offloaded']
        """
        if self.every == 0:
            return "off"
        if self.every == 1:
            return "every layer" + (", offloaded" if self.offload else "")
        k = self.every
        return f"every {k}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10 if k % 100 not in (11, 12, 13) else 0, 'th')} layer"

    @property
    def recompute(self) -> float:
        """The share of decoder layers that recompute (of many layers).

        >>> OFF.recompute, Checkpointing(4).recompute, FULL.recompute
        (0.0, 0.25, 1.0)
        """
        return 1 / self.every if self.every else 0.0

    def checkpointed(self, layers: int) -> int:
        """How many of ``layers`` decoder layers recompute.

        >>> OFF.checkpointed(28), Checkpointing(4).checkpointed(28), Checkpointing(3).checkpointed(28), FULL.checkpointed(28)
        (0, 7, 10, 28)
        """
        return 0 if self.every == 0 else -(-layers // self.every)


OFF = Checkpointing(0)
FULL = Checkpointing(1)
OFFLOAD = Checkpointing(1, offload=True)
LADDER = (OFF, Checkpointing(4), Checkpointing(2), FULL, OFFLOAD)
"""What ``auto`` tries, least recompute first; ``offload`` (the last) only when nothing else fits."""


def from_config(value: bool | int | str) -> Checkpointing | None:
    """The plan ``train.gradient_checkpointing`` asks for; None for ``auto`` (decided later).

    >>> from_config(False), from_config(True), from_config(1), from_config(3), from_config("offload")
    (Checkpointing(every=0, offload=False), Checkpointing(every=1, offload=False), Checkpointing(every=1, offload=False), Checkpointing(every=3, offload=False), Checkpointing(every=1, offload=True))
    >>> from_config("auto") is None
    True
    """
    if value == "auto":
        return None
    if value == "offload":
        return OFFLOAD
    if isinstance(value, bool):
        return FULL if value else OFF
    return Checkpointing(int(value))


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated decoder layers of ``model`` (transformers' ``GradientCheckpointingLayer``), in order."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def checkpointed_layers(model: torch.nn.Module) -> list[int]:
    """The indices of the decoder layers of ``model`` that recompute in training."""
    return [i for i, layer in enumerate(decoder_layers(model)) if layer.gradient_checkpointing]


def offload_possible(model: torch.nn.Module) -> bool:
    """Whether ``model`` lives on an accelerator, whose saved activations pinned CPU memory can take."""
    return next(model.parameters()).device.type != "cpu"


def apply(model: torch.nn.Module, plan: Checkpointing) -> list[int]:
    """Switch ``plan`` on the causal LM inside ``model`` (a PeftModel, compiled or wrapped: whatever
    ``causal_lm`` unwraps); returns the indices of the decoder layers that now recompute."""
    from packtrain.trainer.model.model import causal_lm

    lm = causal_lm(model)
    if plan.every == 0:
        if any(layer.gradient_checkpointing for layer in decoder_layers(lm)):
            (getattr(lm, "activation_checkpointing_disable", None) or lm.gradient_checkpointing_disable)()
        return []
    if not getattr(lm, "supports_gradient_checkpointing", False):
        raise CheckpointingError(f"{type(lm).__name__} does not support activation checkpointing: set "
                                 "train.gradient_checkpointing: false")
    if plan.offload and not offload_possible(lm):
        log.info("activation checkpointing offload on cpu: the activations live in host memory already; every "
                 "layer recomputes, nothing is copied")
        plan = FULL
    enable = getattr(lm, "activation_checkpointing_enable", None)  # transformers' name since 5.x
    kwargs = {"use_reentrant": False}
    if plan == FULL and enable is None:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    elif plan == FULL:
        enable(activation_checkpointing_kwargs=kwargs)
    elif enable is None or "every_n_layers" not in inspect.signature(enable).parameters:
        import transformers

        raise CheckpointingError(f"train.gradient_checkpointing: {plan.value} needs a transformers with selective and "
                                 f"offloaded checkpointing (activation_checkpointing_enable(every_n_layers=, offload=)), "
                                 f"this is {transformers.__version__}: upgrade it (pip install -U transformers), or "
                                 "set true or false")
    else:
        enable(activation_checkpointing_kwargs=kwargs, every_n_layers=plan.every, offload=plan.offload)
    return checkpointed_layers(lm)
