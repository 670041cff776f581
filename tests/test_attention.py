"""The varlen attention path's wiring, on CPU: a pure-torch per-segment kernel stands in for
``varlen_attn`` (which needs CUDA), and records how it was called.

What the real kernel must receive is pinned here: the causal window as the tuple (-1, 0), int32
``cu_seq_lens`` starting at 0, Python int max lengths, ``[total, heads, dim]`` tensors, GQA either
native (``enable_gqa``) or by repeated K/V for the torch releases without it. tests/test_gpu.py runs
the real kernel against the reference.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from packtrain.trainer.model import attention
from packtrain.trainer.data.data import collate, position_ids_from_doc_lens, segment_lens
from packtrain.trainer.model.model import packed_forward
from trainer_fixtures import PAD_ID, tiny_model_dir

CALLS: list[dict] = []


def per_segment_kernel(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                       window_size=(-1, -1), enable_gqa=False):
    """torch 2.12+'s signature, computed with SDPA one segment at a time (exact on CPU)."""
    CALLS.append(dict(q=q.shape, k=k.shape, cu=cu_seq_q.clone(), cu_dtype=cu_seq_q.dtype, max_q=max_q, max_k=max_k,
                      window=window_size, gqa=enable_gqa, scale=scale))
    if window_size != (-1, 0):  # a list, or (-1, -1), is NOT causal in the real kernel: fail loudly
        raise AssertionError(f"not the causal window: {window_size!r}")
    bounds = cu_seq_q.tolist()
    assert max_q >= max(b - a for a, b in zip(bounds, bounds[1:]))  # a bound on every segment
    out = []
    for a, b in zip(bounds, bounds[1:]):
        qs, ks, vs = (t[a:b].transpose(0, 1) for t in (q, k, v))
        out.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale,
                                                  enable_gqa=enable_gqa).transpose(0, 1))
    return torch.cat(out)


def old_kernel(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)):
    """torch 2.10/2.11's signature: no enable_gqa, so K/V must arrive repeated."""
    assert q.shape[1] == k.shape[1], "without enable_gqa the kernel needs as many K/V heads as query heads"
    return per_segment_kernel(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale, window_size=window_size)


LENS = [5, 9, 4]
BLOCK = 21  # 3 padding tokens: a segment of their own


@pytest.fixture(autouse=True)
def restore_kernel():
    """Each test may register a stand-in kernel; none outlives it."""
    saved = attention._active
    yield
    attention._active = saved


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


def blocks():
    g = torch.Generator().manual_seed(0)
    items = []
    for lens in (LENS, [BLOCK]):
        ids = torch.cat([torch.randint(4, 256, (n,), generator=g) for n in lens]
                        + [torch.full((BLOCK - sum(lens),), PAD_ID)])
        items.append({"input_ids": ids, "position_ids": torch.from_numpy(position_ids_from_doc_lens(lens, BLOCK)),
                      "seq_lens": torch.tensor(segment_lens(lens, BLOCK), dtype=torch.int32),
                      "n_sup": torch.tensor(0)})
    return collate(items)


@pytest.mark.parametrize("kernel", [per_segment_kernel, old_kernel], ids=["enable_gqa", "repeat_kv"])
def test_varlen_path_gives_the_reference_logits_and_calls_the_kernel_right(model_dir, kernel):
    batch = blocks()
    reference = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32).eval()
    with torch.no_grad():
        want = packed_forward(reference, batch["input_ids"], batch["position_ids"])

    attention.register(kernel)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32).eval()
    model.set_attn_implementation(attention.VARLEN_NAME)
    choice = attention.AttentionChoice("varlen", attention.VARLEN_NAME, "")
    CALLS.clear()
    with torch.no_grad():
        got = packed_forward(model, batch["input_ids"], batch["position_ids"],
                             **attention.attention_inputs(batch, torch.device("cpu"), choice))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)

    assert len(CALLS) == 2  # one per layer
    call = CALLS[0]
    assert call["window"] == (-1, 0) and type(call["window"]) is tuple
    assert call["cu_dtype"] == torch.int32 and call["cu"].tolist() == [0, 5, 14, 18, 21, 42]
    assert type(call["max_q"]) is int and call["max_q"] == call["max_k"] == 21
    assert call["q"] == (2 * BLOCK, 4, 16)  # [total tokens, query heads, head dim]
    if kernel is per_segment_kernel:
        assert call["gqa"] is True and call["k"] == (2 * BLOCK, 2, 16)  # K/V not repeated
    else:
        assert call["k"] == (2 * BLOCK, 4, 16)


def test_a_list_window_would_be_caught():
    """The stand-in refuses what the real kernel would silently run non-causally."""
    q = torch.randn(4, 2, 8)
    with pytest.raises(AssertionError, match="causal window"):
        per_segment_kernel(q, q, q, torch.tensor([0, 4], dtype=torch.int32), None, 4, 4, window_size=[-1, 0])


def test_collate_builds_cu_seq_lens_on_the_cpu():
    batch = blocks()
    assert batch["cu_seq_lens"].dtype == torch.int32 and batch["cu_seq_lens"].tolist() == [0, 5, 14, 18, 21, 42]
    assert batch["max_length"].item() == 21 and "seq_lens" not in batch
    assert segment_lens([3, 2], 6) == [3, 2, 1] and segment_lens([6], 6) == [6] and segment_lens([], 4) == [4]


def test_choose_attention_on_cpu_is_the_reference(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cpu = torch.device("cpu")
    assert attention.choose_attention(cpu, True, 2048, model).implementation == "sdpa"
    assert "cpu has no varlen" in attention.choose_attention(cpu, True, 2048, model).note
    assert attention.choose_attention(cpu, False, 2048, model).implementation == "eager"
    assert "varlen_attention is false" in attention.choose_attention(cpu, True, 2048, model, varlen=False).note


def test_choose_attention_refuses_what_flash_cannot_do(model_dir, monkeypatch):
    """The CUDA checks, in order, with CUDA's answers faked (the choice is pure otherwise)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(attention, "register", lambda kernel=None: None)
    assert attention.choose_attention(cuda, True, 2048, model, dtype=torch.bfloat16).varlen
    assert "needs bf16 or fp16" in attention.choose_attention(cuda, True, 2048, model, dtype=None).note
    model.config.attn_logit_softcapping = 50.0
    assert "attn_logit_softcapping=50.0" in attention.choose_attention(cuda, True, 2048, model).note
    model.config.attn_logit_softcapping = None
    model.config.use_sliding_window, model.config.sliding_window = True, 1024
    assert "sliding window (1024)" in attention.choose_attention(cuda, True, 2048, model).note
    model.config.use_sliding_window = False
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert "compute capability >= 8.0, this GPU has 7.5" in attention.choose_attention(cuda, True, 2048, model).note


def test_varlen_refuses_score_transforms():
    attention.register(per_segment_kernel)
    q = torch.randn(1, 2, 4, 8)
    batch = {"cu_seq_lens": torch.tensor([0, 4], dtype=torch.int32), "max_length": torch.tensor(4)}
    choice = attention.AttentionChoice("varlen", attention.VARLEN_NAME, "")
    with pytest.raises(RuntimeError, match="cannot apply softcap"):
        attention.varlen_attention_forward(None, q, q, q, None, softcap=30.0,
                                           **attention.attention_inputs(batch, torch.device("cpu"), choice))


def test_kernel_call_reads_each_signature():
    assert attention.KernelCall.of(per_segment_kernel) == attention.KernelCall(window=True, gqa=True)
    assert attention.KernelCall.of(old_kernel) == attention.KernelCall(window=True, gqa=False)

    def torch_2_9(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
        return q
    assert attention.KernelCall.of(torch_2_9) == attention.KernelCall(window=False, gqa=False)
    with pytest.raises(RuntimeError, match="neither window_size nor is_causal"):
        attention.KernelCall.of(lambda q, k, v: q)


def test_installed_varlen_attn_signature_is_one_we_call():
    """The installed torch's real kernel: its signature is one KernelCall knows, and its shape contract
    holds on meta tensors where the op allows it."""
    kernel = attention.varlen_kernel()
    if kernel is None:
        pytest.skip(f"torch {torch.__version__} has no torch.nn.attention.varlen")
    params = inspect.signature(kernel).parameters
    assert list(params)[:7] == ["query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k"]
    call = attention.KernelCall.of(kernel)
    assert call.window  # torch >= 2.10
    q = torch.empty(42, 4, 16, device="meta", dtype=torch.bfloat16)
    kv = torch.empty(42, 2 if call.gqa else 4, 16, device="meta", dtype=torch.bfloat16)
    cu = torch.empty(6, device="meta", dtype=torch.int32)
    options = {"window_size": (-1, 0), **({"enable_gqa": True} if call.gqa else {})}
    out = kernel(q, kv, kv, cu, cu, 21, 21, **options)
    assert out.shape == (42, 4, 16) and out.dtype == torch.bfloat16


def test_a_whole_run_with_varlen_gives_the_reference_losses_and_generates(tmp_path, model_dir, monkeypatch):
    """Training, evaluation, checkpoint and the end-of-run samples through the varlen path (the
    stand-in kernel, exact on CPU): the same losses as the reference run. The samples once failed on a
    GPU only: generation has no segment boundaries, so it must not attend with varlen."""
    import json

    from packtrain.trainer.run import context as context_module
    from packtrain.trainer.run.train import run
    from trainer_fixtures import RUN_END, make_config, random_blocks, write_build

    reference_choice = context_module.choose_attention

    def forced_varlen(device, use_sdpa, block_size, model, varlen=True, dtype=None):
        if not varlen:
            return reference_choice(device, use_sdpa, block_size, model, varlen=False, dtype=dtype)
        attention.register(per_segment_kernel)
        return attention.AttentionChoice("varlen", attention.VARLEN_NAME, "the CPU stand-in kernel")

    monkeypatch.setattr(context_module, "choose_attention", forced_varlen)
    write_build(tmp_path / "cache", "sql", random_blocks(12, 64, 0), random_blocks(4, 64, 1), 64, model_dir,
                rows_per_shard=8)
    losses = {}
    for name, varlen in (("varlen", True), ("reference", False)):
        config = make_config(model_dir, tmp_path / "runs", max_steps=3, eval_steps=2, run_name=name, **RUN_END)
        config.model.varlen_attention = varlen
        CALLS.clear()
        run_dir = run(config, tmp_path / "cache")
        info = json.loads((run_dir / "run.json").read_text())
        assert info["attention"] == ("varlen" if varlen else "sdpa")
        assert bool(CALLS) is varlen
        assert "samples, adapter: 3/3 prompts" in (run_dir / "train.log").read_text()
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [r[key] for r in records for key in ("loss", "eval/loss") if key in r]
    assert len(losses["varlen"]) == len(losses["reference"]) >= 5  # 3 steps, evaluations at 0 and 2 (and 3)
    assert losses["varlen"] == pytest.approx(losses["reference"], rel=1e-5)


def test_generation_attends_with_sdpa_and_gives_varlen_back(model_dir):
    attention.register(per_segment_kernel)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32)
    model.set_attn_implementation(attention.VARLEN_NAME)
    with pytest.raises(ValueError, match="inside"):
        with attention.reference_attention_for_generation(model):
            assert model.config._attn_implementation == "sdpa"
            raise ValueError("inside")
    assert model.config._attn_implementation == attention.VARLEN_NAME
    model.set_attn_implementation("eager")
    with attention.reference_attention_for_generation(model):
        assert model.config._attn_implementation == "eager"  # only varlen is switched
