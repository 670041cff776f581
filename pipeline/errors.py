"""The build's errors: each message names the input and the fix."""

from __future__ import annotations

import hashlib
from pathlib import Path

from packtrain.core.errors import PacktrainError
from packtrain.core.inputs import read_input
from packtrain.pipeline.hashcache import StatCache


class BuildError(PacktrainError):
    """The build cannot go on; the message names the input and the fix."""


class TokenizerError(PacktrainError, ValueError):
    """The tokenizer's files cannot be used as they are; the message says how to fix them."""


class ContentChanged(TokenizerError):
    """tokenizer.json (``path``) is no longer the content the build hashed when an encoder was to be
    built from it (pipeline/encode/encoders.py): the build plans again (:class:`InputsChanged`)."""

    def __init__(self, path: str):
        super().__init__(f"{path} changed while the build read it (its sha256 is no longer the one the build "
                         "planned with): build again once it is no longer being written")
        self.path = path

    def __reduce__(self):  # through a process pool: rebuilt from the path
        return ContentChanged, (self.path,)


def read_as_hashed(path: Path, sha256: str | None, fix: str, what: str) -> bytes:
    """``path``'s bytes, read once, where their sha256 is ``sha256`` (what the build id describes; None:
    the file was not there when it was hashed), else :class:`ContentChanged`: a file replaced after it
    was hashed and put back before the build checks its inputs again would otherwise be read as other
    content under the id. Unreadable: the InputError of core/inputs.read_input."""
    raw = read_input(path, Path.read_bytes, fix, what)
    if hashlib.sha256(raw).hexdigest() != sha256:
        raise ContentChanged(str(path))
    return raw


class InputsChanged(BuildError):
    """Input files (``files``) changed after the build id was computed from their hashes."""

    def __init__(self, message: str, files: list[str]):
        super().__init__(message)
        self.files = files


def check_inputs_unchanged(expert: str, files: StatCache | None) -> None:
    """Refuse when an input file no longer holds the content its hash in the build id describes."""
    changed = files.changed() if files is not None else []
    if changed:
        raise InputsChanged(
            f"{', '.join(changed)} changed after the build id of {expert!r} was computed from its content "
            "(edited or replaced while the build waited for the lock or read it); nothing was published or "
            "cached under the old id: build again once the file stops changing", changed)
