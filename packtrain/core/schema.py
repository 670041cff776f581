"""Schemas of the JSON files packtrain writes and reads back (manifest, report, caches, run records).

A schema is an :class:`Is` (a leaf: which values it accepts, and how to say so), a dict
``{key: schema}`` (an object with at least these keys), a one-item list ``[schema]`` (a list of such
items) or ``MapOf(key, value)`` (an object whose every key and value match). :func:`schema_problem`
names the first field that differs; ``packtrain.core.inputs.read_json(path, fix, schema=...)`` reads
a file and checks it in one step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Is:
    """A leaf of a JSON schema: ``what`` says which values ``ok`` accepts.

    A schema is an ``Is``, a dict ``{key: schema}`` (an object with at least these keys), a
    one-item list ``[schema]`` (a list of such items) or ``MapOf(key, value)`` (an object whose
    every key and value match)."""

    what: str
    ok: Callable[[Any], bool]


@dataclass(frozen=True)
class MapOf:
    key: Is
    value: Any


PLAIN_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # no '/', '\\', '..' or hidden name
INTEGER = Is("an integer", lambda v: type(v) is int)
COUNT = Is("an integer >= 0", lambda v: type(v) is int and v >= 0)
POSITIVE = Is("an integer > 0", lambda v: type(v) is int and v > 0)
NUMBER = Is("a number", lambda v: type(v) in (int, float))
TEXT = Is("a string", lambda v: isinstance(v, str))
BOOL = Is("true or false", lambda v: type(v) is bool)
OPTIONAL_TEXT = Is("a string or null", lambda v: v is None or isinstance(v, str))
SHA256 = Is("a sha256 (64 hex digits)", lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) is not None)
FILE_NAME = Is("a plain file name (no directory part)",
               lambda v: isinstance(v, str) and PLAIN_FILE_NAME.fullmatch(v) is not None)
OBJECT = Is("an object", lambda v: isinstance(v, dict))


def short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def schema_problem(value: Any, schema: Any, where: str = "") -> str | None:
    """The first way ``value`` differs from ``schema`` (``"field a.b[0] is 'x', expected an integer"``),
    or None when it matches."""
    name = f"field {where}" if where else "the top level"
    if isinstance(schema, Is):
        return None if schema.ok(value) else f"{name} is {short_repr(value)}, expected {schema.what}"
    if isinstance(schema, list):
        if not isinstance(value, list):
            return f"{name} is {short_repr(value)}, expected a list"
        for i, item in enumerate(value):
            if problem := schema_problem(item, schema[0], f"{where}[{i}]"):
                return problem
        return None
    if not isinstance(value, dict):
        return f"{name} is {short_repr(value)}, expected an object"
    if isinstance(schema, MapOf):
        for key, item in value.items():
            if not schema.key.ok(key):
                return f"{name} has the key {short_repr(key)}, expected {schema.key.what}"
            if problem := schema_problem(item, schema.value, f"{where}[{key!r}]"):
                return problem
        return None
    for key, sub in schema.items():
        if key not in value:
            return f"field {where + '.' if where else ''}{key} is missing"
        if problem := schema_problem(value[key], sub, f"{where + '.' if where else ''}{key}"):
            return problem
    return None
