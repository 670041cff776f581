"""A template field's text (``format.prompt`` / ``format.answer`` in template style): a row's value as the
text ``str.format`` puts in the template, and the bad row a value gives that has none (a null, a NaN, a
conversation) or that a field's format spec does not take (a number's spec on a CSV cell, which is text)."""

from __future__ import annotations

import json
import math
import string
from functools import partial
from typing import Any

from packtrain.pipeline.format.chat_template import BadRow


class NumberText(str):
    """A number's text (:func:`text_value`; ``{n}`` and ``{n!r}`` give what they gave) that a format spec
    formats as the number, as ``str.format`` does with the value itself: ``{price:.2f}``, ``{n:,}``,
    ``{share:.0%}``, and ``{n:06}`` zero-padded, ``{n:6}`` right-aligned (as text, ``42`` came out
    ``420000`` and ``42    ``).

    >>> "{p:.2f} {n:,} {n:>9} {m:06}|{m:4}|{m!r}".format(p=NumberText(3.14159, "3.14159"),
    ...                                               n=NumberText(1234567, "1234567"), m=NumberText(42, "42"))
    "3.14 1,234,567   1234567 000042|  42|'42'"
    """

    def __new__(cls, number: int | float, text: str):
        made = super().__new__(cls, text)
        made.number = number
        return made

    def __reduce__(self):
        return NumberText, (self.number, str(self))

    def __format__(self, spec: str) -> str:
        return format(self.number, spec)  # an empty spec: str(number), this text


def spec_on_text(error: ValueError, templates: tuple[str, ...], values: dict[str, str]) -> Exception:
    """What a template's ``ValueError`` was: a number's format spec on a field that holds text (a CSV or TSV
    cell is text) as a :class:`BadRow` naming the field, its value and the spec; else the error itself."""
    for template in templates:
        for _, name, spec, _ in string.Formatter().parse(template):
            value = values.get(name) if name else None
            if not spec or not isinstance(value, str) or isinstance(value, NumberText):
                continue
            try:
                format(value, spec)
            except ValueError:
                return BadRow(f"field {name!r} is text ({value[:40]!r}), which the format spec {spec!r} of "
                              f"'{{{name}:{spec}}}' does not take ({error}); CSV and TSV cells are text: remove the "
                              "spec from the template, or give the column as numbers (JSON lines, Parquet)")
    return error


def text_value(value: Any, name: str) -> str:
    """A field's text: strings as they are, numbers printed, lists/objects as compact JSON (but not a
    conversation: a list of messages with roles needs style chat)."""
    if value is None:
        raise BadRow(f"field {name!r} is null")
    if isinstance(value, str):
        return value
    if isinstance(value, float) and not math.isfinite(value):  # JSON's NaN, Infinity, 1e400: no text to train on
        raise BadRow(f"field {name!r} is {value!r}, not a finite number (a NaN, Infinity or out-of-range number in "
                     "the data); fix that value in the data")
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        return NumberText(value, str(value))
    if isinstance(value, list) and value and all(isinstance(v, dict) and ("role" in v or "from" in v) for v in value):
        raise BadRow(f"field {name!r} holds a conversation (messages with roles), not text; conversations need "
                     "format.style: chat (with format.messages or a preset)")
    if isinstance(value, (list, dict)):
        try:
            return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                              default=partial(_no_json_text, name))
        except BadRow:  # a ValueError too
            raise
        except ValueError:
            raise BadRow(f"field {name!r} holds a NaN or infinite number, which JSON has no text for; fix that value "
                         "in the data") from None
        except RecursionError:
            raise BadRow(f"field {name!r} holds lists or objects nested deeper than Python's JSON writer goes (about "
                         "1,000 levels); flatten that value in the data") from None
    raise BadRow(f"field {name!r} has type {type(value).__name__}, expected text")


def _no_json_text(name: str, value: Any) -> Any:
    """``json.dumps``' ``default``: a value inside a list or object that JSON has no text for (a parquet
    struct's timestamp, date, decimal or bytes) makes the row a bad row naming the field and the type,
    where it stopped the build with a TypeError traceback."""
    raise BadRow(f"field {name!r} holds a {type(value).__name__} inside its list or object, which JSON has no text "
                 "for; store that value as text or a number in the data")
