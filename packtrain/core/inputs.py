"""Reading the files a user hands packtrain: configs, saved datasets, tokenizers, model weights.

Every parse of such a file goes through :func:`read_input`, which turns whatever the parser raises
(a JSON, YAML, tokenizers, safetensors or Arrow error, a wrong encoding, a wrong shape) into one
:class:`InputError` whose one-line message names the file and says how to fix it. The CLI prints
it as ``error: ...`` and exits 2, never with a traceback.

:func:`read_json` is packtrain's one JSON reader, for those files and for the ones packtrain wrote
itself and reads back (manifest, report, caches, run records: checked against a schema.py schema).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from packtrain.core.errors import ContractError
from packtrain.core.schema import schema_problem


class InputError(ContractError):
    """An input file cannot be read; the message (one line) names it and the fix."""


def one_line(error: BaseException, limit: int = 200) -> str:
    """``Type: first line of the message``, cut to ``limit`` characters: a parser's error in one line."""
    text = " ".join(str(error).split()) or "no details"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(error).__name__}: {text}"


def read_input(path: str | os.PathLike, parse: Callable[[Path], Any], fix: str, what: str = "") -> Any:
    """``parse(path)``, with any error it raises turned into an InputError naming ``path`` and ``fix``.
    ``what`` says what the file should be ("a saved dataset's state.json"), for the message."""
    path = Path(path)
    try:
        return parse(path)
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - every parser has its own error types; all mean "unreadable"
        kind = f" as {what}" if what else ""
        raise InputError(f"{path} cannot be read{kind} ({one_line(e)}): {fix}") from None


def parse_json(raw: bytes | str, shape: type = dict) -> Any:
    """The JSON document ``raw`` (UTF-8 bytes, or their text), whose top level must be a ``shape``; a
    ValueError otherwise (:func:`read_input` makes it the file's one line). For content already read:
    a file checked against its hash is parsed as those bytes, never read again."""
    value = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    if not isinstance(value, shape):
        raise ValueError(f"the top level is {type(value).__name__}, expected {shape.__name__}")
    return value


def read_json(path: str | os.PathLike, fix: str, what: str = "JSON", shape: type = dict, schema: Any = None) -> Any:
    """A JSON file whose top level must be a ``shape`` (dict by default).

    A file the user hands in (no ``schema``): any problem reads ``<path> cannot be read as <what>
    (<error>): <fix>``. A file packtrain wrote and reads back (``schema``: see schema.py; ``what`` and
    ``shape`` unused): ``<path> is missing; <fix>``, or ``<path> is damaged (<problem>); <fix>`` where
    the problem is the file's (unreadable, not UTF-8, not JSON) or the first field that differs."""
    if schema is None:
        return read_input(path, lambda p: parse_json(p.read_bytes(), shape), fix, what)
    path = Path(path)
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path} is missing; {fix}") from None
    except OSError as e:
        problem = f"cannot be read: {e.strerror}"
    except UnicodeDecodeError:
        problem = "not UTF-8 text"
    except (ValueError, RecursionError) as e:
        problem = f"not valid JSON: {e}"
    else:
        problem = schema_problem(value, schema)
        if problem is None:
            return value
    raise InputError(f"{path} is damaged ({problem}); {fix}")


def check_input(ok: bool, path: str | os.PathLike, problem: str, fix: str) -> None:
    """A parsed file with the wrong content: the same one-line error as an unreadable one."""
    if not ok:
        raise InputError(f"{path}: {problem}: {fix}")
