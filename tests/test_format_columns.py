"""Prompt/answer rows formatted column-wise (pipeline/format/format_columns.py) are what the per-row
formatter makes: the same texts, prompt lengths and bad rows; the batches it cannot match exactly go
to the per-row formatter (None). And the worker builds the same documents either way."""

from __future__ import annotations

import dataclasses

import numpy as np

from build_fixtures import make_tokenizer
from packtrain.core.config_build import FormatConfig
from packtrain.pipeline.encode import worker
from packtrain.pipeline.format.format import RowFormatter
from packtrain.pipeline.format.format_columns import format_columns

FMT = FormatConfig(prompt="Q: {question}\n{{schema}} {ctx}\n", answer="{answer}")
FORMATTER = RowFormatter(FMT, (("ctx", "context"),))


def per_row(formatter: RowFormatter, columns: dict[str, list]) -> tuple[list[str], list[int], list[int], list]:
    docs, kept, bad = worker.format_rows(formatter, columns)
    return [d.text for d in docs], [d.spans[0][0] for d in docs], kept, bad


def test_text_columns_format_column_wise_as_row_by_row():
    columns = {"question": ["How many?", "Ça va ? 日本", "q"], "context": ["t1", "é\u0301🙂", "c"],
               "answer": ["SELECT 1", "ok", "  \n"], "unused": [None, 3, []]}
    got = format_columns(FORMATTER, columns)
    assert got.texts == ["Q: How many?\n{schema} t1\nSELECT 1", "Q: Ça va ? 日本\n{schema} é\u0301🙂\nok"]
    assert got.prompt_chars.tolist() == [25, 27]
    assert got.kept == [0, 1]
    assert got.bad == [(2, "the answer is empty")]
    assert (got.texts, got.prompt_chars.tolist(), got.kept, got.bad) == per_row(FORMATTER, columns)


def test_batches_the_per_row_formatter_must_do_are_left_to_it():
    base = {"question": ["a", "b"], "context": ["c", "d"], "answer": ["x", "y"]}
    for value in (None, 7, 2.5, True, ["l", 1], {"k": "v"}):  # text_value prints (or refuses) these
        assert format_columns(FORMATTER, {**base, "answer": ["x", value]}) is None
    assert format_columns(FORMATTER, {"question": ["a"], "answer": ["x"]}) is None  # no context column
    for prompt in ("{question:>5}\n", "{question!r}\n"):  # a format spec, a conversion
        assert format_columns(RowFormatter(dataclasses.replace(FMT, prompt=prompt)), base) is None
    assert format_columns(RowFormatter(dataclasses.replace(FMT, style="chat")), base) is None
    # the per-row formatter's answers for those rows, which the build then uses
    texts, starts, kept, bad = per_row(FORMATTER, {**base, "question": ["a", None], "answer": [7, "y"]})
    assert (texts, starts, kept, bad) == (["Q: a\n{schema} c\n7"], [16], [0], [(1, "field 'question' is null")])


def test_the_worker_makes_the_same_documents_and_bad_rows_column_wise(tmp_path, monkeypatch):
    tokenizer = make_tokenizer(tmp_path / "model") / "tokenizer.json"
    import hashlib

    sha = hashlib.sha256(tokenizer.read_bytes()).hexdigest()
    columns = {"question": ["How many heads?", "x", "Ça va ?", "SEL", "q"],
               "context": ["CREATE TABLE t (a INT)", "y", "é", "z", "w"],
               "answer": ["SELECT count(*) FROM t", "  ", "SELECT 1", "ECT 2", "SELECT 3"]}
    glued = RowFormatter(FormatConfig(prompt="{question}", answer="{answer}"))  # "SEL" + "ECT 1": inside a token
    for formatter, check_rows, val_fraction in ((FORMATTER, 5, 0.0), (FORMATTER, 0, 0.5), (FORMATTER, 2, 0.5),
                                                (glued, 5, 0.5)):
        task = worker.EncodeTask(str(tokenizer), sha, formatter, 2, (1,), val_fraction, "uint16",
                                 fast_encoder="fastokens", check_rows=check_rows)
        column_wise = worker.encode_rows(task, columns)
        with monkeypatch.context() as m:
            m.setattr(worker, "format_columns", lambda *_: None)
            row_wise = worker.encode_rows(task, columns)
        for f in dataclasses.fields(column_wise):
            a, b = getattr(column_wise, f.name), getattr(row_wise, f.name)
            assert (np.array_equal(a, b) and a.dtype == b.dtype) if isinstance(a, np.ndarray) else a == b, f.name
        assert column_wise.bad_rows[0] == (1, "the answer is empty")
        assert column_wise.by_shortcut > 0 and len(column_wise.lengths) >= 3
    assert column_wise.bad_rows == [(1, "the answer is empty"), (3, worker.PROMPT_BOUNDARY)]  # the HF tokenizer's
