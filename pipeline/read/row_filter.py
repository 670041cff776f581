"""The row filter ``sources[].where`` (packtrain/core/config_sources.py ``RowCondition``): which rows of a
batch as read are formatted, the others counted (``filtered_rows`` in the build report).

Values compare as the reader gives them: a CSV's cells are text (``"False"``, ``"3"``), a JSON
file's values are as written. A condition whose values are of another kind than a batch's column
(``equals: false`` on a CSV column) would silently keep nothing: it is refused instead, naming the
condition and the value to write::

    column syntax_error ["False", "True"]   equals: false     -> refused: write equals: 'False'
    column syntax_error ["False", "True"]   equals: "False"   -> keep [0]
    column meta [{"lang": "en"}, ...]        equals: "en"      -> refused: the fields inside a column are not read
"""

from __future__ import annotations

from packtrain.pipeline.errors import BuildError


def kind(value) -> str | None:
    """``text``, ``a boolean``, ``a number``, ``lists`` or ``objects``; None for null."""
    if isinstance(value, str):
        return "text"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, list):
        return "lists"
    if isinstance(value, dict):
        return "objects"
    return None


NESTED = ("lists", "objects")


def check_kinds(conditions, columns: dict[str, list], where: str) -> None:
    """Refuse a condition none of whose values is of the kind of the batch's values in its column
    (``where``: ``sources[i]``, for the message)."""
    for j, condition in enumerate(conditions):
        if condition.not_empty:
            continue
        wanted = [condition.equals] if condition.equals is not None else condition.one_of
        seen: dict[str, object] = {}
        for value in columns[condition.column]:
            if kind(value) is not None:
                seen.setdefault(kind(value), value)
        if seen and not seen.keys() & {kind(w) for w in wanted}:
            found, example = next(iter(seen.items()))
            fix = (f"write the value as the column holds it (e.g. {str(wanted[0])!r})" if found not in NESTED else
                   "equals and one_of compare a column's own text, number or boolean, not the fields inside it: "
                   "name a column holding the value itself (not_empty works on any column)")
            raise BuildError(f"{where}.where[{j}]: column {condition.column!r} holds {found} (e.g. {example!r:.80}), "
                             f"and the condition compares with {kind(wanted[0])} ({wanted[0]!r}); {fix}")


def kept_rows(conditions, columns: dict[str, list]) -> list[int]:
    """The indices of the rows where every condition holds."""
    rows = len(next(iter(columns.values()))) if columns else 0
    return [i for i in range(rows) if all(c.holds(columns[c.column][i]) for c in conditions)]
