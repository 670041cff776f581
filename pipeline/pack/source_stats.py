"""What tokenizing one source counted: :class:`SourceStats`, with how its documents were made and
checked (:class:`Exactness`) and its first bad rows (:class:`BadRow`).

Built by the tokenizing pass (pipeline/encode/source_caches.py), written as the source cache's
``stats.json`` and read back from it (pipeline/pack/spill.py seals it with the sha256 of every file),
summed over the parts of a partitioned build (:meth:`SourceStats.merged`, pipeline/orchestrate/partition.py),
and shown per source in report.json (pipeline/pack/report.py). :meth:`SourceStats.to_dict` is the JSON
of stats.json, field for field; :meth:`SourceStats.from_dict` reads it back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from packtrain.core.schema import BOOL, COUNT, OPTIONAL_TEXT, POSITIVE, TEXT

FIRST_BAD_ROWS = 20  # bad rows kept by name per source (the count goes on)


@dataclass(frozen=True)
class BadRow:
    """A row skipped under ``build.on_bad_rows: skip``: ``row`` names it (``<source>:<file>#<row>``),
    ``reason`` says why; ``batch`` and ``at`` (its row within the batch) order the rows of merged parts."""

    row: str
    reason: str
    batch: int
    at: int


@dataclass
class Exactness:
    """How a source's documents were made and checked (pipeline/encode/fast/exactness.py): the encoder
    (``"fastokens"``, ``"tiktoken"``, ``"tokenizers"``, or several joined by ``"+"`` for a merged
    partitioned build), whether the line cache or the one-render shortcut made some, how many a
    shortcut made and how many of those were checked against the HF tokenizer."""

    encoder: str
    line_cache: bool
    render_once: bool
    by_shortcut: int = 0
    checked: int = 0

    SCHEMA = {"encoder": TEXT, "line_cache": BOOL, "render_once": BOOL, "by_shortcut": COUNT, "checked": COUNT}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Exactness":
        return cls(**{key: data[key] for key in cls.SCHEMA})

    @classmethod
    def combined(cls, made: list["Exactness"]) -> "Exactness":
        """Several sources' (or parts') entries as one: the encoders joined by "+", the line cache (the
        one-render shortcut) on if it was on for any, the counts summed.

        >>> Exactness.combined([Exactness("fastokens", False, True, 3, 3), Exactness("tokenizers", True, False, 2, 1)])
        Exactness(encoder='fastokens+tokenizers', line_cache=True, render_once=True, by_shortcut=5, checked=4)
        """
        return cls("+".join(sorted({e for m in made for e in m.encoder.split("+")})),
                   any(m.line_cache for m in made), any(m.render_once for m in made),
                   sum(m.by_shortcut for m in made), sum(m.checked for m in made))


@dataclass
class SourceStats:
    """One source's counts (or one part's, of a partitioned build): rows read, documents and tokens
    made, bad rows skipped (the first :data:`FIRST_BAD_ROWS` by name), chat documents without a system
    message (``no_system``: the template's default, if any, went in), the source's batches of
    ``batch_rows`` rows, and ``filtered_rows`` dropped by ``sources[].where`` (None: the source has no
    filter, and stats.json no such field)."""

    batch_rows: int
    exactness: Exactness
    filtered_rows: int | None = None
    rows: int = 0
    documents: int = 0
    tokens: int = 0
    bad_rows: int = 0
    no_system: int = 0
    batches: int = 0
    first_bad_rows: list[BadRow] = field(default_factory=list)
    special_text_rows: int = 0
    """Rows whose data (a field, a message) holds a special token's text (pipeline/format/special_text.py), whatever
    ``build.special_tokens_in_text`` made of them."""
    special_text_example: str | None = None
    """The first of them: ``<source>:<file>#<row>: field '<name>' holds '<token>'``."""

    # stats.json's fields (pipeline/pack/spill.py adds the files' sha256 and its own)
    SCHEMA = {"rows": COUNT, "documents": COUNT, "tokens": COUNT, "bad_rows": COUNT, "batch_rows": POSITIVE,
              "batches": COUNT, "no_system": COUNT,
              "first_bad_rows": [{"row": TEXT, "reason": TEXT, "batch": COUNT, "at": COUNT}],
              "exactness": Exactness.SCHEMA, "special_text_rows": COUNT, "special_text_example": OPTIONAL_TEXT}

    def add_special_text(self, example: str) -> None:
        self.special_text_rows += 1
        if self.special_text_example is None:
            self.special_text_example = example

    def add_bad_row(self, row: BadRow) -> None:
        self.bad_rows += 1
        if len(self.first_bad_rows) < FIRST_BAD_ROWS:
            self.first_bad_rows.append(row)

    def to_dict(self) -> dict:
        """The JSON of stats.json (without its sha256s) and of a report.json source's counts."""
        return {"rows": self.rows, "documents": self.documents, "tokens": self.tokens, "bad_rows": self.bad_rows,
                "no_system": self.no_system, "first_bad_rows": [dataclasses.asdict(r) for r in self.first_bad_rows],
                "batch_rows": self.batch_rows, "batches": self.batches, "exactness": self.exactness.to_dict(),
                "special_text_rows": self.special_text_rows, "special_text_example": self.special_text_example,
                **({"filtered_rows": self.filtered_rows} if self.filtered_rows is not None else {})}

    @classmethod
    def from_dict(cls, data: dict) -> "SourceStats":
        """``data``: a stats.json checked against :attr:`SCHEMA` (its other fields are not read)."""
        return cls(data["batch_rows"], Exactness.from_dict(data["exactness"]), data.get("filtered_rows"),
                   **{key: data[key] for key in ("rows", "documents", "tokens", "bad_rows", "no_system", "batches")},
                   first_bad_rows=[BadRow(**row) for row in data["first_bad_rows"]],
                   special_text_rows=data["special_text_rows"], special_text_example=data["special_text_example"])

    @classmethod
    def merged(cls, parts: list["SourceStats"]) -> "SourceStats":
        """The stats of the parts of one source (each holding some of its batches, cut alike) as one
        machine would have counted them: the counts summed, the first bad rows in batch order."""
        first = sorted((row for p in parts for row in p.first_bad_rows), key=lambda r: (r.batch, r.at))
        filtered = None if parts[0].filtered_rows is None else sum(p.filtered_rows for p in parts)
        return cls(parts[0].batch_rows, Exactness.combined([p.exactness for p in parts]), filtered,
                   **{key: sum(getattr(p, key) for p in parts)
                      for key in ("rows", "documents", "tokens", "bad_rows", "no_system")},
                   batches=parts[0].batches, first_bad_rows=first[:FIRST_BAD_ROWS],
                   special_text_rows=sum(p.special_text_rows for p in parts),
                   special_text_example=next((p.special_text_example for p in parts if p.special_text_example), None))
