"""Round four (attack 52): hostile data files through the real ``packtrain pretokenize``.

Each case is a data file a user could hand packtrain (JSON lines a library wrote, parquet from another
tool, a directory with a broken link) that stopped the build with a traceback, crashed it, or lost rows
without a word. Each is now one ``error:`` line naming the file (and the line or row) and the fix, or a
counted bad row naming the field; the CLI is run in this process (tests/inprocess_cli.py), except where
the old behaviour was a crash of the process itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from build_fixtures import make_project, rows
from inprocess_cli import cli


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> dict:
    """configs/sql.yaml (the prompt reads context and question, the answer answer) over a local
    tokenizer, the cache holding its fast-encoder decision."""
    return make_project(tmp_path_factory.mktemp("project"))


def pretokenize(project: dict, data: Path, *more: str):
    return cli("pretokenize", "sql", "--configs-dir", project["configs"], "--cache-dir", project["cache"],
               "--dataset", data, "--no-progress", *more)


def one_error_line(result) -> str:
    """The one ``error:`` line a refused build prints last, with exit code 2 and no traceback."""
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert result.stderr.rstrip("\n").split("\n")[-1] == errors[0]
    return errors[0]


def jsonl(records: list[dict], last: str = "") -> str:
    return "".join(json.dumps(r) + "\n" for r in records) + last


# --- JSON that json.loads refuses with something else than a JSONDecodeError -----------------------

DEEP = "[" * 3000 + "]" * 3000  # Python's JSON reader stops at about 1,000 levels (pyarrow's reads it)


@pytest.mark.parametrize("value, problem", [
    (DEEP, "lists or objects nested deeper than Python's JSON reader goes (about 1,000 levels)"),
    ("9" * 5000, "an integer of more than 4,300 digits, which Python's JSON reader refuses"),
])
@pytest.mark.parametrize("suffix", ["jsonl", "json"])
def test_json_python_cannot_read_is_one_line_naming_the_line(project, tmp_path, value, problem, suffix):
    """A RecursionError and the integer-digits ValueError escaped the line's parse as tracebacks (only
    json.JSONDecodeError was caught), from the build's process or an encode worker."""
    data = tmp_path / f"rows.{suffix}"
    data.write_text(jsonl(rows(9), '{"question": "q", "context": "c", "answer": ' + value + '}\n'))
    assert one_error_line(pretokenize(project, data)) == (
        f"error: {data}, line 10: {problem}; fix or remove that line")


def test_a_json_array_file_python_cannot_read_is_one_line(project, tmp_path):
    data = tmp_path / "rows.json"
    data.write_text('[{"question": "q", "context": "c", "answer": ' + "9" * 5000 + "}]")
    assert one_error_line(pretokenize(project, data)) == (
        f"error: {data}: an integer of more than 4,300 digits, which Python's JSON reader refuses; fix the file")


# --- pyarrow's JSON reader never infers a field the build does not read -----------------------------


def test_a_field_nested_20000_deep_builds_and_does_not_crash_the_process(project, tmp_path):
    """pyarrow inferred every field's type, and inferring one nested about 10,000 levels deep crashed the
    build with a segmentation fault (exit -11, no word), also where the build reads no such field: a
    real process, so a crash is seen as one."""
    import subprocess
    import sys

    records = rows(10)
    data = tmp_path / "rows.jsonl"
    data.write_text(jsonl(records[:5]) + json.dumps(records[5])[:-1] + ', "meta": ' + "[" * 20000 + "]" * 20000
                    + "}\n" + jsonl(records[6:]))
    done = subprocess.run([sys.executable, "-m", "packtrain.cli", "pretokenize", "sql", "--configs-dir",
                           str(project["configs"]), "--cache-dir", str(project["cache"]), "--dataset", str(data),
                           "--no-progress", "--set", "pack.val_fraction=0"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "  train: 10 documents" in done.stdout + done.stderr


# --- text that is not UTF-8 ---------------------------------------------------------------------------

NOT_UTF8_FIX = ("not UTF-8 text; data files are read as UTF-8 (as datasets reads them): convert it (e.g. "
                "`iconv -f latin1 -t utf-8`) or remove it from the source")


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.jsonl.gz", "rows.csv"])
def test_latin1_text_is_one_line_naming_the_line_and_the_conversion(project, tmp_path, name):
    """pyarrow's JSON reader took latin-1 bytes as they were, and the worker that made the values stopped
    with a UnicodeDecodeError traceback; CSV's said "CSV conversion error to string: invalid UTF8 data"
    or a decoder's position in a chunk, without the line."""
    import csv
    import gzip
    import io

    records = rows(30) + [{"question": "café?", "context": "c", "answer": "SELECT 1"}]
    if name.endswith(".csv"):
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=["question", "context", "answer"], lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
        text, line = out.getvalue(), 32
    else:
        text, line = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), 31
    data = tmp_path / name
    raw = text.encode("latin-1")
    data.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    assert one_error_line(pretokenize(project, data)) == f"error: {data}, line {line} (byte 0xe9): {NOT_UTF8_FIX}"


def write_table(table, data: Path) -> None:
    """``table`` as a parquet file or an Arrow stream, by ``data``'s suffix."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if data.suffix == ".parquet":
        pq.write_table(table, data)
    else:
        with pa.ipc.new_stream(str(data), table.schema) as writer:
            writer.write_table(table)


@pytest.mark.parametrize("suffix", ["parquet", "arrow"])
def test_a_parquet_or_arrow_column_that_is_not_utf8_is_one_line_naming_the_column(project, tmp_path, suffix):
    import pyarrow as pa

    answers = pa.array([b"SELECT 1", b"caf\xe9"], pa.binary()).view(pa.string())  # written unchecked, as other tools can
    table = pa.table({"question": ["q1?", "q2?"], "context": ["c", "c"], "answer": answers})
    data = tmp_path / f"rows.{suffix}"
    write_table(table, data)
    assert one_error_line(pretokenize(project, data)) == (
        f"error: {data}: a text column holds bytes that are not UTF-8 (ArrowInvalid: column 'answer': Invalid UTF8 "
        f"sequence at string index 1); write the file again with that column's text decoded to UTF-8, or remove it "
        f"from the source")


# --- a template field's nested value that JSON has no text for ---------------------------------------


def test_a_struct_holding_a_timestamp_or_decimal_is_a_bad_row_naming_the_field(project, tmp_path):
    """A parquet struct or list field is written as compact JSON; a timestamp, date, decimal or bytes
    inside one stopped the build with json's TypeError traceback (a scalar one was already a bad row)."""
    import datetime
    import decimal

    import pyarrow as pa
    import pyarrow.parquet as pq

    good = [{"question": r["question"], "context": r["context"], "answer": {"sql": r["answer"], "at": None, "n": None}}
            for r in rows(8)]
    table = pa.Table.from_pylist(good + [
        {"question": "q8?", "context": "c", "answer": {"sql": "SELECT 8", "at": datetime.datetime(2024, 1, 1), "n": None}},
        {"question": "q9?", "context": "c", "answer": {"sql": "SELECT 9", "at": None, "n": decimal.Decimal("1.50")}}])
    data = tmp_path / "rows.parquet"
    pq.write_table(table, data)
    result = pretokenize(project, data, "--set", "pack.val_fraction=0")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((Path(json.loads(result.stdout.splitlines()[-1])["path"]) / "report.json").read_text())
    assert (report["bad_rows"], report["train"]["documents"]) == (2, 8)
    assert [row["reason"] for row in report["sources"][0]["first_bad_rows"]] == [
        "field 'answer' holds a datetime inside its list or object, which JSON has no text for; store that value as "
        "text or a number in the data",
        "field 'answer' holds a Decimal inside its list or object, which JSON has no text for; store that value as "
        "text or a number in the data"]


@pytest.mark.parametrize("suffix", ["parquet", "arrow"])
def test_a_column_named_twice_in_a_parquet_or_arrow_file_is_one_line(project, tmp_path, suffix):
    """pyarrow writes two columns of one name when given them; selecting it by name was a KeyError
    traceback ('Field "answer" exists 2 times in schema'). A CSV header naming it twice reads the first,
    as datasets (pandas) does."""
    import pyarrow as pa

    table = pa.Table.from_arrays([pa.array(["q?"]), pa.array(["c"]), pa.array(["SELECT 1"]), pa.array(["SELECT 2"])],
                                 names=["question", "context", "answer", "answer"])
    data = tmp_path / f"rows.{suffix}"
    write_table(table, data)
    assert one_error_line(pretokenize(project, data)) == (
        f"error: {data}: the column 'answer' appears 2 times in the file, so which one to read is not known; write "
        f"the file again with one column of each name, or map the field to another column with `columns:` under the "
        f"source")


# --- a file of the split that is not there ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["broken-link", "fifo"])
def test_a_file_of_the_split_that_cannot_be_read_is_named_not_left_out(project, tmp_path, kind):
    """A directory listed its regular files only: a data file that is a link to nothing (a blob on a disk
    not mounted) or a FIFO was left out of the source without a word, its rows never built. A broken link
    of another split is still only ignored."""
    import os

    source = tmp_path / "data"
    source.mkdir()
    (source / "train-0.jsonl").write_text(jsonl(rows(10)))
    os.symlink(tmp_path / "gone" / "test.jsonl", source / "test.jsonl")  # another split: ignored, as before
    if kind == "broken-link":
        os.symlink(tmp_path / "gone" / "b.jsonl", source / "train-1.jsonl")
        what = f"a link to {tmp_path / 'gone' / 'b.jsonl'}, which does not exist"
    else:
        os.mkfifo(source / "train-1.jsonl")
        what = "not a regular file (a FIFO, a device or a socket)"
    assert one_error_line(pretokenize(project, source)) == (
        f"error: {source / 'train-1.jsonl'}: a data file of split 'train' of {source} is {what}, so its rows cannot be "
        f"read; restore the file, or remove it from the directory")
    (source / "train-1.jsonl").unlink()
    assert pretokenize(project, source).returncode == 0


def test_a_source_that_is_a_fifo_says_so(project, tmp_path):
    """It said 'no data file for split 'train' among no files; set split: ...'."""
    import os

    os.mkfifo(tmp_path / "rows.jsonl")
    assert one_error_line(pretokenize(project, tmp_path / "rows.jsonl")) == (
        f"error: {tmp_path / 'rows.jsonl'}: not a regular file or a directory (a FIFO, a device or a socket); point "
        f"the source at a data file or a directory of them")


# --- a document whose encoding would not fit build.read_memory_mb -----------------------------------


@pytest.mark.parametrize("how", ["template", "where", "num_proc 2", "chat"])
def test_a_document_longer_than_the_encode_bound_is_one_line_naming_its_row(project, tmp_path, how):
    """A 50 MB JSON line (a fifth of the line bound) took a build past 13 GB before it was stopped: the
    model's tokenizer holds ~460 bytes per byte of text at one token per byte. A document may be at most
    build.read_memory_mb / 512 bytes of text (16 KiB under 8 here), refused before it is encoded, in the
    build's process or a worker, named by its row as read (a ``where`` keeps the numbering)."""
    records = rows(12)
    records[9]["answer"] = "SELECT " + "x, " * 6000
    records[2]["question"] = "drop me"
    text = "### Schema\n{context}\n### Question\n{question}\n### SQL\n{answer}".format(**records[9])
    data = tmp_path / "rows.jsonl"
    data.write_text(jsonl(records))
    more = {"template": [], "where": ["--set", "sources=[{name: %s, where: [{column: question, one_of: [%s]}]}]" % (
                data, ", ".join(json.dumps(r["question"]) for r in records if r["question"] != "drop me"))],
            "num_proc 2": ["--num-proc", "2"],
            "chat": ["--set", "format.style=chat"]}[how]
    args = ("--set", "build.read_memory_mb=8", *more)
    if how == "where":
        result = cli("pretokenize", "sql", "--configs-dir", project["configs"], "--cache-dir", project["cache"],
                     "--no-progress", *args)
    else:
        result = pretokenize(project, data, *args)
    line = one_error_line(result)
    if how == "chat":  # the chat template's text around the row: its size is the template's
        assert line.startswith(f"error: {data}:rows.jsonl#9: a document of 17.") and "more than 16.0 KiB" in line
        return
    assert line == (
        f"error: {data}:rows.jsonl#9: a document of {len(text) / 1024:.1f} KiB of text once formatted, more than 16.0 "
        f"KiB (build.read_memory_mb 8 / 512): the model's tokenizer holds up to 512 bytes per byte of text while it "
        f"encodes one (up to {len(text) * 512 / (1 << 20):.1f} MiB here), so it is not encoded; remove or split that "
        f"row, or raise build.read_memory_mb if this machine has the memory")


# --- a CSV quote that never closes ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rows.csv", "rows.tsv.gz"])
def test_a_csv_quote_that_never_closes_is_one_line_not_rows_swallowed(project, tmp_path, name):
    """pyarrow read an unclosed quoted cell to the end of the file: the 8 rows after it became part of
    one answer, and the build published 2 documents without a word (a file cut short in a quoted cell
    ends so). A quote inside an unquoted cell (5" tall) is text, as before."""
    import gzip

    sep = "\t" if ".tsv" in name else ","
    lines = ["question", "context", "answer"]
    text = sep.join(lines) + "\n" + "".join(sep.join([f"q{i} 5\" tall?", "c", f"SELECT {i}"]) + "\n" for i in range(2))
    text += sep.join(["q2?", "c", '"SELECT 2']) + "\n" + "".join(sep.join([f"q{i}?", "c", f"SELECT {i}"]) + "\n"
                                                                   for i in range(3, 11))
    data = tmp_path / name
    data.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    assert one_error_line(pretokenize(project, data)) == (
        f"error: {data}: a quoted cell of the row on line 4 is never closed, so every line after it was read as part "
        f"of that one cell; close its quote (a quote inside a quoted cell is written twice, \"\"), or remove that row "
        f"(a file cut short ends so: download it again)")
    data.write_bytes(text.replace('"SELECT 2', '"SELECT 2"').encode() if not name.endswith(".gz") else
                     gzip.compress(text.replace('"SELECT 2', '"SELECT 2"').encode()))
    assert pretokenize(project, data).returncode == 0


# --- a cache on a read-only file system ------------------------------------------------------------------


def test_a_cache_on_a_read_only_file_system_says_what_to_do(project, read_only_disk):
    """It was Python's ``[Errno 30] Read-only file system: '<cache>/sql'``, with no word of what to do."""
    disk, remount_read_only = read_only_disk  # tests/conftest.py
    remount_read_only()
    result = cli("pretokenize", "sql", "--configs-dir", project["configs"], "--cache-dir", disk, "--no-progress")
    assert one_error_line(result) == (
        f"error: {disk / 'sql'} cannot be written: it is on a read-only file system; point packtrain at a writable "
        f"place: --cache-dir (CACHE_DIR) for builds, train.output_dir for runs")


def test_an_access_error_says_what_to_do():
    from packtrain.core.errors import describe_error, error_text

    denied = PermissionError(13, "Permission denied", "/srv/cache/sql/.lock")
    assert error_text(denied) == ("/srv/cache/sql/.lock: Permission denied; give this user access to it, or point "
                                  "packtrain at a writable place: --cache-dir (CACHE_DIR) for builds, train.output_dir "
                                  "for runs")
    assert describe_error(denied).startswith("PermissionError: /srv/cache/sql/.lock: Permission denied; give")
    assert error_text(FileNotFoundError(2, "No such file or directory", "x")) == "[Errno 2] No such file or directory: 'x'"
