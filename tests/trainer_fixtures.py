"""Hermetic fixtures for the trainer tests: a tiny Qwen2 model directory and hand-written builds.

``write_build`` writes what the build writes (the core's ShardWriter, Arrow IPC stream,
manifest.json, CURRENT), from token lists given by the test, so the trainer tests need neither
the pipeline nor any dataset.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from packtrain.core.configfile import config_from_dict
from packtrain.core.contract import FORMAT_VERSION, MANIFEST, expert_dir, token_dtype, write_current
from packtrain.core.tokenizer_files import tokenizer_fingerprint
from packtrain.core.shardfile import ShardWriter

# One intra-op thread: on a small shared CPU box, OpenMP threads spin-waiting for a busy core make a
# tiny model's step up to 80x slower; the tests' numerics (bitwise resume) do not depend on it.
torch.set_num_threads(1)

VOCAB = 256
EOS_ID, PAD_ID = 0, 3

Doc = tuple[Sequence[int], int]
"""(tokens, prompt length): the first ``prompt length`` tokens are not supervised."""


def write_tokenizer(directory: Path, vocab_size: int = VOCAB, extra: str = "") -> Path:
    """A word-level tokenizer.json + tokenizer_config.json (eos id 0, pad id 3). ``extra`` changes
    the config's content (and so the tokenizer fingerprint) without changing the vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<|endoftext|>": 0, "<unk>": 1, "<s>": 2, "<|pad|>": 3}
    vocab.update({f"w{i}": i for i in range(4, vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "pad_token": "<|pad|>", "model_max_length": 4096, "note": extra}))
    return directory


def tiny_model_dir(directory: Path, vocab_size: int = VOCAB, weights: bool = True, seed: int = 0,
                   hidden: int = 64, layers: int = 2, arch: str = "qwen2") -> Path:
    """A tiny Qwen2 (hidden 64, 2 layers, 4 heads, 2 kv heads) with its tokenizer; random weights
    saved as safetensors when ``weights``, else config.json only (random init at train time).
    ``arch="llama"``: the same sizes as a Llama, SmolLM2's architecture (no bias in any linear layer;
    Qwen2, the bundled model's, has biases in q/k/v)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    config = {"qwen2": Qwen2Config, "llama": LlamaConfig}[arch](
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, tie_word_embeddings=True,
        eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    directory.mkdir(parents=True, exist_ok=True)
    if weights:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
        with torch.no_grad():  # unit-scale embeddings: the frozen tied head can then express confident
            model.get_input_embeddings().weight.normal_(0.0, 0.15)  # predictions (0.02 caps logits near 1)
        model.save_pretrained(directory)
    else:
        config.save_pretrained(directory)
    write_tokenizer(directory, vocab_size)
    return directory


def pack_docs(docs: Sequence[Doc], block_size: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """One block: the documents back to back, then padding (pad id, mask 0)."""
    ids = np.full(block_size, PAD_ID, dtype=np.int64)
    mask = np.zeros(block_size, dtype=np.uint8)
    at = 0
    for tokens, prompt in docs:
        n = len(tokens)
        assert at + n <= block_size, "documents overflow the block"
        ids[at:at + n] = tokens
        mask[at + prompt:at + n] = 1
        at += n
    return ids, mask, [len(t) for t, _ in docs]


def random_blocks(n_blocks: int, block_size: int, seed: int, vocab_size: int = VOCAB,
                  docs_per_block: tuple[int, int] = (1, 4)) -> list[list[Doc]]:
    """Blocks of random documents with random prompt lengths and some padding at the end."""
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(n_blocks):
        k = int(rng.integers(docs_per_block[0], docs_per_block[1] + 1))
        room = block_size - int(rng.integers(0, block_size // 4))
        cuts = np.sort(rng.choice(np.arange(1, room), size=k - 1, replace=False)) if k > 1 else np.array([], int)
        lengths = np.diff(np.concatenate([[0], cuts, [room]])).tolist()
        docs = []
        for n in lengths:
            tokens = rng.integers(4, vocab_size, size=n).tolist()
            tokens[-1] = EOS_ID
            docs.append((tokens, int(rng.integers(1, n)) if n > 1 else 1))
        blocks.append(docs)
    return blocks


def write_build(cache_dir: Path, expert: str, train: list[list[Doc]], val: list[list[Doc]], block_size: int,
                tokenizer_dir: Path, vocab_size: int = VOCAB, rows_per_shard: int = 1 << 30,
                rows_per_batch: int = 3, salt: str = "", current: bool = True) -> str:
    """Write ``cache_dir/<expert>/<build-id>/`` (shards + manifest) and point CURRENT at it."""
    dtype = token_dtype(vocab_size)
    fingerprint = tokenizer_fingerprint(tokenizer_dir)
    content = json.dumps([train, val, block_size, fingerprint["hash"], salt], default=int)
    build_id = hashlib.sha256(content.encode()).hexdigest()[:16]
    build_dir = expert_dir(cache_dir, expert) / build_id
    build_dir.mkdir(parents=True, exist_ok=True)
    shards = {}
    for split, blocks in (("train", train), ("val", val)):
        writer = ShardWriter(build_dir, split, block_size, dtype, 0, rows_per_shard, rows_per_batch)
        for docs in blocks:
            writer.add(*pack_docs(docs, block_size))
        shards[split] = writer.close()
    manifest = {
        "format_version": FORMAT_VERSION,
        "build_id": build_id,
        "expert": expert,
        "inputs": {
            "sources": [{"kind": "test", "name": "hand-written"}],
            "tokenizer": {"source": str(tokenizer_dir), "hash": fingerprint["hash"], "files": fingerprint["files"],
                          "vocab_size": vocab_size, "eos_id": EOS_ID, "pad_id": PAD_ID},
            "format": {"style": "template"},
            "pack": {"block_size": block_size, "strategy": "bfd", "overlong": "split", "val_fraction": 0.1},
        },
        "outputs": {"token_dtype": str(np.dtype(dtype)), "shards": shards,
                    "totals": {"blocks": {"train": len(train), "val": len(val)}}},
    }
    (build_dir / MANIFEST).write_text(json.dumps(manifest, indent=2))
    if current:
        write_current(cache_dir, expert, build_id)
    return build_id


# The end of a run as the typed defaults make it (the base model's and the adapter's answers to 3
# validation prompts, then the PNG plots): what the tests about that end pass to make_config
# (tests/test_plots.py, test_task_eval.py, test_attention.py, test_train_after_eval.py,
# test_reliability_disk_full.py, test_security.py's offline run, every CUDA test of test_gpu.py).
# The others end without them: on the tiny model they cost a run ~0.7 s of CPU, more than its
# steps (measured 2026-12-06).
RUN_END = dict(sample_prompts=3, plots=True)


def make_config(model_dir: Path, output_dir: Path, expert: str = "sql", lora: dict | None = None, **train):
    """An ExpertConfig for the tiny model with test-friendly training defaults (overridable): no
    samples and no plots at the end unless asked for (:data:`RUN_END`)."""
    defaults = dict(max_steps=4, per_device_train_batch_size=2, per_device_eval_batch_size=4,
                    learning_rate=1e-3, warmup_steps=0, warmup_ratio=0.0, dataloader_num_workers=0,
                    dataloader_persistent_workers=False, eval_steps=1000, save_steps=1000, logging_steps=1,
                    sample_prompts=0, plots=False, output_dir=str(output_dir))
    defaults.update(train)
    return config_from_dict({
        "expert": expert,
        "sources": [{"name": "bundled"}],
        "model": {"name": str(model_dir)},
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, **(lora or {})},
        "train": defaults,
    })
