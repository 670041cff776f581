"""Packed documents never see each other: a packed block's logits equal each document run alone.

This pins the behaviour trainer/model/model.py relies on in transformers (5.x): with position ids that
restart per document, NO 2D attention mask and NO KV cache, ``create_causal_mask`` detects the
packed sequences and builds a block-diagonal causal mask for SDPA.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from packtrain.core.config_train import LoraConfig
from packtrain.trainer.model.adapters import attach_adapters
from packtrain.trainer.data.data import position_ids_from_doc_lens
from packtrain.trainer.model.model import packed_forward
from trainer_fixtures import PAD_ID, tiny_model_dir

LENS = [5, 9, 4]
BLOCK = 21  # 3 padding tokens at the end


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def packed_and_docs(seed=0):
    g = torch.Generator().manual_seed(seed)
    docs = [torch.randint(4, 256, (n,), generator=g) for n in LENS]
    ids = torch.cat(docs + [torch.full((BLOCK - sum(LENS),), PAD_ID)])[None]
    positions = torch.from_numpy(position_ids_from_doc_lens(LENS, BLOCK))[None]
    return docs, ids, positions


def assert_packed_equals_alone(model):
    docs, ids, positions = packed_and_docs()
    with torch.no_grad():
        packed = packed_forward(model, ids, positions)[0]
        start = 0
        for doc in docs:
            alone = model(input_ids=doc[None], use_cache=False).logits[0]
            torch.testing.assert_close(packed[start:start + len(doc)], alone, atol=1e-5, rtol=0)
            start += len(doc)
    return packed


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_block_logits_equal_documents_alone(model_dir, attn):
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=attn, dtype=torch.float32).eval()
    assert model.config._attn_implementation == attn
    packed = assert_packed_equals_alone(model)

    # the check has teeth: the same block read as ONE sequence gives other logits for docs 2 and 3
    _, ids, _ = packed_and_docs()
    with torch.no_grad():
        as_one = model(input_ids=ids, use_cache=False).logits[0]
    assert (as_one[LENS[0]:sum(LENS)] - packed[LENS[0]:sum(LENS)]).abs().max() > 1e-2


def test_packed_with_lora_adapter_in_train_mode(model_dir):
    base = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32)
    base.config.use_cache = False
    model = attach_adapters(base, LoraConfig(r=4, alpha=8, dropout=0.0), gradient_checkpointing=True)
    with torch.no_grad():  # make the adapter non-trivial (lora_B starts at zero)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    model.train()  # gradient checkpointing only acts in train mode
    assert_packed_equals_alone(model)


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_adapters_keep_the_base_dtype_and_do_not_upcast_lora_inputs(model_dir, method):
    """No fp32 copies: the bf16 base keeps its bf16 norms and embeddings (peft's
    prepare_model_for_kbit_training would cast them to fp32) and no LoRA layer casts its input to
    the fp32 adapter dtype; the LoRA weights themselves are fp32."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    base = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.bfloat16)
    model = attach_adapters(base, LoraConfig(method=method, r=4, alpha=8), gradient_checkpointing=False)
    norms = [m for name, m in model.named_modules() if name.endswith("norm")]
    assert norms and all(m.weight.dtype == torch.bfloat16 for m in norms)
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    assert layers and all(m.cast_input_dtype_enabled is False for m in layers)
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
