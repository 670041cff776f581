"""The optimizer over the trainable (LoRA) parameters, named as in ``TrainingArguments.optim``.

- ``adamw_torch_fused``: ``torch.optim.AdamW(fused=True)`` on CUDA; on other devices plain AdamW
  (the fused kernel is CUDA-only here), said once in the log.
- ``adamw_torch``: ``torch.optim.AdamW`` (foreach implementation).
- ``adamw_bnb_8bit``: ``bitsandbytes.optim.AdamW8bit`` (8-bit optimizer states).
"""

from __future__ import annotations

import logging

import torch

from packtrain.core.config_train import TrainConfig

log = logging.getLogger("packtrain.train")


def build_optimizer(params: list[torch.nn.Parameter], train: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    if not params:
        raise ValueError("no trainable parameters: lora.target_modules matched no module of the model")
    kwargs = dict(lr=train.learning_rate, betas=(train.adam_beta1, train.adam_beta2),
                  eps=train.adam_epsilon, weight_decay=train.weight_decay)
    if train.optim == "adamw_bnb_8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, **kwargs)
    if train.optim == "adamw_torch_fused":
        if device.type == "cuda":
            return torch.optim.AdamW(params, fused=True, **kwargs)
        log.info("optim adamw_torch_fused: fused AdamW needs CUDA; using plain AdamW on %s", device.type)
    return torch.optim.AdamW(params, **kwargs)
