"""packtrain builds for any trainer: a build as a ``datasets.Dataset`` (:func:`load_build`) and the
collator that keeps its documents apart in HF Trainer and TRL (:class:`PackedCollator`). Recipes for
HF Trainer, TRL's SFTTrainer and Unsloth: docs/INTEROP.md.

It reads the build contract (packtrain/core/contract.py, shardfile.py, blocks.py) and never imports
packtrain's trainer or pipeline (pyproject.toml's import-linter contracts)."""

from packtrain.hf.collator import PackedCollator
from packtrain.hf.dataset import InteropError, load_build

__all__ = ["InteropError", "PackedCollator", "load_build"]
