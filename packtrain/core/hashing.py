"""Content hashes: of a file (by its bytes) and of a JSON value (in canonical form). The build id,
the manifest's shard checksums, the tokenizer fingerprint and the stat cache all hash through here."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(chunk):
            h.update(data)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    """Hash of a JSON value in canonical form (sorted keys, no whitespace)."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
