"""What the config sections' fields are built from: numeric fields that declare their allowed
range (:func:`num`), the check of every such field at load (:func:`check_numbers`), and
``BUNDLED``, the name that means "shipped with packtrain" for a source and for a model.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import field
from typing import Any

BUNDLED = "bundled"


def num(default: int | float | None, allowed: str, hint: str = "") -> Any:
    """A numeric field whose allowed values are declared with it, as an interval: ``"[1, 1024]"``,
    ``"(0, 1]"`` (``(`` and ``)`` exclude the end). :func:`check_numbers` checks every such field
    when the config loads; NaN and infinities never pass, whatever the interval."""
    return field(default=default, metadata={"range": allowed, "hint": hint})


_INTERVAL = re.compile(r"([\[(])([-+.\de]+), ([-+.\de]+)([\])])")


def in_range(value: int | float, allowed: str) -> bool:
    """``value`` is a finite number inside the interval ``allowed`` (``"(0, 1]"``)."""
    low_bracket, low, high, high_bracket = _INTERVAL.fullmatch(allowed).groups()
    if isinstance(value, float) and not math.isfinite(value):
        return False
    above = value >= float(low) if low_bracket == "[" else value > float(low)
    below = value <= float(high) if high_bracket == "]" else value < float(high)
    return above and below


def check_numbers(obj: Any, errors: list[str], where: str = "") -> None:
    """Every numeric field of the dataclass ``obj``, and of the dataclasses inside it, against the
    interval declared with :func:`num`; one message per bad value, naming the field and the interval."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        label = f"{where}.{f.name}" if where else f.name
        if dataclasses.is_dataclass(value):
            check_numbers(value, errors, label)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    check_numbers(item, errors, f"{label}[{i}]")
        elif "range" in f.metadata and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not in_range(value, f.metadata["range"]):
                finite = "a finite number " if isinstance(value, float) and not math.isfinite(value) else ""
                hint = f" ({f.metadata['hint']})" if f.metadata["hint"] else ""
                errors.append(f"{label}: must be {finite}in {f.metadata['range']}{hint}, got {value!r}")
