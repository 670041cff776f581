"""Reading rows, streamed: every format, exact batches, max_rows, clear errors, no network."""

from __future__ import annotations

import json
import pickle
import socket

import pytest
from conftest import SQL_ROWS

from packtrain.core.config_sources import SourceConfig
from packtrain.core.resolve import resolve_model_dir
from packtrain.pipeline.read.discover import SourceError, resolve_source
from packtrain.pipeline.read.sources import RowBatch, iter_batches


def read_all(source, columns, batch_rows=1000, max_rows=None):
    rows = []
    for batch in iter_batches(source, columns, batch_rows, max_rows):
        rows += [dict(zip(batch.columns, values)) for values in zip(*batch.columns.values())]
    return rows


def shape(batches):
    return [(b.file, b.start, b.num_rows) for b in batches]


def test_hub_json_array_rows_in_order_in_batches_of_two(hub_cache):
    source = resolve_source(SourceConfig(name="b-mc2/sql-create-context"))
    batches = list(iter_batches(source, ["question", "answer"], batch_rows=2))
    assert [b.start for b in batches] == [0, 2, 4]
    assert batches[0] == RowBatch("sql_create_context_v4.json", 0,
                                  {"question": ["q0", "q1"], "answer": ["SELECT x FROM t0", "SELECT x FROM t1"]})
    assert batches[2].columns == {"question": ["q4"], "answer": ["SELECT x FROM t4"]}
    assert read_all(source, ["question", "context", "answer"]) == SQL_ROWS


def test_max_rows(hub_cache):
    source = resolve_source(SourceConfig(name="b-mc2/sql-create-context"))
    batches = list(iter_batches(source, ["question"], batch_rows=2, max_rows=3))
    assert [b.columns["question"] for b in batches] == [["q0", "q1"], ["q2"]]
    assert list(iter_batches(source, ["question"], batch_rows=2, max_rows=0)) == []
    assert len(read_all(source, ["question"], max_rows=99)) == 5


def test_parquet_reads_only_the_requested_columns_in_the_requested_order(hub_cache):
    source = resolve_source(SourceConfig(name="org/parquet-ds"))
    batches = list(iter_batches(source, ["n", "text"], batch_rows=2))
    assert [(b.file, b.start, b.columns) for b in batches] == [
        ("data/train-00000-of-00001.parquet", 0, {"n": [0, 1], "text": ["t0", "t1"]}),
        ("data/train-00000-of-00001.parquet", 2, {"n": [2], "text": ["t2"]}),
    ]
    test = resolve_source(SourceConfig(name="org/parquet-ds", split="test"))
    assert read_all(test, ["text"]) == [{"text": "e0"}, {"text": "e1"}]


def test_datasets_cache_shards_batches_never_cross_a_file(prepared_dataset):
    source = resolve_source(SourceConfig(name="org/prepared-ds"))
    batches = list(iter_batches(source, ["question"], batch_rows=2))
    assert shape(batches) == [
        ("prepared-ds-train-00000-of-00002.arrow", 0, 2),
        ("prepared-ds-train-00000-of-00002.arrow", 2, 1),
        ("prepared-ds-train-00001-of-00002.arrow", 0, 2),
    ]
    assert [q for b in batches for q in b.columns["question"]] == ["q0", "q1", "q2", "q3", "q4"]
    assert shape(iter_batches(source, ["question"], batch_rows=2, max_rows=4)) == [
        ("prepared-ds-train-00000-of-00002.arrow", 0, 2),
        ("prepared-ds-train-00000-of-00002.arrow", 2, 1),
        ("prepared-ds-train-00001-of-00002.arrow", 0, 1),
    ]


def test_save_to_disk_rows(saved_datasets):
    ds = resolve_source(SourceConfig(name=str(saved_datasets.dataset)))
    assert read_all(ds, ["question", "context", "answer"]) == SQL_ROWS
    dd = resolve_source(SourceConfig(name=str(saved_datasets.dataset_dict), split="test"))
    assert shape(iter_batches(dd, ["answer"], batch_rows=2)) == [("test/data-00000-of-00001.arrow", 0, 2)]


@pytest.mark.parametrize("batch_rows", [1, 2, 3, 5, 7])
def test_every_batch_size_gives_the_same_rows(tmp_path, batch_rows):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in SQL_ROWS))
    source = resolve_source(SourceConfig(name=str(path)))
    batches = list(iter_batches(source, ["question"], batch_rows))
    assert [b.start for b in batches] == list(range(0, 5, batch_rows))
    assert all(b.num_rows == batch_rows for b in batches[:-1])
    assert [q for b in batches for q in b.columns["question"]] == ["q0", "q1", "q2", "q3", "q4"]


def test_jsonl_with_mixed_types_or_date_like_strings_reads_what_json_loads_reads(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"a": 1, "d": "2020-01-01"}\n\n{"a": "two", "d": "2020-01-02"}\n{"a": 3, "d": "x"}\n')
    source = resolve_source(SourceConfig(name=str(path)))
    assert read_all(source, ["a", "d"]) == [{"a": 1, "d": "2020-01-01"}, {"a": "two", "d": "2020-01-02"},
                                            {"a": 3, "d": "x"}]
    dates = tmp_path / "dates.jsonl"
    dates.write_text('{"d": "2020-01-01"}\n{"d": "2020-01-02"}\n')
    assert read_all(resolve_source(SourceConfig(name=str(dates))), ["d"]) == [{"d": "2020-01-01"}, {"d": "2020-01-02"}]


def test_jsonl_whose_types_change_after_the_first_block_is_read_once_in_order(tmp_path):
    path = tmp_path / "big.jsonl"
    n = 40_000  # > pyarrow's first 1 MB block; the last row changes the type of "a"
    path.write_text("".join(json.dumps({"a": i, "pad": "x" * 20}) + "\n" for i in range(n)) + '{"a": "last"}\n')
    values = [a for b in iter_batches(resolve_source(SourceConfig(name=str(path))), ["a"], 1000) for a in b.columns["a"]]
    assert values == list(range(n)) + ["last"]


def test_json_lines_in_a_json_file_and_csv_as_text(tmp_path):
    lines = tmp_path / "lines.json"
    lines.write_text('{"q": "a"}\n{"q": "b"}\n')
    assert read_all(resolve_source(SourceConfig(name=str(lines))), ["q"]) == [{"q": "a"}, {"q": "b"}]
    table = tmp_path / "t.csv"
    table.write_text('id,q,other\n007,"hello, world",1\n8,b,2\n')
    assert read_all(resolve_source(SourceConfig(name=str(table))), ["q", "id"]) == [
        {"q": "hello, world", "id": "007"}, {"q": "b", "id": "8"}]


@pytest.mark.parametrize("name, content", [
    ("rows.jsonl", '{"question": "q", "sql": "s"}\n'),
    ("rows.json", '[{"question": "q", "sql": "s"}]'),
    ("rows.csv", "question,sql\nq,s\n"),
])
def test_missing_column_names_the_file_the_field_and_the_columns_it_has(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    source = resolve_source(SourceConfig(name=str(path)))
    with pytest.raises(SourceError) as e:
        list(iter_batches(source, ["question", "answer"], 2))
    assert str(e.value).startswith(f"{path}: no column 'answer' (it has: 'question', 'sql'); ")
    assert "`columns: {field: column}` under the source in configs/<expert>.yaml" in str(e.value)


@pytest.mark.parametrize("name, content", [
    ("rows.jsonl", '{"q": "a"}\n{"q": "b"}\n{"q": "c"}\n'),
    ("mixed.jsonl", '{"q": "a"}\n{"q": 1}\n{"q": "c"}\n'),  # read line by line, the column found in no line first
    ("rows.json", '[{"q": "a"}, {"q": "b"}, {"q": "c"}]'),
    ("rows.csv", "q\na\nb\nc\n"),
])
def test_an_optional_column_a_file_lacks_is_null_in_every_row(tmp_path, name, content):
    """alpaca's ``input`` (format.prompt_no_input's field): a dataset without the column reads it as null,
    as axolotl reads a row without input; a required column it lacks is still refused."""
    path = tmp_path / name
    path.write_text(content)
    source = resolve_source(SourceConfig(name=str(path)))
    batches = list(iter_batches(source, ["q", "input"], 2, optional=["input"]))
    assert [b.columns["input"] for b in batches] == [[None, None], [None]]
    assert [q for b in batches for q in b.columns["q"]] == [q for q in ("a", 1 if name == "mixed.jsonl" else "b", "c")]
    with pytest.raises(SourceError, match=r"no column 'answer' \(it has: 'q'\); "):
        list(iter_batches(source, ["q", "input", "answer"], 2, optional=["input"]))


def test_missing_column_in_parquet_and_arrow(hub_cache, prepared_dataset):
    for name, has in [("org/parquet-ds", r"\(it has: 'text', 'n'\)"),  # nothing close
                      ("org/prepared-ds", r"\(did you mean 'answer'\?\) \(it has: 'question', 'context', 'answer'\)")]:
        with pytest.raises(SourceError, match=rf"\.(parquet|arrow): no column 'answer2' {has}"):
            list(iter_batches(resolve_source(SourceConfig(name=name)), ["answer2"], 2))


def test_bad_json_line_is_named(tmp_path):
    """Said where the batch's rows are used (its worker parses its lines: pipeline/read/json_rows.py), with
    the file and the line: the third line of a file after a blank one, read past the first batch."""
    path = tmp_path / "bad.jsonl"
    path.write_text('{"q": "a"}\n{"q": "b"}\n\n{"q": \n')
    batches = list(iter_batches(resolve_source(SourceConfig(name=str(path))), ["q"], 1))
    assert batches[0].columns["q"] == ["a"] and batches[1].columns["q"] == ["b"]
    with pytest.raises(SourceError, match=r"bad.jsonl, line 4: not valid JSON"):
        batches[2].columns["q"]
    with pytest.raises(SourceError, match=r"bad.jsonl, line 4: not valid JSON"):
        pickle.loads(pickle.dumps(batches[2].columns))["q"]  # as a worker gets it


def test_no_network_during_resolve_and_read(hub_cache, prepared_dataset, saved_datasets, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    for name, column in [("b-mc2/sql-create-context", "question"), ("org/parquet-ds", "text"),
                         ("org/prepared-ds", "answer"), (str(saved_datasets.dataset_dict), "answer")]:
        source = resolve_source(SourceConfig(name=name))
        source.fingerprint()
        assert read_all(source, [column])
    assert resolve_model_dir("org/tiny-model") == hub_cache.model.resolve()


@pytest.mark.parametrize("answers", [
    [{"name": "x", "age": 3}, {"age": 4.5, "city": "Paris"}],  # pyarrow: a struct with every key, nulls filled
    [3, 4.5],  # pyarrow: float64, so 3 would read as 3.0
])
def test_jsonl_objects_and_mixed_numbers_read_exactly_as_json_loads(tmp_path, answers):
    from packtrain.pipeline.read.discover import ResolvedSource
    from packtrain.pipeline.read.sources import iter_batches

    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"q": str(i), "answer": a}) + "\n" for i, a in enumerate(answers)))
    source = ResolvedSource("d", "local", "train", None, tmp_path, (path,))
    (batch,) = iter_batches(source, ["q", "answer"], batch_rows=10)
    assert batch.columns["answer"] == answers
    assert [json.dumps(a) for a in batch.columns["answer"]] == [json.dumps(a) for a in answers]


def test_a_column_no_line_holds_is_said_before_any_line_is_read(tmp_path):
    """A misspelt column in a JSON lines file pyarrow cannot read (here: a bad line) is said at once,
    not after every line was parsed: the bad line 3 is never reached."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "q", "answr": "a"}\n{"question": "q2", "answr": "b"}\n{not json\n')
    source = resolve_source(SourceConfig(name=str(path)))
    with pytest.raises(SourceError, match=r"rows\.jsonl: no column 'answer' \(did you mean 'answr'\?\) \(it has: 'question', 'answr'\); "):
        list(iter_batches(source, ["question", "answer"], 2))


@pytest.mark.parametrize("written", [
    '"\\u0061nswer"', '"answ\\u0065r"', '"\\u0061\\u006E\\u0073\\u0077\\u0065\\u0072"', '"answer" \t :',
])
def test_a_column_written_escaped_in_a_later_line_is_found(tmp_path, written):
    """The quick look for a column's key finds each way JSON writes it (escaped in either case, space
    before the colon): the line-by-line read then gives its value."""
    key = written if written.endswith(":") else written + ":"
    path = tmp_path / "rows.jsonl"
    path.write_text('{"question": "q"}\n{"question": 1}\n' + '{"question": "q3", ' + key + ' "a3"}\n')
    source = resolve_source(SourceConfig(name=str(path)))
    (batch,) = list(iter_batches(source, ["question", "answer"], 3))
    assert batch.columns == {"question": ["q", 1, "q3"], "answer": [None, None, "a3"]}


@pytest.mark.parametrize("key", ["answer", "a\"b", "back\\slash", "tab\there", "é", "\u2028", "q😀", "/x", "\x7f",
                                 "lone\ud800"])
def test_every_json_spelling_of_a_key_is_found_and_a_near_miss_is_not(key):
    from packtrain.pipeline.read.json_files import _json_key

    units = [u for ch in key for u in _utf16_units(ch)]
    spellings = {json.dumps(key), json.dumps(key, ensure_ascii=False), json.dumps(key).replace("/", "\\/"),
                 '"' + "".join(f"\\u{u:04X}" for u in units) + '"', '"' + "".join(f"\\u{u:04x}" for u in units) + '"'}
    for spelled in spellings:
        try:
            line = ("{" + spelled + " :1}").encode()
        except UnicodeEncodeError:  # a lone surrogate as itself: no UTF-8 text holds it
            continue
        assert json.loads(line) == {key: 1}, spelled  # a spelling json reads as this key
        assert _json_key(key).search(line), spelled
    near = key[:-1] + chr(ord(key[-1]) + 1)
    assert not _json_key(key).search(("{" + json.dumps(near) + ":1}").encode())
    assert not _json_key(key).search(("[" + json.dumps(key) + "]").encode())  # a value, not a key


def _utf16_units(ch: str) -> list[int]:
    data = ch.encode("utf-16-be", "surrogatepass")
    return [int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2)]


def test_a_worker_imports_neither_discover_nor_the_hub_client_for_json_lines():
    """A worker (pipeline/encode/pool.py) parses JSON lines (pipeline/read/json_rows.py) without importing
    discover, whose imports (huggingface_hub) cost each worker about a CPU second; a bad line still says why."""
    import subprocess
    import sys

    code = ("import sys, pickle, packtrain.pipeline.encode.pool\n"
            "from packtrain.pipeline.read.json_rows import JsonLines\n"
            "rows = pickle.loads(pickle.dumps(JsonLines('f.jsonl', ['{\"q\": 1}\\n'], [1], ['q'])))\n"
            "assert rows['q'] == [1]\n"
            "print(sorted(m for m in ('packtrain.pipeline.read.discover', 'huggingface_hub') if m in sys.modules))\n"
            "try:\n    JsonLines('f.jsonl', ['{'], [3], ['q'])['q']\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[]", "SourceError f.jsonl, line 3: not valid JSON (Expecting property name enclosed "
                                      "in double quotes); fix or remove that line"]
