"""No host synchronisation inside a training step (beyond the loop's one finiteness check): what the
forward needs to know about a micro-batch (the attention segments, the supervised positions) is made by
the loader on the CPU and moved with the batch, never read back from the device.

On CPU the check runs a micro-batch on the ``meta`` device: tensors there have shapes and no values, so
any ``.item()``, ``.tolist()``, ``bool()`` or ``nonzero`` on a device tensor raises. tests/test_gpu.py
runs whole steps under ``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from packtrain.core.config_train import LoraConfig
from packtrain.trainer.model import attention
from packtrain.trainer import loss
from packtrain.trainer.model.adapters import attach_adapters
from packtrain.trainer.data.data import collate, sequence_item
from packtrain.trainer.model.model import Precision, causal_lm
from packtrain.trainer.step import LossPath, forward_loss
from trainer_fixtures import tiny_model_dir

META = torch.device("meta")


def two_blocks() -> dict[str, torch.Tensor]:
    """Blocks of 8: documents [3, 2] (prompt, answer, then padding) and [8]; a 1 in the mask: supervised."""
    ids = np.arange(10, 26, dtype=np.uint16)
    first = sequence_item(ids[:8], np.array([0, 1, 1, 0, 1, 0, 0, 0], np.uint8), [3, 2], 8)
    second = sequence_item(ids[8:], np.array([0, 0, 0, 1, 1, 1, 1, 1], np.uint8), [8], 8)
    return collate([first, second])


def test_the_loader_gives_the_attention_boundaries_and_supervised_positions():
    batch = two_blocks()
    # segments [3, 2, 3] (the padding tail is one) and [8]
    assert batch["cu_seq_lens"].dtype == torch.int32 and batch["cu_seq_lens"].tolist() == [0, 3, 5, 8, 16]
    assert batch["max_length"].item() == 8  # the block: a bound on every segment
    # labels: block 0 [-, 11, 12, -, 14, -, -, -] (a document's first token is never a target), block 1
    # [-, -, -, 21, 22, 23, 24, 25]; each predicted from the position before it, counted over the flat [2 x 8]
    assert batch["labels"].tolist() == [[-100, 11, 12, -100, 14, -100, -100, -100],
                                        [-100, -100, -100, 21, 22, 23, 24, 25]]
    assert batch["sup_index"].tolist() == [0, 1, 3, 10, 11, 12, 13, 14]
    assert all(t.device.type == "cpu" for t in batch.values())


def test_the_supervised_positions_give_the_loss_the_device_would_find():
    batch = two_blocks()
    hidden = torch.randn(2, 8, 6, generator=torch.Generator().manual_seed(0))
    head = torch.nn.Linear(6, 32, bias=False)
    with torch.no_grad():
        found = loss.chunked_loss_sum(head, hidden, batch["labels"])
        given = loss.chunked_loss_sum(head, hidden, batch["labels"], sup_index=batch["sup_index"])
    assert given.item() == found.item()


def shapes_only_kernel(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                       window_size=(-1, -1), enable_gqa=False):
    """A varlen stand-in that reads nothing from ``cu`` (it could not on meta): attention over everything."""
    assert type(max_q) is int and cu_seq_q.dtype == torch.int32 and window_size == (-1, 0)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True,
                                         scale=scale, enable_gqa=enable_gqa)
    return out.transpose(0, 1)


@pytest.fixture
def meta_model(tmp_path):
    saved = attention._active
    attention.register(shapes_only_kernel)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(tmp_path), attn_implementation="sdpa",
                                                 dtype=torch.float32)
    model.config.use_cache = False
    model.requires_grad_(False)
    model.set_attn_implementation(attention.VARLEN_NAME)
    model = attach_adapters(model, LoraConfig(r=4), gradient_checkpointing=False).to(META)
    loss._checked[causal_lm(model)] = True  # the hidden-state check is one sync on the first micro-batch only
    yield model
    attention._active = saved


def meta_step(model, batch):
    path = LossPath(META, Precision(torch.float32, None, False, "meta"),
                    attention.AttentionChoice("varlen", attention.VARLEN_NAME, "stand-in"))
    micro_loss = forward_loss(model, batch, path)
    micro_loss.backward()
    return micro_loss


def test_a_micro_batch_runs_forward_and_backward_without_reading_the_device(meta_model):
    micro_loss = meta_step(meta_model, two_blocks())
    assert micro_loss.device == META and micro_loss.shape == ()
    assert all(p.grad is not None for p in meta_model.parameters() if p.requires_grad)


def test_the_meta_check_catches_a_read_of_the_device(meta_model):
    """Without the loader's supervised positions the loss finds them with nonzero: on a GPU a host sync."""
    batch = two_blocks()
    del batch["sup_index"]
    with pytest.raises(NotImplementedError, match=r"torch\.nonzero"):
        meta_step(meta_model, batch)
