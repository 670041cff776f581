"""The ``unsloth`` contender of bench/train_bench.py: Unsloth's ``FastLanguageModel`` (its patched Qwen2
forward, attention and fused loss, and its ``get_peft_model``) on the same model, LoRA (r 16, alpha 32,
dropout 0, the seven projections: the "all-linear" set packtrain adapts), the same packed blocks and
the same micro-batch, trained by ``transformers.Trainer`` (which ``import unsloth`` patches: the
training step Unsloth's own ``UnslothTrainer`` runs). QLoRA: ``load_in_4bit``.

Unsloth loads weights, never a bare config, so the random-init model (the same architecture every
contender trains) is saved once in the bench's work directory (``model-ARCH-weights/``: 1 GB for 0.5B,
15 GB for 7B on the GPU machine's disk). Each micro-batch of B blocks of 2048 is given as one row
of B x 2048 tokens (TRL's padding-free layout, the one Unsloth packs to) with ``position_ids`` that
restart per document and ``packed_seq_lengths``, the document lengths Unsloth's attention reads to keep
documents apart (unsloth/utils/packing.py): the same attention as packtrain's varlen blocks.

Installed only on a machine that can carry its wheels (``make unsloth-wheel``, docs/BENCHMARKS.md); the
bench reports a 'skipped' row elsewhere. ``import unsloth`` must come before transformers and peft:
:func:`train_bench.run_one` imports this module first for this contender.
"""

from __future__ import annotations

from pathlib import Path

from bench.train_bench_setup import block_size

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def save_random_weights(model: Path, work: Path, seed: int, device) -> Path:
    """The random-init model of ``model`` (config.json + tokenizer) saved with weights in the bench's
    work directory, once; returns that directory. Written beside and renamed into place, so a killed
    contender leaves no half a model."""
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    target = work / f"{model.name}-weights"
    if (target / "config.json").is_file():
        return target
    scratch = target.with_name(target.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    torch.manual_seed(seed)
    with torch.device(device):
        base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model), dtype=torch.bfloat16)
    base.save_pretrained(scratch)
    del base
    for f in model.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copy2(f, scratch / f.name)
    scratch.rename(target)
    return target


def load_unsloth(args, config, model: Path, work: Path, device):
    """Unsloth's model with its LoRA, as its notebooks build it; (model, a note on the precision)."""
    import torch
    import unsloth  # noqa: F401  (first: it patches transformers, peft and trl on import)
    from unsloth import FastLanguageModel

    qlora = config.lora.method == "qlora"
    checkpointing = "unsloth" if args.gradient_checkpointing else False  # "unsloth": its offloaded checkpointing
    source = save_random_weights(model, work, config.train.seed, device)
    # a local directory, and HF_HUB_OFFLINE=1 (train_bench.run_one): nothing is fetched
    base, _ = FastLanguageModel.from_pretrained(model_name=str(source), max_seq_length=args.batch_size * block_size(args),
                                                dtype=torch.bfloat16, load_in_4bit=qlora,
                                                use_gradient_checkpointing=checkpointing)
    peft_model = FastLanguageModel.get_peft_model(
        base, r=config.lora.r, lora_alpha=config.lora.alpha, lora_dropout=0.0, target_modules=LORA_TARGETS,
        bias="none", use_gradient_checkpointing=checkpointing, random_state=config.train.seed)
    return peft_model, f"bf16{' + 4-bit NF4 base' if qlora else ''} (Unsloth)"


def collate_packed(items: list[dict]) -> dict:
    """B blocks as one row of B x T tokens, with the document lengths Unsloth's attention keeps apart.
    Two blocks of 4 holding documents [3, 1] and [4]::

        position_ids        [[0, 1, 2, 0, 0, 1, 2, 3]]
        packed_seq_lengths  [3, 1, 4]
    """
    import torch

    row = {k: torch.cat([item[k] for item in items]).unsqueeze(0) for k in ("input_ids", "labels", "position_ids")}
    row["packed_seq_lengths"] = torch.cat([item["seq_lens"] for item in items]).to(torch.int32)
    return row


UNSLOTH_KEYS = ("input_ids", "labels", "position_ids", "seq_lens")
"""What the Unsloth contender takes of each block (:func:`collate_packed` reads the segment lengths):
``train_bench_setup.PackedBlocks(build_dir, UNSLOTH_KEYS)``."""
