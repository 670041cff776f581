"""``packtrain discover``'s models outside the HF caches: the embedded models packtrain converted into
its models cache (``PACKTRAIN_MODELS_DIR``, packtrain/core/resolve.py), and the local model
directories named with ``--model DIR``, each with what it lacks to be used as ``model.name``."""

from __future__ import annotations

import json
from pathlib import Path

from packtrain.core.resolve import CONVERTED_MARK, missing_converted_files, models_cache_dir

MODEL_FILES = ("config.json", "tokenizer.json")  # what a model directory needs (the build: tokenizer.json)


def converted_models() -> list[dict]:
    """One item per directory of the models cache: ``model`` (its name, e.g. smollm2-135m, and the GGUF
    it came from), ``incomplete`` (a conversion killed mid-way) or ``damaged``."""
    root = models_cache_dir()
    folders = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")) if root.is_dir() else []
    items = []
    for folder in folders:
        item = {"where": "packtrain", "type": "model", "id": folder.name, "size": _size(folder), "path": str(folder)}
        missing = missing_converted_files(folder)
        if missing:
            item.update(type="incomplete", detail=f"no {', '.join(missing)}: `packtrain prepare-model EXPERT` "
                                                  "converts it again")
        else:
            try:
                mark = json.loads((folder / CONVERTED_MARK).read_text(encoding="utf-8"))
                item.update(id=str(mark["model"]), detail=f"converted from {mark['gguf']}")
            except (OSError, ValueError, KeyError, TypeError):
                item.update(type="damaged", detail=f"{CONVERTED_MARK} unreadable: delete the directory, then "
                                                   "`packtrain prepare-model EXPERT`")
        items.append(item)
    return items


def local_model(directory: Path) -> dict:
    """``directory`` (``--model DIR``) as an item: ``model`` when it holds config.json and tokenizer.json."""
    missing = [name for name in MODEL_FILES if not (directory / name).is_file()]
    return {"where": "local", "type": "incomplete" if missing else "model", "id": str(directory),
            "detail": f"no {', '.join(missing)}: not usable as model.name" if missing else "--model " + str(directory),
            "size": _size(directory), "path": str(directory.resolve())}


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
