"""A stat cache for content hashes: a file is re-hashed only when its stat changed.

Deciding whether an expert's inputs changed must be cheap enough to run from cron every few
minutes, so the sha256 of each source file is remembered under its stat key
``(size, mtime_ns, ctime_ns, inode)``. A file whose key is unchanged is taken to be unchanged;
any write (or ``touch``) changes ``ctime``, so the file is hashed again, and the build id still
depends only on the content.

One JSON file per expert (``cache/<expert>/.stat-cache.json``), replaced atomically:
``{"entries": {path: [size, mtime_ns, ctime_ns, inode, sha256]}, "sha256": <sha256 of entries>}``.
It is only a cache, checked before use: a damaged one (not JSON, another shape, entries that do not
match their sha256) is dropped, said once in ``problem``, and rebuilt by hashing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from packtrain.core.contract import BUILD_DISK_FULL_FIX
from packtrain.core.files import write_atomic
from packtrain.core.hashing import sha256_file, sha256_json
from packtrain.core.errors import ContractError
from packtrain.core.inputs import read_json
from packtrain.core.schema import SHA256, Is, MapOf, TEXT

STAT_CACHE = ".stat-cache.json"
ENTRY = Is("[size, mtime_ns, ctime_ns, inode, sha256]",
           lambda v: isinstance(v, list) and len(v) == 5 and all(type(x) is int for x in v[:4])
           and SHA256.ok(v[4]))
SCHEMA = {"entries": MapOf(TEXT, ENTRY), "sha256": SHA256}


class StatCache:
    def __init__(self, path: Path | None):
        self.path = path
        self.entries: dict[str, list] = {}
        self.hashed: list[str] = []  # files whose content was read this time
        self.seen: dict[str, list] = {}  # every file asked about, as named: [*stat key, sha256] it had then
        self._dirty = False
        self.problem: str | None = None  # why a damaged cache was dropped (the caller says it once)
        if path is not None and path.exists():
            try:
                data = read_json(path, "every source file is hashed again and the cache rewritten", schema=SCHEMA)
                if sha256_json(data["entries"]) != data["sha256"]:
                    raise ContractError(f"{path} is damaged (its entries differ from their sha256); every source "
                                        "file is hashed again and the cache rewritten")
                self.entries = data["entries"]
            except ContractError as e:
                self.problem = str(e)  # a cache, not a record: start over
                self._dirty = True  # and rewrite it, so that it is said once

    def sha256(self, file: Path) -> str:
        st = os.stat(file)
        key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        name = str(Path(file).resolve())
        entry = self.entries.get(name)
        if entry is not None and entry[:4] == key:
            self.seen[str(file)] = entry
            return entry[4]
        digest = sha256_file(file)  # the key was taken first: a write while hashing shows as a changed key
        self.entries[name] = self.seen[str(file)] = [*key, digest]
        self.hashed.append(name)
        self._dirty = True
        return digest

    def changed(self) -> list[str]:
        """The files seen this time whose content is no longer what their hash says: the stat key
        differs and so does the sha256 (a ``touch`` changes the key, not the content). A file that
        is gone counts as changed."""
        changed = []
        for name, entry in self.seen.items():
            try:
                st = os.stat(name)
            except OSError:
                changed.append(name)
                continue
            if [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino] != entry[:4] and sha256_file(name) != entry[4]:
                changed.append(name)
        return changed

    def save(self, lock: Path | None = None) -> None:
        """Replace the file atomically. With ``lock`` (the expert's build lock), only when the lock is
        free at once: a builder holding it may be cleaning temporary files, ours included, and a
        cache that is not saved this time is only hashed again next time."""
        if self.path is None or not self._dirty:
            return
        if lock is not None:
            from filelock import FileLock, Timeout

            try:
                with FileLock(str(lock), timeout=0):
                    self.save()
            except Timeout:
                pass
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps({"entries": self.entries, "sha256": sha256_json(self.entries)}, sort_keys=True),
                     "the stat cache of the input files", BUILD_DISK_FULL_FIX)
        self._dirty = False
