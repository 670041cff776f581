"""Packed documents never see each other, architecture by architecture: the differential harness.

For each decoder-only causal LM a user could fine-tune, a tiny random model (hidden 64, 2 layers, 4 heads, 2 KV
heads, vocabulary 300, and a sliding window of 4, shorter than the documents, wherever the architecture has one)
runs a packed block of three documents and a padding tail through packtrain's own path
(trainer/model/model.py ``packed_forward``; the reference attention packtrain chooses on the CPU, and the varlen
path with tests/test_attention.py's stand-in kernel wherever ``choose_attention`` would pick varlen on a GPU); its
logits must equal each document's logits alone through a plain ``model(input_ids)``, and the loss packtrain
computes (trainer/step.py ``packed_loss_sum``) the per-document reference loss. Architectures that leak (a
recurrent state running across documents, a mask that ignores position ids) must be refused before training by
the run-start probe (trainer/run/isolation.py). docs/TRAINING.md ('Which architectures') lists the results.
"""

from __future__ import annotations

import unittest.mock

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from packtrain.core.blocks import position_ids_from_doc_lens, segment_lens
from packtrain.trainer.data.data import IGNORE_INDEX, collate
from packtrain.trainer.model import attention
from packtrain.trainer.model.model import packed_forward
from packtrain.trainer.run.isolation import TOLERANCE, IsolationError, check_document_isolation, probe
from packtrain.trainer.step import packed_loss_sum
from test_attention import per_segment_kernel

LENS, BLOCK, VOCAB, WINDOW, PAD = [10, 7, 9], 30, 300, 4, 3
H = 64
SIZES = dict(vocab_size=VOCAB, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256, sliding_window=WINDOW,
             use_sliding_window=True, max_window_layers=0, moe_intermediate_size=32, num_experts=4,
             num_local_experts=4, num_experts_per_tok=2, attention_dropout=0.0, hidden_dropout=0.0,
             pad_token_id=PAD, bos_token_id=1, eos_token_id=0, tie_word_embeddings=False,
             # GPT-2-style names
             n_embd=H, n_layer=2, n_head=4, n_positions=256, n_inner=2 * H, resid_pdrop=0.0, embd_pdrop=0.0,
             attn_pdrop=0.0)
"""Every field the architecture's config has is set (the others are left out)."""

MIXED = {"layer_types": ["sliding_attention", "full_attention"]}
"""A local layer (window 4) and a global one, for the architectures that mix them (Gemma 3's 512-token local layers)."""

EXACT = {  # model type: the fields it needs beyond SIZES (a sliding window of 4 wherever it has one)
    "llama": {}, "qwen2": MIXED, "qwen3": MIXED, "qwen2_moe": {"shared_expert_intermediate_size": 32},
    "qwen3_moe": {}, "mistral": {}, "mixtral": {}, "ministral": MIXED, "gemma": {},
    "gemma2": {"query_pre_attn_scalar": 16}, "gemma3_text": {"query_pre_attn_scalar": 16, **MIXED},
    "phi3": {}, "phi": {}, "olmo": {}, "olmo2": {}, "olmo3": MIXED, "stablelm": {}, "granite": {}, "cohere": {},
    "cohere2": MIXED, "smollm3": {}, "starcoder2": {}, "helium": {}, "glm": {}, "glm4": {}, "exaone4": MIXED,
    "gpt2": {}, "gpt_neox": {}, "gpt_bigcode": {}, "gpt_neo": {"attention_types": [[["global", "local"], 1]],
                                                               "window_size": WINDOW, "num_layers": 2},
    "falcon": {"new_decoder_architecture": True}, "gptj": {"rotary_dim": 8}, "codegen": {"rotary_dim": 8},
    "deepseek_v3": {"q_lora_rank": None, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
                    "v_head_dim": 16, "head_dim": 8, "num_key_value_heads": 4, "first_k_dense_replace": 1,
                    "n_routed_experts": 4, "n_group": 1, "topk_group": 1},  # MLA: V's head dim differs from Q/K's
    # their mask ignores the position ids: packtrain passes it ready-made (model.py EXPLICIT_MASK_MODEL_TYPES)
    "opt": {"ffn_dim": 2 * H, "word_embed_proj_dim": H}, "gpt_oss": {}, "biogpt": {}, "xglm": {"ffn_dim": 2 * H},
    "afmoe": MIXED, "mpt": {"attn_config": {"alibi": True}, "expansion_ratio": 2},
}
REFUSED = {  # model type: the fields it needs; each lets one document see the one before it
    "bloom": {},           # ALiBi and its mask come from the attention mask, position ids are ignored
    "jamba": {},           # Mamba layers: the recurrent state runs across documents (Bamba, Falcon-H1 likewise)
    "qwen3_next": {},      # Gated DeltaNet linear attention: likewise (Qwen3.5 too)
    "lfm2": {"layer_types": ["conv", "full_attention"]},  # short convolutions run across documents
    "mamba": {},
}


def tiny_model(model_type: str, extra: dict) -> torch.nn.Module:
    cls = CONFIG_MAPPING[model_type]
    defaults = cls()
    fields = {k: v for k, v in SIZES.items()  # fields it has, not read-only properties such as Falcon's head_dim
              if (hasattr(defaults, k) or k in cls.attribute_map) and not isinstance(getattr(cls, k, None), property)}
    config = cls(**{**fields, **extra})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.config.use_cache = False  # as trainer/model/model.py's _finish
    return model


def documents():
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(4, VOCAB, (n,), generator=g) for n in LENS]
    ids = torch.cat(docs + [torch.full((BLOCK - sum(LENS),), PAD)])[None]
    positions = torch.from_numpy(position_ids_from_doc_lens(LENS, BLOCK))[None]
    return docs, ids, positions


def packed_error(model, docs, ids, positions, alone, **attention_kwargs) -> float:
    with torch.no_grad():
        packed = packed_forward(model, ids, positions, **attention_kwargs)[0]
    starts = torch.tensor([0] + LENS).cumsum(0).tolist()
    return max((packed[s:s + len(d)] - a).abs().max().item() for s, d, a in zip(starts, docs, alone))


def varlen_choice(model) -> attention.AttentionChoice:
    """What choose_attention picks for ``model`` on an sm90 GPU in bf16 (CUDA's answers faked; the stand-in kernel)."""
    with unittest.mock.patch.object(torch.cuda, "get_device_capability", lambda device=None: (9, 0)), \
            unittest.mock.patch.object(attention, "varlen_kernel", lambda: per_segment_kernel):
        return attention.choose_attention(torch.device("cuda"), True, BLOCK, model)


@pytest.fixture(autouse=True)
def restore_kernel():
    saved = attention._active
    yield
    attention._active = saved


@pytest.mark.parametrize("model_type", sorted(EXACT))
def test_packed_logits_and_loss_equal_documents_alone(model_type):
    model = tiny_model(model_type, EXACT[model_type])
    docs, ids, positions = documents()
    with torch.no_grad():
        alone = [model(input_ids=d[None]).logits[0] for d in docs]
    assert packed_error(model, docs, ids, positions, alone) < 1e-5

    labels = ids.clone()
    labels[0, sum(LENS):] = IGNORE_INDEX
    labels[positions == 0] = IGNORE_INDEX  # a document's first token is never a target
    want = sum(F.cross_entropy(a[:-1], d[1:], reduction="sum") for a, d in zip(alone, docs))
    with torch.no_grad():
        got = packed_loss_sum(model, ids, positions, labels)
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    assert check_document_isolation(model, model_type, torch.device("cpu"), None).exact

    choice = varlen_choice(model)
    if choice.varlen:  # the GPU path, with the stand-in kernel: exact as well
        model.set_attn_implementation(attention.VARLEN_NAME)
        batch = collate([{"input_ids": ids[0], "position_ids": positions[0], "n_sup": torch.tensor(0),
                          "seq_lens": torch.tensor(segment_lens(LENS, BLOCK), dtype=torch.int32)}])
        inputs = attention.attention_inputs(batch, torch.device("cpu"), choice)
        assert packed_error(model, docs, ids, positions, alone, **inputs) < 1e-5
        assert check_document_isolation(model, model_type, torch.device("cpu"), choice).exact


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_leaking_architectures_are_refused_before_training(model_type):
    model = tiny_model(model_type, REFUSED[model_type])
    docs, ids, positions = documents()
    with torch.no_grad():
        alone = [model(input_ids=d[None]).logits[0] for d in docs]
    assert packed_error(model, docs, ids, positions, alone) > 1e-4  # silently wrong without the check
    assert probe(model, torch.device("cpu"), None).leak > TOLERANCE[torch.float32]
    with pytest.raises(IsolationError, match=f"model type '{model_type}'.*lets packed documents see each other"):
        check_document_isolation(model, model_type, torch.device("cpu"), None)


def test_a_model_that_numbers_positions_its_own_way_is_refused():
    """RoBERTa-style decoders start their positions at padding_idx + 1 when run alone: packtrain's restarting
    position ids (0, 1, ...) give every packed document other logits, with no leak between documents."""
    model = tiny_model("roberta", {"is_decoder": True})
    docs, ids, positions = documents()
    with torch.no_grad():
        alone = [model(input_ids=d[None]).logits[0] for d in docs]
    assert packed_error(model, docs, ids, positions, alone) > 1e-2
    result = probe(model, torch.device("cpu"), None)
    assert result.leak == 0.0 and result.mismatch > 1e-2
    with pytest.raises(IsolationError, match=r"model type 'roberta'.*gives packed documents other logits than alone "
                       r"with the reference attention .*: it does not number a packed document's positions as it "
                       r"numbers a document alone, so training on packed blocks would be silently wrong"):
        check_document_isolation(model, "roberta", torch.device("cpu"), None)


def test_varlen_stays_off_models_whose_attention_is_not_causal():
    """BERT-style decoders without ``is_decoder`` attend both ways: the reference mask does it per document, the
    varlen kernel (called causal) would not."""
    model = tiny_model("bert", {})
    choice = varlen_choice(model)
    assert not choice.varlen and "not causal" in choice.note
    assert varlen_choice(tiny_model("gpt2", {})).varlen


def test_a_run_refuses_a_leaking_model_before_its_run_directory(tmp_path):
    """What packtrain did before: trained a Jamba on packed blocks, each document reading the ones before it."""
    from packtrain.trainer.run.train import run
    from trainer_fixtures import make_config, random_blocks, write_build, write_tokenizer

    model_dir = tmp_path / "jamba"
    tiny_model("jamba", {}).save_pretrained(model_dir)
    write_tokenizer(model_dir)
    write_build(tmp_path / "cache", "sql", random_blocks(4, 32, 0), random_blocks(2, 32, 1), 32, model_dir)
    with pytest.raises(IsolationError) as refused:
        run(make_config(model_dir, tmp_path / "runs"), tmp_path / "cache")
    message = str(refused.value)
    assert message.startswith(f"model {model_dir} (model type 'jamba', JambaForCausalLM) lets packed documents see "
                              "each other with sdpa attention (a document's logits move by ")
    assert message.endswith("its attention or recurrent state is not isolated by position ids, so training on packed "
                            "blocks would be silently wrong; use a model type listed as exact in docs/TRAINING.md "
                            "('Which architectures')")
    assert "\n" not in message and not (tmp_path / "runs").exists()


def test_a_varlen_path_that_fails_is_refused_with_the_reference_as_the_fix():
    """Nemotron's decoder layer drops the keyword arguments that carry the segments: varlen would fail at the first
    step with a traceback; the probe says it in one line with the setting that trains it."""
    model = tiny_model("nemotron", {})
    choice = varlen_choice(model)
    assert choice.varlen
    attention.register(per_segment_kernel)
    model.set_attn_implementation(attention.VARLEN_NAME)
    with pytest.raises(IsolationError, match=r"^model nemotron \(model type 'nemotron', NemotronForCausalLM\) fails on "
                       r"packed blocks with varlen attention \(RuntimeError: varlen attention was called without "
                       r"cu_seq_lens_q .*\); set model.varlen_attention: false \(the reference attention\), or use "):
        check_document_isolation(model, "nemotron", torch.device("cpu"), choice)
    model.set_attn_implementation("sdpa")
    assert check_document_isolation(model, "nemotron", torch.device("cpu"), None).exact


def test_gemma3_with_its_vision_tower_is_exact():
    """Gemma 3 from 4B up loads as Gemma3ForConditionalGeneration (AutoModelForCausalLM maps it so): its text
    layers, local and global, isolate packed documents as Gemma3ForCausalLM's do."""
    from transformers import Gemma3Config

    text = {k: SIZES[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "head_dim",
                                  "num_attention_heads", "num_key_value_heads", "sliding_window", "pad_token_id")}
    config = Gemma3Config(text_config={**text, **MIXED, "query_pre_attn_scalar": 16}, mm_tokens_per_image=4,
                          vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14),
                          image_token_index=299, boi_token_index=297, eoi_token_index=298)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    docs, ids, positions = documents()
    with torch.no_grad():
        alone = [model(input_ids=d[None], use_cache=False).logits[0] for d in docs]
    assert packed_error(model, docs, ids, positions, alone) < 1e-5
    assert check_document_isolation(model, "gemma3", torch.device("cpu"), None).exact
    # the window is in the text config: varlen (which has none) must see it, whatever else keeps varlen off
    for module in model.modules():
        if getattr(module, "is_causal", None) is False:
            module.is_causal = True  # the vision tower's, which alone kept varlen off before
    choice = varlen_choice(model)
    assert not choice.varlen and f"sliding window ({WINDOW}) is shorter than the block ({BLOCK})" in choice.note
