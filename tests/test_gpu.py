"""The CUDA tier: run by `make test-gpu` on a GPU machine, skipped on CPU (marker ``cuda``).

The real kernels against the references the CPU tests pin: varlen flash attention vs per-document
SDPA (lengths 1..2048, GQA, forward and gradients at bf16 tolerance), a packed block vs each document
alone through a model, the fused loss vs the chunked loss, whole runs in bf16, fp16 + GradScaler and
QLoRA NF4 with compile, resume on CUDA, torchrun with NCCL, the peak memory of the Qwen2.5-0.5B
architecture under its bound, fp8 base layers against bf16 (same blocks), regional compile against eager,
and training steps with no host sync but the loop's one check (``torch.cuda.set_sync_debug_mode``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (make test-gpu on a GPU machine)")]

from packtrain.trainer.model import attention  # noqa: E402
from packtrain.trainer.data.data import collate, segment_lens  # noqa: E402
from packtrain.trainer.loss import chunked_loss_sum, fused_kernel, fused_loss_sum  # noqa: E402
from packtrain.trainer.model.model import packed_forward  # noqa: E402
from packtrain.trainer.run.train import run  # noqa: E402
import trainer_fixtures  # noqa: E402
from trainer_fixtures import RUN_END, random_blocks, tiny_model_dir, write_build  # noqa: E402


def make_config(*args, **train):
    """tests/trainer_fixtures.make_config with the end of a run as users get it (RUN_END: samples and
    plots), unless a test says otherwise: on CUDA the samples once failed where the CPU's did not."""
    return trainer_fixtures.make_config(*args, **{**RUN_END, **train})


ROOT = Path(__file__).resolve().parents[1]
CUDA = torch.device("cuda")


def reference_attention(q, k, v, lens):
    """fp32 SDPA, causal, one segment at a time; q [N, Hq, D], k/v [N, Hkv, D]."""
    out, start = [], 0
    rep = q.shape[1] // k.shape[1]
    for n in lens:
        qs, ks, vs = (t[start:start + n].float().transpose(0, 1) for t in (q, k, v))
        ks, vs = ks.repeat_interleave(rep, 0), vs.repeat_interleave(rep, 0)
        out.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1))
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("lens", [[1, 2047], [2048], [7, 1, 300, 1000, 740], [1] * 64])
@pytest.mark.parametrize("heads", [(14, 2, 64), (8, 8, 128)])
def test_varlen_kernel_matches_per_document_sdpa(lens, heads):
    hq, hkv, d = heads
    n = sum(lens)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(n, h, d, device=CUDA, generator=g, dtype=torch.bfloat16).requires_grad_(True)
               for h in (hq, hkv, hkv))
    attention.register()
    query, key, value = (t.unsqueeze(0).transpose(1, 2) for t in (q, k, v))  # [1, H, N, D]
    batch = collate([{"seq_lens": torch.tensor(lens, dtype=torch.int32), "position_ids": torch.zeros(n)}])
    choice = attention.AttentionChoice("varlen", attention.VARLEN_NAME, "")
    out, _ = attention.varlen_attention_forward(None, query, key, value, None, scaling=d ** -0.5,
                                                **attention.attention_inputs(batch, CUDA, choice))
    ref = reference_attention(q, k, v, lens)
    torch.testing.assert_close(out[0].float(), ref, atol=2e-2, rtol=2e-2)
    grad = torch.randn_like(ref)
    got = torch.autograd.grad(out[0].float(), (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.float(), b.float(), atol=5e-2, rtol=5e-2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"), hidden=128)  # head dim 32 (flash kernels: >= 8, /8)


def test_packed_block_equals_documents_alone_with_varlen(model_dir):
    from transformers import AutoModelForCausalLM

    attention.register()
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=attention.VARLEN_NAME,
                                                 dtype=torch.bfloat16).to(CUDA).eval()
    lens, block = [5, 90, 33], 160
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(4, 256, (n,), generator=g) for n in lens]
    ids = torch.cat(docs + [torch.full((block - sum(lens),), 3)])[None].to(CUDA)
    segments = segment_lens(lens, block)
    positions = torch.cat([torch.arange(n) for n in segments])[None].to(CUDA)
    batch = collate([{"seq_lens": torch.tensor(segments, dtype=torch.int32), "position_ids": positions[0].cpu()}])
    choice = attention.AttentionChoice("varlen", attention.VARLEN_NAME, "")
    with torch.no_grad():
        packed = packed_forward(model, ids, positions, **attention.attention_inputs(batch, CUDA, choice))[0]
        start = 0
        for doc in docs:
            one = collate([{"seq_lens": torch.tensor([len(doc)], dtype=torch.int32), "position_ids": torch.zeros(len(doc))}])
            alone = packed_forward(model, doc[None].to(CUDA), torch.arange(len(doc))[None].to(CUDA),
                                   **attention.attention_inputs(one, CUDA, choice))[0]
            torch.testing.assert_close(packed[start:start + len(doc)].float(), alone.float(), atol=3e-2, rtol=3e-2)
            start += len(doc)


def test_fused_loss_matches_chunked_loss():
    kernel = fused_kernel("auto", CUDA)
    if kernel is None:
        pytest.skip("cut-cross-entropy is not installed (pip install 'packtrain[cuda]')")
    g = torch.Generator(device="cuda").manual_seed(0)
    head = torch.nn.Linear(256, 5000, bias=False, device=CUDA, dtype=torch.bfloat16).requires_grad_(False)
    hidden = torch.randn(2, 300, 256, device=CUDA, generator=g, dtype=torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, 5000, (2, 300), device=CUDA, generator=g)
    labels[:, :100] = -100
    fused = fused_loss_sum(kernel, head, hidden, labels)
    (fused_grad,) = torch.autograd.grad(fused, hidden)
    chunked = chunked_loss_sum(head, hidden, labels)
    (chunked_grad,) = torch.autograd.grad(chunked, hidden)
    torch.testing.assert_close(fused.float(), chunked.float(), rtol=1e-3, atol=1e-2)
    torch.testing.assert_close(fused_grad.float(), chunked_grad.float(), rtol=5e-2, atol=1e-3)


def _build(tmp_path, model_dir, block=256, n=24):
    write_build(tmp_path / "cache", "sql", random_blocks(n, block, 0), random_blocks(4, block, 1), block, model_dir,
                rows_per_shard=8)


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text()), json.loads((run_dir / "run.json").read_text())


@pytest.mark.parametrize("precision", [{"bf16": True}, {"bf16": False, "fp16": True}])
def test_run_on_cuda_uses_varlen_compile_and_fused_loss(tmp_path, model_dir, precision):
    _build(tmp_path, model_dir)
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=6, eval_steps=3, **precision), tmp_path / "cache")
    summary, info = _summary(run_dir)
    assert info["attention"] == "varlen" and info["torch_compile"] == "regional"  # auto on CUDA
    assert info["fused_loss"] is (fused_kernel("auto", CUDA) is not None)
    assert ("fp16 autocast with a GradScaler" in info["precision"]) == ("fp16" in precision)
    assert summary["steps"] == 6 and math.isfinite(summary["final_loss"]) and math.isfinite(summary["eval/loss"])


def test_varlen_run_matches_reference_attention_run(tmp_path, model_dir):
    """The same 4 steps with varlen and with the block-mask reference: same losses (bf16 tolerance)."""
    _build(tmp_path, model_dir)
    losses = {}
    for name, use_varlen in (("varlen", True), ("reference", False)):
        config = make_config(model_dir, tmp_path / "runs", max_steps=4, run_name=name, torch_compile=False)
        config.model.varlen_attention = use_varlen
        run_dir = run(config, tmp_path / "cache")
        assert _summary(run_dir)[1]["attention"] == ("varlen" if use_varlen else "sdpa")
        losses[name] = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                        if '"loss"' in line and "eval" not in line]
    assert len(losses["varlen"]) == 4
    for a, b in zip(losses["varlen"], losses["reference"]):
        assert abs(a - b) <= 2e-2 * abs(b)


def test_qlora_nf4_with_compile(tmp_path, model_dir):
    pytest.importorskip("bitsandbytes")
    _build(tmp_path, model_dir)
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=4, lora={"method": "qlora"}, torch_compile=True),
                  tmp_path / "cache")
    summary, info = _summary(run_dir)
    assert info["torch_compile"] is True and math.isfinite(summary["final_loss"])


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_training_after_evaluation_with_val_blocks(tmp_path, arch, method):
    """Eval at step 0, train, eval, train, eval: LoRA and QLoRA on the bundled model's architecture
    (Qwen2) and SmolLM2's (Llama), with val blocks (tests/test_train_after_eval.py is the CPU side)."""
    if method == "qlora":
        pytest.importorskip("bitsandbytes")
    model_dir = tiny_model_dir(tmp_path / "model", hidden=128, arch=arch)
    _build(tmp_path, model_dir)
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=4, eval_steps=2, lora={"method": method}),
                  tmp_path / "cache")
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "eval/loss" in r] == [0, 2, 4]
    assert [r["step"] for r in lines if "loss" in r] == [1, 2, 3, 4]
    assert all(math.isfinite(r.get("loss", r.get("eval/loss", math.nan))) for r in lines
               if "loss" in r or "eval/loss" in r)
    summary, _ = _summary(run_dir)
    assert math.isfinite(summary["eval/loss_before"]) and math.isfinite(summary["eval/loss_after"])


def test_resume_on_cuda_continues_the_same_run(tmp_path, model_dir):
    """10 steps straight vs the same run resumed from its step-5 checkpoint: the same data positions
    and losses at bf16 tolerance (flash attention's backward accumulates with atomics, so CUDA runs are
    not bitwise repeatable). A high learning rate makes the losses move, so a wrong position shows."""
    import shutil

    _build(tmp_path, model_dir)
    settings = dict(max_steps=10, save_steps=5, save_total_limit=2, learning_rate=3e-2)
    straight = run(make_config(model_dir, tmp_path / "a", run_name="r", **settings), tmp_path / "cache")
    copy = tmp_path / "b" / "sql" / "r"
    copy.mkdir(parents=True)
    for name in ("checkpoint-5", "config.json", "run.json", "metrics.jsonl"):
        (shutil.copytree if (straight / name).is_dir() else shutil.copy2)(straight / name, copy / name)
    resumed = run(make_config(model_dir, tmp_path / "b", **settings), tmp_path / "cache",
                  resume=str(copy / "checkpoint-5"))
    assert resumed == copy

    def losses(run_dir):
        return [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()
                if '"loss"' in x and "eval/" not in x]
    a, b = losses(straight), losses(resumed)
    assert len(a) == len(b) == 10 and max(a) - min(a) > 0.05  # the run does learn
    for x, y in zip(a[5:], b[5:]):
        assert abs(x - y) <= 3e-3 * abs(x)


def test_torchrun_nccl_one_process(tmp_path, model_dir):
    _build(tmp_path, model_dir)
    config = make_config(model_dir, tmp_path / "runs", max_steps=3, run_name="ddp")
    path = tmp_path / "sql.json"
    path.write_text(json.dumps(config.to_dict()))
    code = ("import json,sys; from packtrain.core.configfile import config_from_dict; from packtrain.trainer.run.train import run; "
            f"run(config_from_dict(json.load(open({str(path)!r}))), {str(tmp_path / 'cache')!r})")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", "--no-python",
                           sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary, info = _summary(tmp_path / "runs" / "sql" / "ddp")
    assert info["world_size"] == 1 and summary["steps"] == 3


def test_qwen2_5_0_5b_peak_memory_under_bound(tmp_path):
    """The real Qwen2.5-0.5B architecture (random init), LoRA r16 all-linear, auto micro-batch for a
    global batch of 16 blocks of 2048: peak allocated stays under 40 GiB (the issue's bound). The run's
    peak, not the search's: the eager trial of 16 blocks alone peaked at 44.47 GiB (H100, 2026-11-27),
    which the run reported as its own until the search reset the counter."""
    from transformers import Qwen2Config

    from trainer_fixtures import write_tokenizer

    directory = tmp_path / "qwen0.5b"
    Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768,
                rope_theta=1000000.0, rms_norm_eps=1e-6, eos_token_id=0, pad_token_id=3).save_pretrained(directory)
    write_tokenizer(directory, 256)
    write_build(tmp_path / "cache", "sql", random_blocks(32, 2048, 0, docs_per_block=(8, 20)),
                random_blocks(2, 2048, 1), 2048, directory, vocab_size=256)
    torch.cuda.reset_peak_memory_stats()
    run_dir = run(make_config(directory, tmp_path / "runs", max_steps=3, per_device_train_batch_size="auto",
                              global_batch_size=16, lora={"r": 16, "alpha": 32},
                              sample_prompts=0, task_eval=False),  # generation is not what this measures
                 tmp_path / "cache")
    summary, info = _summary(run_dir)
    assert summary["mem/peak_gib"] <= 40, summary
    assert info["global_batch_blocks"] == 16


def _losses(run_dir):
    return [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in x and "eval/" not in x]


def test_fp8_base_gives_the_bf16_losses_on_the_same_blocks(tmp_path, model_dir):
    """The same 6 steps (same blocks, same seed) with the base's linear layers in fp8 (torchao rowwise) and in
    bf16: every step's loss within 3% of bf16's. Tolerance: e4m3 keeps 3 mantissa bits (a relative rounding
    error up to 6.25% per element, scaled per row), which sums of hundreds of products average down to about
    1% of a logit; 3% leaves room for the steps to drift apart as the adapters learn."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 matmuls need compute capability >= 8.9")
    pytest.importorskip("torchao.float8")
    _build(tmp_path, model_dir)
    losses = {}
    for precision in ("bf16", "fp8"):
        config = make_config(model_dir, tmp_path / "runs", max_steps=6, run_name=precision, sample_prompts=0,
                             task_eval=False)
        config.model.base_precision = precision
        run_dir = run(config, tmp_path / "cache")
        assert _summary(run_dir)[1]["base_precision"] == precision
        losses[precision] = _losses(run_dir)
    assert len(losses["fp8"]) == 6
    for fp8, bf16 in zip(losses["fp8"], losses["bf16"]):
        assert abs(fp8 - bf16) <= 3e-2 * abs(bf16), losses


def test_regional_compile_gives_the_eager_losses(tmp_path, model_dir):
    """The same 4 steps eager and with each decoder layer compiled (inductor): the same losses (bf16 tolerance)."""
    _build(tmp_path, model_dir)
    losses = {}
    for mode in (False, "regional"):
        config = make_config(model_dir, tmp_path / "runs", max_steps=4, run_name=str(mode), torch_compile=mode,
                             sample_prompts=0, task_eval=False)
        run_dir = run(config, tmp_path / "cache")
        assert _summary(run_dir)[1]["torch_compile"] == mode
        losses[mode] = _losses(run_dir)
    for a, b in zip(losses["regional"], losses[False], strict=True):
        assert abs(a - b) <= 1e-2 * abs(b), losses


@pytest.mark.parametrize("fused_loss", [
    False,
    pytest.param("auto", marks=pytest.mark.xfail(
        strict=True, raises=RuntimeError,
        reason="cut-cross-entropy 25.1.1 finds its valid targets with nonzero (utils._build_flat_valids): one "
               "host sync per micro-batch inside the fused loss, even though packtrain passes supervised rows only"))])
def test_training_steps_sync_with_the_host_only_for_the_finiteness_check(tmp_path, model_dir, monkeypatch, fused_loss):
    """Steps 2..6 (after step 1's compile and one-time checks) run under ``set_sync_debug_mode("error")``
    from the forward to the end of the step: any host sync but the loop's finiteness check raises. The
    batches' attention boundaries and supervised positions come from the loader (trainer/data/data.py)."""
    from packtrain.trainer import loop

    if fused_loss == "auto" and fused_kernel("auto", CUDA) is None:
        pytest.skip("cut-cross-entropy is not installed")

    checked, errors_on = [], []
    forward_backward, finite_check, stop_or_save = loop.forward_backward, loop.finite_check, loop.stop_or_save

    def strict_forward_backward(ctx, *args):
        if ctx.state.step >= 1:  # step 2 on: the step runs in error mode from here
            torch.cuda.set_sync_debug_mode("error")
            errors_on.append(ctx.state.step + 1)
        return forward_backward(ctx, *args)

    def allowed_check(*args):
        torch.cuda.set_sync_debug_mode("default")
        try:
            checked.append(finite_check(*args))
        finally:
            torch.cuda.set_sync_debug_mode("error" if errors_on else "default")
        return checked[-1]

    def step_end(*args):  # after the step: logging, evaluation and saving may sync
        torch.cuda.set_sync_debug_mode("default")
        return stop_or_save(*args)

    monkeypatch.setattr(loop, "forward_backward", strict_forward_backward)
    monkeypatch.setattr(loop, "finite_check", allowed_check)
    monkeypatch.setattr(loop, "stop_or_save", step_end)
    _build(tmp_path, model_dir)
    try:
        run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=6, logging_steps=100, sample_prompts=0,
                                  task_eval=False, fused_loss=fused_loss), tmp_path / "cache")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    summary, info = _summary(run_dir)
    assert info["attention"] == "varlen" and summary["steps"] == 6
    assert errors_on == [2, 3, 4, 5, 6] and checked == [None] * 6

# Activation memory and the memory budget (issue 45): the CPU tests stand in for CUDA; these run the real thing.

@pytest.fixture
def uncapped():
    """The per-process memory cap outlives a run: every test that sets one leaves the process uncapped."""
    yield
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(1.0, CUDA)


def test_the_budget_caps_the_allocator_where_a_smaller_card_would_run_out(uncapped):
    from packtrain.trainer.model.memory import GIB, apply_budget

    budget = apply_budget(2, CUDA)
    assert budget.limit == pytest.approx(2 * GIB, rel=1e-3)
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(3 * GIB, dtype=torch.uint8, device=CUDA)  # fits the card, not the budget
    torch.empty(GIB, dtype=torch.uint8, device=CUDA)  # within it


def test_a_run_that_runs_out_of_its_budget_ends_in_one_line(tmp_path, model_dir, uncapped):
    from packtrain.trainer.run.run_checks import TrainError

    _build(tmp_path, model_dir)
    with pytest.raises(TrainError) as err:  # 1 MiB: not even the model loads
        run(make_config(model_dir, tmp_path / "runs", max_steps=2, max_memory_gib=2**-10), tmp_path / "cache")
    assert str(err.value).startswith("out of memory within the budget 0.0 GiB (train.max_memory_gib, of the GPU's ")
    assert "\n" not in str(err.value)


def test_offloaded_checkpointing_on_cuda_gives_the_same_loss_and_gradients(model_dir):
    from transformers import AutoModelForCausalLM

    from packtrain.core.config_train import LoraConfig
    from packtrain.trainer.model.activations import checkpointed_layers
    from packtrain.trainer.model.adapters import attach_adapters
    from packtrain.trainer.step import packed_loss_sum

    def loss_and_grads(checkpointing):
        base = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32).to(CUDA)
        base.config.use_cache = False
        model = attach_adapters(base, LoraConfig(r=4, alpha=8), checkpointing).train()
        torch.manual_seed(1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1)
        ids = torch.randint(3, 200, (2, 64), generator=torch.Generator().manual_seed(0)).to(CUDA)
        positions = torch.cat([torch.arange(20), torch.arange(44)]).repeat(2, 1).to(CUDA)
        loss = packed_loss_sum(model, ids, positions, ids.clone())
        loss.backward()
        return loss.item(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}, checkpointed_layers(model)

    reference_loss, reference, _ = loss_and_grads(False)
    loss, grads, layers = loss_and_grads("offload")
    assert layers == [0, 1] and loss == pytest.approx(reference_loss, rel=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference[name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("checkpointing", ["offload", 2])
def test_compiled_runs_with_selective_and_offloaded_checkpointing(tmp_path, model_dir, checkpointing):
    _build(tmp_path, model_dir)
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=3, gradient_checkpointing=checkpointing,
                              sample_prompts=0, task_eval=False), tmp_path / "cache")
    summary, info = _summary(run_dir)
    assert info["torch_compile"] is True and info["gradient_checkpointing"] == checkpointing
    assert summary["steps"] == 3 and math.isfinite(summary["final_loss"])


def test_auto_chooses_micro_batch_and_checkpointing_within_a_budget_and_logs_the_table(tmp_path, model_dir, uncapped):
    _build(tmp_path, model_dir)
    run_dir = run(make_config(model_dir, tmp_path / "runs", max_steps=2, per_device_train_batch_size="auto",
                              global_batch_size=8, max_memory_gib=4, sample_prompts=0, task_eval=False),
                  tmp_path / "cache")
    _, info = _summary(run_dir)
    log = (run_dir / "train.log").read_text()
    assert "micro-batch auto:   micro  checkpointing  peak GiB" in log and "<- chosen" in log
    assert "budget 4.0 GiB (train.max_memory_gib, of the GPU's" in log
    assert info["gradient_checkpointing"] is False  # a tiny model: every candidate fits without recompute
