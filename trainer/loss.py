"""The loss of one micro-batch as a SUM over its supervised tokens.

The loop divides by the number of supervised tokens in the whole accumulation window, so every
token weighs the same whatever micro-batch it falls in: ``bs=1 x ga=8`` and ``bs=8 x ga=1`` give
the same loss and gradients (a mean of per-micro-batch means would not).

``labels`` are unshifted (HF convention): ``labels[i]`` is the target predicted from position
``i - 1``; the shift happens here, on the labels (cheaper than slicing the logits).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.data import IGNORE_INDEX


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of the cross-entropy of every supervised target (fp32), a 0-d tensor."""
    targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")
