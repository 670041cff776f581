"""Batches read by pyarrow stay Arrow until a worker uses them (pipeline/read/arrow_columns.py)."""

import pickle

import pyarrow as pa

from packtrain.pipeline.read.arrow_columns import ArrowColumns, cut, joined, num_rows
from packtrain.pipeline.read.sources import _rebatch


def block(start: int, rows: int) -> pa.RecordBatch:
    return pa.record_batch({"q": [f"q{i}" for i in range(start, start + rows)], "n": list(range(start, start + rows))})


def test_columns_are_the_lists_to_pydict_gives():
    columns = ArrowColumns(block(0, 3))
    assert columns == {"q": ["q0", "q1", "q2"], "n": [0, 1, 2]}
    assert list(columns) == ["q", "n"] and num_rows(columns) == 3 and columns.arrow("n").type == pa.int64()


def test_a_pickled_slice_carries_its_own_rows_only():
    big = block(0, 20_000)
    piece = ArrowColumns(big.slice(1000, 10))
    sent = pickle.dumps(piece)
    assert len(sent) < 2_000  # the whole block's buffers are ~300 kB
    back = pickle.loads(sent)
    assert isinstance(back, ArrowColumns) and back == {"q": [f"q{i}" for i in range(1000, 1010)],
                                                       "n": list(range(1000, 1010))}


def test_rebatch_cuts_arrow_blocks_into_batches_of_exactly_batch_rows():
    chunks = [ArrowColumns(block(0, 7)), ArrowColumns(block(7, 2)), ArrowColumns(block(9, 5))]
    batches = list(_rebatch(iter(chunks), ["n", "q"], 4))
    assert [b["n"] for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13]]
    assert all(isinstance(b, ArrowColumns) and list(b) == ["n", "q"] for b in batches)


def test_arrow_and_python_chunks_join_as_lists():
    both = joined([ArrowColumns(block(0, 2)), {"q": ["x"], "n": [None]}], ["q", "n"])
    assert both == {"q": ["q0", "q1", "x"], "n": [0, 1, None]}
    first, rest = cut(ArrowColumns(block(0, 3)), 1)
    assert (first["n"], rest["n"]) == ([0], [1, 2])


def test_text_read_as_arrow_formats_column_wise_as_its_lists_do():
    from packtrain.core.config_build import FormatConfig
    from packtrain.pipeline.format.format import RowFormatter
    from packtrain.pipeline.format.format_columns import format_columns

    formatter = RowFormatter(FormatConfig(prompt="Q: {question}\n", answer="{answer}"), ())
    lists = {"question": ["a", "Ça"], "answer": ["x", " "]}
    got = format_columns(formatter, ArrowColumns(pa.record_batch(lists)))
    assert (got.texts, got.prompt_chars.tolist(), got.kept, got.bad) == (["Q: a\nx"], [5], [0], [(1, "the answer is empty")])
    with_null = pa.record_batch({"question": ["a", None], "answer": ["x", "y"]})  # text_value's row: per row
    assert format_columns(formatter, ArrowColumns(with_null)) is None
    assert format_columns(formatter, ArrowColumns(pa.record_batch({"question": ["a"], "answer": [3]}))) is None
