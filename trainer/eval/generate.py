"""Batched greedy generation with a KV cache, from the base model and from the adapter.

The prompts are token ids straight from the build's shards (the exact tokens the adapter was
trained on, no re-tokenizing). A batch is left-padded so every prompt ends where generation
starts; ``model.generate`` runs greedy (``do_sample=False``) with ``use_cache=True`` (training
turns the cache off: a KV cache disables transformers' packed-sequence detection) and stops a row
at the tokenizer's eos. The base model's answer is the same PEFT model under
``disable_adapter()``: one model in memory, not two. A model that trains with varlen attention
generates with SDPA (packtrain.trainer.model.attention.reference_attention_for_generation).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

import torch

from packtrain.trainer.model.attention import reference_attention_for_generation
from packtrain.trainer.model.model import Precision, causal_lm
from packtrain.trainer.report.progress import Progress


@dataclass(frozen=True)
class Greedy:
    """How to generate: at most ``max_new_tokens`` per prompt, ``batch_size`` prompts at a time, stopping
    a row at ``eos_id``, padding with ``pad_id``, on ``device`` in ``precision``."""

    max_new_tokens: int
    batch_size: int
    eos_id: int
    pad_id: int
    device: torch.device
    precision: Precision


@torch.no_grad()
def generate(model: torch.nn.Module, prompts: Sequence[Sequence[int]], how: Greedy, adapter: bool = True,
             progress: str | None = None) -> list[list[int]]:
    """The greedy continuation of every prompt (token ids, up to and without the eos), in order.

    ``adapter=False`` generates with the PEFT adapter disabled (the base model's answers). ``progress``:
    what the console calls this generation while it runs, prompt by prompt (trainer/report/progress.py);
    None: nothing shown."""
    was_training = model.training
    model.eval()
    off = model.disable_adapter() if not adapter and hasattr(model, "disable_adapter") else contextlib.nullcontext()
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))  # similar lengths share a batch: less padding
    by_index: dict[int, list[int]] = {}
    shown = Progress(progress or "generate", len(prompts), ("prompt", "prompts"), show=progress is not None)
    try:
        # eager: decoder layers compiled in place for training (train.torch_compile: regional) would
        # recompile for every layer's KV-cache index and every new length
        with off, reference_attention_for_generation(causal_lm(model)), torch.compiler.set_stance("force_eager"):
            for start in range(0, len(order), how.batch_size):
                chunk = order[start:start + how.batch_size]
                ids, mask = left_pad([prompts[i] for i in chunk], how.pad_id)
                with how.precision.autocast(how.device):
                    out = model.generate(input_ids=ids.to(how.device), attention_mask=mask.to(how.device),
                                         max_new_tokens=how.max_new_tokens, do_sample=False, use_cache=True,
                                         eos_token_id=how.eos_id, pad_token_id=how.pad_id)
                for i, row in zip(chunk, out[:, ids.shape[1]:].tolist()):
                    by_index[i] = until_eos(row, how.eos_id)
                shown.update(len(chunk))
    finally:
        shown.close()
        model.train(was_training)
    return [by_index[i] for i in range(len(prompts))]


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), each [len(prompts), longest], padded on the left::

        >>> ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
        >>> ids.tolist(), mask.tolist()
        ([[5, 6, 7], [0, 0, 8]], [[1, 1, 1], [0, 0, 1]])
    """
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        if prompt:
            ids[row, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
            mask[row, width - len(prompt):] = 1
    return ids, mask


def until_eos(tokens: Sequence[int], eos_id: int) -> list[int]:
    """The tokens before the first eos (generate pads finished rows after it)::

        >>> until_eos([9, 4, 0, 3, 3], eos_id=0)
        [9, 4]
    """
    tokens = list(tokens)
    return tokens[:tokens.index(eos_id)] if eos_id in tokens else tokens
