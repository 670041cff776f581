"""A batch's columns as pyarrow read them, handed to a worker as Arrow buffers, not Python objects.

The readers that go through pyarrow (parquet, arrow, CSV, TSV: pipeline/read/sources.py; JSON lines:
pipeline/read/json_files.py) give each batch as :class:`ArrowColumns`: a mapping from column name to the column's Python values,
made (``to_pylist``, the values ``to_pydict`` gives) only where a column is asked for, and kept.
Pickled (to a worker of the pool, pipeline/encode/pool.py), it sends the batch's Arrow buffers,
copied down to the batch's own rows, and no value made so far: the build's process neither makes a
Python object per row nor pickles one, and each worker makes the values of its own batches. Where
the columns are text (no null), a worker can format them column-wise without making them at all
(pipeline/format/format_columns.py).

    file of 2,500 rows, batch_rows 1,000, pyarrow blocks of 1,700 and 800 rows
    -> ArrowColumns of rows 0-999, 1000-1999 (a cut of both blocks, joined), 2000-2499
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from packtrain.pipeline.read.json_rows import JsonLines, joined_lines

if TYPE_CHECKING:  # pyarrow is imported where a batch is Arrow: a worker of JSON lines rows imports none of it
    import pyarrow as pa


class ArrowColumns(Mapping):
    """``columns[name]``: a column's values as a Python list (made once, on first use);
    ``columns.arrow(name)``: the column itself. Equal to the dict of its lists."""

    def __init__(self, batch: pa.RecordBatch):
        self.batch = batch
        self._lists: dict[str, list] = {}

    def __getitem__(self, name: str) -> list:
        if name not in self._lists:
            if name not in self.batch.schema.names:
                raise KeyError(name)
            self._lists[name] = self.batch.column(name).to_pylist()
        return self._lists[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.batch.schema.names)

    def __len__(self) -> int:
        return self.batch.num_columns

    @property
    def num_rows(self) -> int:
        return self.batch.num_rows

    def arrow(self, name: str) -> pa.Array:
        return self.batch.column(name)

    def head(self, rows: int) -> "ArrowColumns":
        return ArrowColumns(self.batch.slice(0, rows))

    def __reduce__(self):
        # a slice pickles its whole parent buffers (a reader's block): copy the batch's own rows first
        return ArrowColumns, (compact(self.batch),)


def compact(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with buffers of its own rows only (a slice of a reader's block keeps the whole block's)."""
    import pyarrow as pa

    return pa.RecordBatch.from_arrays([pa.concat_arrays([column]) for column in batch.columns], schema=batch.schema)


def num_rows(columns: Mapping[str, list]) -> int:
    """Rows of a batch's columns, :class:`ArrowColumns`, JSON lines (pipeline/read/json_rows.py) or a dict of
    lists, without making any value."""
    if isinstance(columns, (ArrowColumns, JsonLines)):
        return columns.num_rows
    return len(next(iter(columns.values()))) if columns else 0


def joined(chunks: list[Mapping[str, list]], names: list[str]) -> Mapping[str, list]:
    """The rows of ``chunks`` in order, as one batch of the columns ``names``: Arrow where every chunk
    is, JSON lines where every chunk is, else a dict of lists."""
    if all(isinstance(chunk, JsonLines) for chunk in chunks):
        return joined_lines(chunks, names)
    if all(isinstance(chunk, ArrowColumns) for chunk in chunks):
        if len(chunks) == 1:
            return ArrowColumns(chunks[0].batch.select(names))
        import pyarrow as pa

        table = pa.Table.from_batches([chunk.batch.select(names) for chunk in chunks]).combine_chunks()
        return ArrowColumns(pa.RecordBatch.from_arrays([column.chunk(0) if column.num_chunks else
                                                        pa.array([], column.type) for column in table.columns],
                                                       schema=table.schema))
    if len(chunks) == 1:
        return {name: chunks[0][name] for name in names}
    return {name: [value for chunk in chunks for value in chunk[name]] for name in names}


def cut(columns: Mapping[str, list], at: int) -> tuple[Mapping[str, list], Mapping[str, list]]:
    """(the first ``at`` rows, the rest)."""
    if isinstance(columns, ArrowColumns):
        return ArrowColumns(columns.batch.slice(0, at)), ArrowColumns(columns.batch.slice(at))
    if isinstance(columns, JsonLines):
        return columns.cut(at)
    return {c: v[:at] for c, v in columns.items()}, {c: v[at:] for c, v in columns.items()}
