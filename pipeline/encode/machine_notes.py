"""The machine's store of fast-encoder decisions: the answer of a proof made by any build on this
machine, so a first build in a new cache directory (a CI job, a cron host, a new project) does not
prove the encoder again (the probe and the decision's HF encode: 3.5-4 CPU s of a 200k-row first
build with Qwen3's tokenizer).

A decision is about the tokenizer.json content and the versions of what makes the ids
(pipeline/encode/fast/encoder_decision.py ``note_about``), not about a cache directory, so it is kept,
besides the cache's own note (``<cache>/.fast-encoder/``), in :func:`store_dir`:
``PACKTRAIN_PROOFS_DIR`` where set (``off``: no store), else ``<packtrain models directory>/.fast-encoder``
(``PACKTRAIN_MODELS_DIR``, else ``~/.cache/packtrain/models``: packtrain/core/resolve.py). The notes
there are the cache's notes (pipeline/encode/notes.py: named by what they are about, sealed, written
atomically under a name unique to the writer, so two builds at once each write a whole note and the
last rename wins; both are the same answer). A store that cannot be read is no store; one that
cannot be written is used read-only, said in one line, never a failure. The store decides nothing
about a build's bytes: the per-build exactness check compares a sample of what the encoder made in
every build, and a refusal in the store or in the cache wins over any yes. The tokenizer facts planning
needs are kept there too, in ``.tokenizer-facts/`` (pipeline/encode/tokenizer_facts.py ``machine_facts``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from packtrain.core.files import TMP_PREFIX, writer_alive

STORE_VARIABLE = "PACKTRAIN_PROOFS_DIR"
OFF = "off"
NOTES = ".fast-encoder"  # under the models directory, as under a cache directory


def machine_store(variable: str, name: str) -> Path | None:
    """A store of this machine's (read at call time): where the environment variable ``variable`` points,
    else ``name`` under the models directory; None where the variable is ``off``."""
    value = os.environ.get(variable, "").strip()
    if value.lower() == OFF:
        return None
    # here, not at the top: the decision's child imports this module, and resolve imports huggingface_hub
    from packtrain.core.resolve import cache_path, models_cache_dir

    return cache_path(value) if value else models_cache_dir() / name


def store_dir() -> Path | None:
    """Where this machine's fast-encoder decisions are remembered, or None where ``PACKTRAIN_PROOFS_DIR``
    is ``off``."""
    return machine_store(STORE_VARIABLE, NOTES)


def unwritable(directory: Path, error: OSError) -> str:
    """The one line a build says where the store cannot be written."""
    return (f"fast encoder: this machine's store of proofs {directory} cannot be written ({error.strerror or error}): "
            f"used read-only; set {STORE_VARIABLE} to a writable directory, or to {OFF}")


def remove_dead_writers(directory: Path) -> None:
    """Remove the temporary notes that writers killed mid-write left in the store (a build removes its
    cache's under the expert's lock, pipeline/orchestrate/build.py ``remove_leftovers``; no lock covers the store,
    so the writer's process is asked): quietly, a store that cannot be changed is used as it is."""
    with contextlib.suppress(OSError):
        for note in directory.glob(f"{TMP_PREFIX}*"):
            if not writer_alive(note):
                with contextlib.suppress(OSError):
                    note.unlink()
