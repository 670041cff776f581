"""Formatting a whole batch at once: prompt/answer rows whose template is plain ``{field}``
placeholders over text columns, formatted column-wise (no dict, no :class:`Formatted` per row).

The result is what :class:`RowFormatter` gives row by row, in columns: every kept row's text
(``prompt + answer``), its prompt's length in characters (the one supervised span runs from there to
the end of the text), and the same bad rows with the same reasons. Where that could differ, the
batch is not formatted here (``None``) and the per-row formatter does it: the chat style, a prompt
that depends on the row (``format.prompt_no_input``), a field
with a conversion or a format spec (``{n:>4}``), a column that is missing, or a value in a batch
that is not text (nulls, numbers, lists: :func:`pipeline.format.field_text.text_value` prints those).

    prompt "Q: {question}\\n"   answer "{answer}"   columns question ["Hi?", "x"], answer ["Yo", " "]
    texts ["Q: Hi?\\nYo"]   prompt_chars [7]   kept [0]   bad [(1, "the answer is empty")]
"""

from __future__ import annotations

import operator
import string
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from packtrain.pipeline.read.arrow_columns import ArrowColumns
from packtrain.pipeline.format.format import RowFormatter


@dataclass
class SuffixBatch:
    """Kept rows as prompt + answer: one supervised span each, from ``prompt_chars`` to the end."""

    texts: list[str]
    prompt_chars: np.ndarray  # int64 per kept row
    kept: list[int]  # the row index (within the batch) of each text
    bad: list[tuple[int, str]]  # (row index, reason), in row order

    def without(self, refused: list[tuple[int, str]]) -> "SuffixBatch":
        """The batch without the texts ``refused`` ((index into ``texts``, why)), their rows bad."""
        if not refused:
            return self
        drop = {k for k, _ in refused}
        keep = [k for k in range(len(self.texts)) if k not in drop]
        return SuffixBatch([self.texts[k] for k in keep], self.prompt_chars[keep], [self.kept[k] for k in keep],
                           sorted(self.bad + [(self.kept[k], why) for k, why in refused]))


@lru_cache(maxsize=16)
def positional(template: str, fields: tuple[str, ...]) -> str | None:
    """``template`` with each plain ``{field}`` as ``{i}`` (its index in ``fields``), so rows format
    from the columns' values in order (``str.format(*values)``); None where a field has a
    conversion or a format spec, or is not one of ``fields`` (the per-row formatter does those).

    >>> positional("Q {b}{{x}} {a}", ("a", "b"))
    'Q {1}{{x}} {0}'
    >>> positional("{a!r}", ("a",)) is None, positional("{a:>4}", ("a",)) is None
    (True, True)
    """
    out = []
    for literal, name, spec, conversion in string.Formatter().parse(template):
        out.append(literal.replace("{", "{{").replace("}", "}}"))
        if name is None:
            continue
        if spec or conversion or name not in fields:
            return None
        out.append(f"{{{fields.index(name)}}}")
    return "".join(out)


def answer_literal(template: str) -> str:
    """The text of ``template`` outside its fields.

    >>> answer_literal("{{x}} {a}!")
    '{x} !'
    """
    return "".join(literal for literal, _, _, _ in string.Formatter().parse(template))


def all_text(columns: Mapping[str, list], column: str) -> bool:
    """Whether every value of the column is text (str), from its Arrow type where it was read as Arrow."""
    if isinstance(columns, ArrowColumns):
        import pyarrow as pa  # here: a worker of JSON lines rows imports no pyarrow

        array = columns.arrow(column)
        return len(array) == 0 or ((pa.types.is_string(array.type) or pa.types.is_large_string(array.type))
                                   and array.null_count == 0)
    return not set(map(type, columns[column])) - {str}


def format_columns(formatter: RowFormatter, columns: dict[str, list]) -> SuffixBatch | None:
    """The batch formatted column-wise, or None where the per-row formatter must do it (module doc)."""
    fmt = formatter.fmt
    if fmt.messages is not None or fmt.style != "template" or fmt.prompt_no_input is not None:
        return None
    fields = tuple(name for name, _ in formatter.field_columns)
    prompt, answer = positional(fmt.prompt, fields), positional(fmt.answer, fields)
    if prompt is None or answer is None or not fields:
        return None
    values = []
    for _, column in formatter.field_columns:
        if column not in columns or not all_text(columns, column):
            return None  # a null, a number, a list, or no such column: text_value's rows
        values.append(columns[column])
    special = formatter.special
    if special is not None and special.pattern is not None and any(special.pattern.search("\0".join(v)) for v in values):
        return None  # a row holds special-token text (pipeline/format/special_text.py): the per-row formatter marks it
    prompts = list(map(prompt.format, *values))
    answers = list(map(answer.format, *values))
    bad = []
    if not answer_literal(fmt.answer).strip():  # else no answer is empty
        bad = [(i, "the answer is empty") for i, text in enumerate(answers) if not text.strip()]
    if bad:
        empty = {i for i, _ in bad}
        kept = [i for i in range(len(answers)) if i not in empty]
        prompts, answers = [prompts[i] for i in kept], [answers[i] for i in kept]
    else:
        kept = list(range(len(answers)))
    return SuffixBatch(texts=list(map(operator.add, prompts, answers)),
                       prompt_chars=np.fromiter(map(len, prompts), np.int64, len(prompts)), kept=kept, bad=bad)
