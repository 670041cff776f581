"""A batch of JSON lines rows as read, parsed where its values are used: in the worker that formats them.

The JSON lines pyarrow cannot read exactly (pipeline/read/json_files.py ``_json_lines``: a ``messages``
column of objects, types that change between rows) were parsed line by line with ``json.loads`` in the
build's own process, which then pickled every row's objects to a worker of the pool: a quarter of that
process's CPU on 50k conversations (docs/benchmarks-history.md). The build's process now only reads the
lines (bounded, blank ones skipped, each row's line number kept) and parses a line itself only while a
requested column has not been seen in any row yet (what tells a column no row has from one some rows
lack); a :class:`JsonLines` batch pickles its lines, and ``columns[name]`` parses them all once where it
is first asked, with the same values and the same errors (``path, line N: not valid JSON ...``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping



def parse_row(path: str, lineno: int, line: str) -> dict:
    """The JSON object on line ``lineno`` of ``path``, or the ``SourceError`` that says why not: not JSON,
    and also JSON that ``json.loads`` refuses otherwise (an integer of more than 4,300 digits, a
    ValueError; values nested past Python's recursion limit, about 1,000 levels, a RecursionError)."""
    try:
        row = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise source_error(f"{path}, line {lineno}: {json_problem(e)}; fix or remove that line") from None
    if not isinstance(row, dict):
        raise source_error(f"{path}, line {lineno}: expected one JSON object per line, got "
                           f"{type(row).__name__}; write one {{\"field\": value}} object per line")
    return row


def json_problem(error: ValueError | RecursionError) -> str:
    """What ``json.loads`` refused, in a few words: not JSON (its message, ``Expecting value``), or JSON
    Python's reader does not take (values nested too deep, an integer with too many digits)."""
    if isinstance(error, json.JSONDecodeError):
        return f"not valid JSON ({error.msg})"
    if isinstance(error, RecursionError):
        return "lists or objects nested deeper than Python's JSON reader goes (about 1,000 levels)"
    if "digits" in str(error):  # int(): "Exceeds the limit (4300 digits) for integer string conversion ..."
        return f"an integer of more than {sys.get_int_max_str_digits():,} digits, which Python's JSON reader refuses"
    return f"not valid JSON ({' '.join(str(error).split())[:200]})"


def source_error(message: str) -> Exception:
    """discover.SourceError, imported only here: discover's imports (the hub's client) cost each worker
    about a CPU second, and a worker that parses good lines needs none of them."""
    from packtrain.pipeline.read.discover import SourceError

    return SourceError(message)


class JsonLines(Mapping):
    """``columns[name]``: the column's values over the batch's lines (None where a row lacks it), every
    line parsed once, on first use; the lines as read otherwise (pickled to a worker as text)."""

    def __init__(self, path: str, lines: list[str], linenos: list[int], names: list[str]):
        self.path, self.lines, self.linenos, self.names = path, lines, linenos, list(names)
        self._columns: dict[str, list] | None = None

    def __getitem__(self, name: str) -> list:
        if name not in self.names:
            raise KeyError(name)
        if self._columns is None:
            rows = [parse_row(self.path, lineno, line) for lineno, line in zip(self.linenos, self.lines)]
            self._columns = {c: [row.get(c) for row in rows] for c in self.names}
        return self._columns[name]

    def __contains__(self, name: object) -> bool:
        return name in self.names  # nothing parsed to say so

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    @property
    def num_rows(self) -> int:
        return len(self.lines)

    def cut(self, at: int) -> tuple["JsonLines", "JsonLines"]:
        """(the first ``at`` rows, the rest)."""
        return (JsonLines(self.path, self.lines[:at], self.linenos[:at], self.names),
                JsonLines(self.path, self.lines[at:], self.linenos[at:], self.names))

    def __reduce__(self):
        return JsonLines, (self.path, self.lines, self.linenos, self.names)  # the lines, not what was parsed


def joined_lines(chunks: list[JsonLines], names: list[str]) -> JsonLines:
    """The rows of ``chunks`` (of one file) in order, as one batch of the columns ``names``."""
    return JsonLines(chunks[0].path, [line for c in chunks for line in c.lines],
                     [n for c in chunks for n in c.linenos], names)
