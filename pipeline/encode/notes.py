"""Small JSON notes the build remembers in its cache, each keyed by what it was computed from (a
tokenizer's content hash and library versions): the fast-encoder decision (encoder_decision.py) and
the tokenizer's facts (tokenizer_facts.remembered). Read when valid; else computed again and written
atomically, so a damaged or half-written note is never trusted."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable


def read_note(path: Path, valid: Callable[[object], bool]) -> dict | None:
    """The note at ``path`` when it exists and ``valid`` accepts it, else None."""
    try:
        note = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # not computed yet, or damaged: compute again
    return note if valid(note) else None


def write_note(path: Path, note: dict) -> None:
    """Write ``note`` at ``path`` atomically (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(note, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def remembered_note(path: Path, valid: Callable[[object], bool], compute: Callable[[], dict]) -> dict:
    """The note at ``path`` when ``valid`` accepts it, else ``compute()``, written there first."""
    note = read_note(path, valid)
    if note is None:
        note = compute()
        write_note(path, note)
    return note
