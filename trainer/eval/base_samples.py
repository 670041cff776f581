"""The base model's end-of-run sample answers, kept in the build directory and reused by the next run.

Every run of a build ends with the base model's and the adapter's answers to the same few validation
prompts (trainer/eval/task_eval.py ``show_samples``). The base model's answers are greedy from the same
frozen weights to the same prompt tokens with the same settings: they are the same every time, and on a
CPU they cost as much as the adapter's (docs/BENCHMARKS.md, "A 5-step try on Spider"). So the first run
writes them into ``<build>/samples/base-<key>.json`` (a derived file beside ``<build>/plots/``; the shards
and the manifest are untouched) and a later run whose key matches reads them, saying so.

The key hashes everything the answers depend on: the base model (its directory, the size and mtime of
its weight and config files, the ``model:`` config: quantization and all), the precision and attention
it generates with, the device type, the torch, transformers and peft versions, the prompt tokens, the
new-token bound and the batch size. Anything else changed gives another key, so the answers are
generated again. A file that cannot be read or written is said in one line; the answers are then
generated (or not kept).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, is_dataclass
from pathlib import Path

from packtrain.core.errors import PacktrainError
from packtrain.core.files import write_atomic

log = logging.getLogger("packtrain.train")

SAMPLES_DIR = "samples"
FORMAT = 1


def model_files(directory: Path) -> list[tuple[str, int, int]]:
    """(name, size, mtime_ns) of the model directory's weight and config files: a changed file changes it."""
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in {".safetensors", ".bin", ".json",
                                                                                   ".gguf"})
    return [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def samples_key(identity: dict, prompts: list[list[int]], max_new_tokens: int, batch_size: int) -> str:
    """The hash naming one set of base-model answers::

        >>> a = samples_key({"model": "m"}, [[1, 2]], 32, 3)
        >>> a == samples_key({"model": "m"}, [[1, 2]], 32, 3), a == samples_key({"model": "m"}, [[1, 3]], 32, 3)
        (True, False)
        >>> a == samples_key({"model": "m"}, [[1, 2]], 16, 3), len(a)
        (False, 16)
    """
    text = json.dumps({"format": FORMAT, "identity": identity, "prompts": prompts, "max_new_tokens": max_new_tokens,
                       "batch_size": batch_size}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def base_identity(ctx) -> dict:
    """What the base model's answers depend on besides the prompts and the generation settings."""
    import peft
    import torch
    import transformers

    model = ctx.config.model
    return {"model_dir": str(ctx.source.directory), "files": model_files(ctx.source.directory),
            "model": asdict(model) if is_dataclass(model) else repr(model),
            "precision": repr(ctx.precision), "base_precision": getattr(ctx.base_precision, "name", None),
            "attention": ctx.attention.implementation, "device": ctx.device.type,
            "versions": [torch.__version__, transformers.__version__, peft.__version__]}


def samples_path(build_dir: Path, key: str) -> Path:
    return build_dir / SAMPLES_DIR / f"base-{key}.json"


def load_base_answers(build_dir: Path, key: str, count: int) -> list[str] | None:
    """The answers kept under ``key`` (None: none kept, or unreadable: said)."""
    path = samples_path(build_dir, key)
    if not path.is_file():
        return None
    try:
        answers = json.loads(path.read_text())["answers"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.info("samples, base model: %s unreadable (%s): generating them again", path, e)
        return None
    if not (isinstance(answers, list) and len(answers) == count and all(isinstance(a, str) for a in answers)):
        log.info("samples, base model: %s holds no %d answers: generating them again", path, count)
        return None
    return answers


def keep_base_answers(build_dir: Path, key: str, answers: list[str]) -> None:
    """Write the answers under ``key`` for the next run; a build directory that cannot take them is said."""
    path = samples_path(build_dir, key)
    try:
        path.parent.mkdir(exist_ok=True)
        write_atomic(path, json.dumps({"format": FORMAT, "answers": answers}) + "\n",
                     f"the base model's samples {path.name}", "free space (they are generated again otherwise)")
    except (OSError, PacktrainError) as e:
        log.info("samples, base model: not kept for the next run (%s)", e)
