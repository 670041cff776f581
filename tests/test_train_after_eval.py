"""Training after evaluation, and evaluation after training, with val blocks: LoRA and QLoRA on the
bundled model's architecture (Qwen2, biases in q/k/v) and SmolLM2's (Llama, no bias), on a CPU with
AVX512-BF16 exactly as on one without.

On such a CPU bitsandbytes repacked every 4-bit weight into an inference-only layout during the
step-0 evaluation and never back: the first training step then crashed in ``matmul_4bit``
(``result += bias``) or, without a bias, computed wrong numbers. The CPU is simulated by making
bitsandbytes' ``has_avx512bf16`` say yes; its repacking itself is plain torch and runs anywhere.
"""

from __future__ import annotations

import json

import pytest

import packtrain.trainer.run.context as context_module
from packtrain.trainer.run.train import run
from trainer_fixtures import RUN_END, make_config, random_blocks, tiny_model_dir, write_build


def losses(run_dir) -> list[tuple]:
    """(step, train loss or None, eval loss or None) of every line of the run's metrics."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("loss"), r.get("eval/loss")) for r in lines if "loss" in r or "eval/loss" in r]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_training_after_evaluation_on_a_cpu_with_avx512_bf16(tmp_path, monkeypatch, arch, method):
    bnb_modules = pytest.importorskip("bitsandbytes.nn.modules")
    model_dir = tiny_model_dir(tmp_path / "model", arch=arch)
    write_build(tmp_path / "cache", "sql", random_blocks(8, 32, 0), random_blocks(2, 32, 1), 32, model_dir)

    def train(name: str) -> list[tuple]:
        config = make_config(model_dir, tmp_path / "runs", max_steps=4, eval_steps=2, run_name=name,
                             lora={"method": method}, **RUN_END)
        return losses(run(config, tmp_path / "cache"))

    without = train("without")
    loaded = []
    real_load = context_module.load_base_model
    monkeypatch.setattr(context_module, "load_base_model", lambda *a, **k: loaded.append(real_load(*a, **k))
                        or loaded[-1])
    monkeypatch.setattr(bnb_modules, "has_avx512bf16", lambda: True)  # read by every Linear4bit created
    with_bf16 = train("with")

    # eval at step 0, train, eval at 2, train, eval at 4: every number the same as on the other CPU
    assert [(step, train_loss is not None, eval_loss is not None) for step, train_loss, eval_loss in with_bf16] == [
        (0, False, True), (1, True, False), (2, True, False), (2, False, True), (3, True, False), (4, True, False),
        (4, False, True)]
    assert with_bf16 == without
    layers = [m for m in loaded[0].modules() if isinstance(m, bnb_modules.Linear4bit)]
    assert len(layers) == (14 if method == "qlora" else 0)  # 7 per layer, lm_head stays full precision
    assert not [m for m in layers if getattr(m.weight.quant_state, "packing_format_for_cpu", False)]
