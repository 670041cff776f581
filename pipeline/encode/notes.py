"""Small JSON notes the build remembers in its cache, each about what it was computed from (a
tokenizer's content hash and library versions, a chat template): the fast-encoder decision
(encoder_decision.py), the tokenizer's facts (tokenizer_facts.remembered) and the shortcuts'
refusals (exactness.Refusals).

A note is named by a hash of what it is about (:func:`note_file`) and sealed with it: it holds
``about`` and a ``seal``, the sha256 of ``about`` and its answer. One edited by hand, copied from
another tokenizer's name or another cache, damaged or half-written is not trusted: read as absent,
so the answer is computed again (and written atomically) before it can change a byte.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

from packtrain.core.files import write_atomic


def note_file(directory: str | Path, about: str) -> Path:
    """Where the note about ``about`` lives in ``directory``."""
    return Path(directory) / f"{hashlib.sha256(about.encode()).hexdigest()[:16]}.json"


def seal(answer: dict, about: str) -> str:
    return hashlib.sha256(json.dumps([about, answer], sort_keys=True).encode()).hexdigest()


def read_note(path: Path, about: str, valid: Callable[[object], bool]) -> dict | None:
    """The answer in the note at ``path`` when it exists, is sealed about ``about`` and ``valid``
    accepts it, else None."""
    try:
        note = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # not computed yet, or damaged: compute again
    if not isinstance(note, dict) or note.get("about") != about or not isinstance(note.get("answer"), dict):
        return None  # another format, or about something else
    answer = note["answer"]
    return answer if note.get("seal") == seal(answer, about) and valid(answer) else None


def write_note(path: Path, about: str, answer: dict) -> None:
    """Write ``answer`` about ``about`` at ``path``, sealed, atomically (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"about": about, "answer": answer, "seal": seal(answer, about)}, sort_keys=True))


def remembered_note(path: Path, about: str, valid: Callable[[object], bool], compute: Callable[[], dict]) -> dict:
    """The answer in the note at ``path`` when it is sealed about ``about`` and ``valid`` accepts it,
    else ``compute()``, written there first."""
    answer = read_note(path, about, valid)
    if answer is None:
        answer = compute()
        write_note(path, about, answer)
    return answer
