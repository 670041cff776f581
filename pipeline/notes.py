"""Small JSON notes the build remembers in its cache, each keyed by what it was computed from (a
tokenizer's content hash and library versions): the fast-encoder decision (bpe_fast.choose) and the
tokenizer's facts (tokenizer_facts.remembered). Read when valid; else computed again and written
atomically, so a damaged or half-written note is never trusted."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable


def remembered_note(path: Path, valid: Callable[[object], bool], compute: Callable[[], dict]) -> dict:
    """The note at ``path`` when ``valid`` accepts it, else ``compute()``, written there first."""
    try:
        note = json.loads(path.read_text(encoding="utf-8"))
        if valid(note):
            return note
    except (OSError, ValueError):
        pass  # not computed yet, or damaged: compute again
    note = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(note, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
    return note
