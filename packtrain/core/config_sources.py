"""The ``sources`` config section: what an expert reads (``SourceConfig``, one dataset each) and the
row conditions of ``sources[].where`` (``RowCondition``). Every field's default is here; the other build
sections are in packtrain/core/config_build.py, packtrain/core/config.py puts them together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from packtrain.core.config_fields import num


@dataclass
class SourceConfig:
    """One dataset feeding the expert."""

    name: str
    """``bundled`` (the sample shipped with packtrain), an HF dataset id (``b-mc2/sql-create-context``)
    found in the local HF caches, or a local path (jsonl/json/csv/tsv/parquet/arrow file, the text ones
    also .gz/.bz2/.xz, or a directory of them, or a ``save_to_disk`` directory)."""
    split: str = "train"
    """Which split of the dataset to read (``train``, ``validation``, ...), as in ``load_dataset(name, split=...)``;
    the build makes its own validation split from it (``pack.val_fraction``), unless the source is an
    eval source (``role: eval``). Change it when the rows you want are in another split."""
    revision: str | None = None
    """Hub cache only: a branch/tag name or a commit hash; default: the ``main`` ref, or the only snapshot."""
    config: str | None = None
    """The subset of a dataset whose README.md lists several in its YAML header (``configs:``), as in
    ``load_dataset(name, config)``: its ``data_files`` are read. Unset: the config marked ``default: true``
    (or named ``default``, or the only one); a README with several and no default is an error naming them."""
    columns: dict[str, str] = field(default_factory=dict)
    """Template field -> dataset column, for datasets whose column names differ from the template's."""
    max_rows: int | None = num(None, "[1, 1000000000000]", "or unset for every row")
    """Read at most this many rows of the source, in file order (before formatting, dedup and
    ``weight``); unset: every row. Set it for a quick trial build of a large dataset."""
    where: list[RowCondition] = field(default_factory=list)
    """Keep only the rows where every condition holds, e.g. ``[{column: syntax_error, equals: "False"},
    {column: type, one_of: [simple, join]}, {column: cypher, not_empty: true}]``; checked on each row as
    read (after ``max_rows``), before formatting; the rows it drops are counted in the build report.
    Empty: every row."""
    role: Literal["train", "eval"] = "train"
    """``train``: the source's documents are trained on (a ``pack.val_fraction`` share of them held out
    for validation). ``eval``: evaluation only (HF's ``eval_dataset``, axolotl's ``test_datasets``):
    every document goes to the val split, none is ever trained, the eval loss and the task eval are
    reported for it by name (:meth:`eval_name`); with an eval source the training sources hold nothing
    out (``pack.val_fraction`` becomes 0, and is refused set above 0). docs/DATASETS.md, "Eval sources"."""
    weight: float = num(1.0, "(0, 1000]")
    """Mixing weight of this source's training documents: 0.25 keeps a quarter of them, 3 packs each
    three times, 2.5 each twice plus exactly half of them once more (chosen by a hash of their
    tokens, so the same half every build). Applied after dedup; validation documents are never
    weighted (pipeline/pack/mix.py)."""

    def validate(self, errors: list[str], where: str) -> None:
        if not self.name:
            errors.append(f"{where}.name: must not be empty")
        for i, condition in enumerate(self.where):
            condition.validate(errors, f"{where}.where[{i}]")
        if self.role == "eval" and self.weight != 1.0:
            errors.append(f"{where}.weight: {self.weight} on an eval source, whose documents are never trained or "
                          "weighted (evaluation measures the data as it is); remove weight")

    def eval_name(self) -> str:
        """How an eval source is named in the manifest, the metrics and the task eval: a local path's
        file name, or the dataset id, with ``:split`` where the split is not ``train``.

        >>> SourceConfig("/data/spider/dev.jsonl").eval_name(), SourceConfig("acme/sql", split="validation").eval_name()
        ('dev.jsonl', 'acme/sql:validation')
        """
        last = self.name.rstrip("/").rsplit("/", 1)[-1]
        local = self.name.startswith(("/", ".", "~", "$")) or self.name.count("/") != 1 or "." in last
        base = last if local else self.name
        return base + (f":{self.split}" if self.split != "train" else "")


SCALARS = (str, int, float, bool)


@dataclass
class RowCondition:
    """One condition of ``sources[].where`` on a column's value as read (a CSV's cells are text, ``"False"``
    and ``"3"``; a JSON file's values are as written): exactly one of ``equals``, ``one_of`` and ``not_empty``."""

    column: str
    """The dataset column the condition reads (its name in the file, not a template field)."""
    equals: Any = None
    """Keep a row whose value equals this (a string, number or boolean; ``true`` equals no number)."""
    one_of: list[Any] | None = None
    """Keep a row whose value equals one of these."""
    not_empty: bool = False
    """``true``: keep a row whose value is not null, not blank text and not an empty list or object."""

    def validate(self, errors: list[str], where: str) -> None:
        if not self.column:
            errors.append(f"{where}.column: name the dataset column the condition reads")
        given = [name for name, value in (("equals", self.equals), ("one_of", self.one_of), ("not_empty", self.not_empty))
                 if value is not None and value is not False or name == "equals" and value is False]
        if len(given) != 1:
            errors.append(f"{where}: give exactly one of equals, one_of, not_empty: true (got "
                          f"{', '.join(given) or 'none'})")
        values = [self.equals] if self.equals is not None else list(self.one_of or [])
        if any(not isinstance(v, SCALARS) for v in values):
            errors.append(f"{where}: compare with strings, numbers or booleans (got {values!r:.80}); use not_empty "
                          "for null")
        elif any(isinstance(v, float) and v != v for v in values):  # YAML's .nan: equal to nothing, itself included
            errors.append(f"{where}: .nan equals no value, not even a NaN in the data, so the condition would keep "
                          "no row; use not_empty, or compare with the values the column holds")
        if self.one_of is not None and not self.one_of:
            errors.append(f"{where}.one_of: list at least one value")

    def holds(self, value: Any) -> bool:
        """Whether a row whose column holds ``value`` is kept.

        >>> [RowCondition("c", equals=1).holds(v) for v in (1, 1.0, True, "1")]
        [True, True, False, False]
        >>> [RowCondition("c", not_empty=True).holds(v) for v in (None, " ", [], "x", 0)]
        [False, False, False, True, True]
        """
        if self.not_empty:
            return value is not None and not (isinstance(value, str) and not value.strip()) and \
                not (isinstance(value, (list, dict)) and not value)
        wanted = [self.equals] if self.equals is not None else self.one_of or []
        return any(same_value(value, w) for w in wanted)


def same_value(value: Any, wanted: Any) -> bool:
    """Equal values of the same kind: a boolean equals only a boolean (in Python ``True == 1``)."""
    return (type(value) is bool) == (type(wanted) is bool) and isinstance(value, SCALARS) and value == wanted
