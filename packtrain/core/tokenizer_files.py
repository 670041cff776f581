"""The files that define a tokenizer's behaviour and its fingerprint, the content hash of those files:
computed the same way by the build (stored in the manifest, packtrain/core/contract.py) and by the
trainer, so the trainer can refuse shards made with another tokenizer and say which files differ."""

from __future__ import annotations

import os
from pathlib import Path

from packtrain.core.errors import ContractError
from packtrain.core.hashing import sha256_file, sha256_json

# the named chat template transformers renders a call with tools by, where save_pretrained writes it
TOOL_CHAT_TEMPLATE = "additional_chat_templates/tool_use.jinja"
# Files that define a tokenizer's behaviour. Whatever of these exists is hashed, by content.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    TOOL_CHAT_TEMPLATE,
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def tokenizer_fingerprint(directory: str | os.PathLike, sha256=sha256_file) -> dict:
    """Content hash of every tokenizer file in ``directory`` (vocab, merges, specials, chat template).

    The build stores this in the manifest; the trainer computes it for the model's tokenizer and
    refuses shards whose hash differs. ``sha256``: a cached hasher (packtrain.pipeline.hashcache.StatCache.sha256).
    """
    directory = Path(directory)
    files = {}
    for name in TOKENIZER_FILES:
        path = directory / name
        if path.is_file():
            files[name] = sha256(path)
    if "tokenizer.json" not in files:
        raise ContractError(
            f"no tokenizer.json in {directory}: packtrain needs a fast (Rust) tokenizer file; "
            "save one with `AutoTokenizer.from_pretrained(...).save_pretrained(dir)`"
        )
    return {"hash": sha256_json(files), "files": files}


def tokenizer_differences(built: dict, other: dict, other_name: str = "model") -> list[str]:
    """The files in which two tokenizer fingerprints' ``files`` differ, as the refusals name them:
    ``tokenizer.json (build 1a2b3c4d5e6f, model 6f5e4d3c2b1a)``, ``merges.txt (only in the model's tokenizer)``."""
    diffs = []
    for name in sorted(set(built) | set(other)):
        if name not in other:
            diffs.append(f"{name} (only in the build's tokenizer)")
        elif name not in built:
            diffs.append(f"{name} (only in the {other_name}'s tokenizer)")
        elif built[name] != other[name]:
            diffs.append(f"{name} (build {built[name][:12]}, {other_name} {other[name][:12]})")
    return diffs
