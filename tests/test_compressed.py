"""Compressed data files (``.jsonl.gz``, ``.json.bz2``, ``.csv.xz``, ...) and TSV: each gives the rows its
uncompressed file gives, in load_dataset's number and order, and the same shards; a damaged or
mislabelled one is a one-line SourceError naming the file and the fix. Before, every one of them
stopped the build with "unsupported file type"."""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import lzma
import tracemalloc

import pytest
from build_fixtures import make_tokenizer, seed_decision

from packtrain.core.config_sources import SourceConfig
from packtrain.core.configfile import load_config
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.read.discover import SourceError, resolve_source
from packtrain.pipeline.read.sources import iter_batches

COMPRESS = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}
FORMATS = ("jsonl", "json", "csv", "tsv")
COLUMNS = ["question", "answer", "n"]
# cells CSV and TSV must quote (a comma, a tab, a quote, a line break), non-ASCII text, text that looks like a number
ROWS = [{"question": f"q{i}, \"why\"\tnot? é ✓", "answer": f"SELECT {i}\nFROM t  -- x", "n": f"00{i}"}
        for i in range(40)]


def text(fmt: str, rows: list[dict] = ROWS) -> str:
    if fmt == "jsonl":
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if fmt == "json":
        return json.dumps(rows, ensure_ascii=False, indent=1)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), delimiter="\t" if fmt == "tsv" else ",")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def read(path, columns=COLUMNS, batch_rows=7) -> list[tuple[int, dict]]:
    return [(b.start, b.columns) for b in iter_batches(resolve_source(SourceConfig(name=str(path))), columns, batch_rows)]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("comp", COMPRESS)
def test_a_compressed_file_gives_the_batches_of_the_file_uncompressed_and_load_datasets_rows(tmp_path, fmt, comp):
    import datasets

    plain, packed = tmp_path / f"rows.{fmt}", tmp_path / f"rows.{fmt}.{comp}"
    plain.write_text(text(fmt), encoding="utf-8")
    packed.write_bytes(COMPRESS[comp](text(fmt).encode()))
    got = read(packed)
    assert got == read(plain)
    assert [q for _, columns in got for q in columns["question"]] == [r["question"] for r in ROWS]
    builder, kwargs = ("csv", {"sep": "\t"} if fmt == "tsv" else {}) if fmt in ("csv", "tsv") else ("json", {})
    reference = datasets.load_dataset(builder, data_files=str(packed), split="train",
                                      cache_dir=str(tmp_path / "datasets-cache"), **kwargs)
    assert reference["question"] == [q for _, columns in got for q in columns["question"]]


def test_tsv_is_csv_with_tabs(tmp_path):
    (tmp_path / "rows.tsv").write_text("question\tanswer\nq,1\t\"a\tb\nc\"\n", encoding="utf-8")
    assert read(tmp_path / "rows.tsv", ["question", "answer"]) == [(0, {"question": ["q,1"], "answer": ["a\tb\nc"]})]


def test_json_lines_read_line_by_line_compressed(tmp_path):
    """Types that change between rows send JSON lines to the line-by-line reader (and its key search)."""
    rows = [{"question": f"q{i}", "answer": i if i % 2 else [f"s{i}", 1.5]} for i in range(30)]
    (tmp_path / "mixed.jsonl").write_text(text("jsonl", rows))
    for comp, compress in COMPRESS.items():
        path = tmp_path / f"mixed.jsonl.{comp}"
        path.write_bytes(compress(text("jsonl", rows).encode()))
        assert read(path, ["question", "answer"]) == read(tmp_path / "mixed.jsonl", ["question", "answer"])
        with pytest.raises(SourceError, match=rf"mixed.jsonl.{comp}: no column 'answr' \(did you mean 'answer'\?\) \(it has: 'question', 'answer'\)"):
            read(path, ["question", "answr"])


def test_the_key_search_of_a_compressed_file_finds_keys_across_its_chunks(tmp_path):
    from packtrain.pipeline.read.json_files import _absent_keys

    keys = ["question", "a\"b", "é✓", "\U0001f600x"]
    line = json.dumps(dict.fromkeys(keys, 1)) + "\n"  # ensure_ascii: every non-ASCII key written escaped
    path = tmp_path / "k.jsonl.gz"
    path.write_bytes(gzip.compress((line * 3).encode()))
    for chunk_bytes in (1, 2, 3, 5, 7, 11, 64, 1 << 20):  # every key split at every place
        assert _absent_keys(path, keys + ["answr"], chunk_bytes) == ["answr"], chunk_bytes


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("comp", COMPRESS)
def test_a_damaged_or_mislabelled_compressed_file_is_one_line_naming_it_and_the_fix(tmp_path, fmt, comp):
    data = COMPRESS[comp](text(fmt, ROWS * 50).encode())
    cut, plain = tmp_path / f"cut.{fmt}.{comp}", tmp_path / f"plain.{fmt}.{comp}"
    cut.write_bytes(data[: len(data) * 2 // 3])
    plain.write_text(text(fmt))  # not compressed, whatever its name says
    name = {"gz": "gzip", "bz2": "bz2", "xz": "xz"}[comp]
    for path in (cut, plain):
        with pytest.raises(SourceError) as e:
            read(path)
        message = str(e.value)
        assert "\n" not in message
        assert message.startswith(f"{path}: cannot be read as {name}-compressed {fmt} (")
        assert message.endswith(f"the file may be damaged, cut short, or not {name} data: re-download or regenerate "
                                f"it, rename it without .{comp} if it is not compressed, or remove it from the source")


def test_reading_a_large_compressed_file_holds_one_chunk_not_the_file(tmp_path):
    """40 MB of JSON lines (types that change between rows: the line-by-line reader, after the key
    search) in a gzip file: never decompressed whole."""
    line = json.dumps({"question": "q" * 400, "answer": 1}) + "\n" + json.dumps({"question": "q", "answer": "a"}) + "\n"
    path = tmp_path / "big.jsonl.gz"
    with gzip.open(path, "wt", compresslevel=1) as f:
        for _ in range(100_000):
            f.write(line)
    tracemalloc.start()
    try:
        rows = sum(len(b.columns["question"]) for b in iter_batches(resolve_source(SourceConfig(name=str(path))),
                                                                    ["question", "answer"], 500))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rows == 200_000
    assert peak < 6 * 2**20, peak  # the file holds 46 MB


SQL = """\
sources:
  - name: {data}
format:
  prompt: "Q: {{question}} ({{n}})\\nA: "
  answer: "{{answer}}"
model:
  name: {model}
build:
  num_proc: 1
pack:
  val_fraction: 0.1
"""


@pytest.mark.parametrize("fmt,comp", [("jsonl", "gz"), ("json", "bz2"), ("csv", "xz"), ("tsv", "gz")])
def test_a_build_from_a_compressed_file_writes_the_shards_of_the_file_uncompressed(tmp_path, fmt, comp):
    model = make_tokenizer(tmp_path / "model")
    shards = []
    for name in (f"rows.{fmt}", f"rows.{fmt}.{comp}"):
        data, configs = tmp_path / name / name, tmp_path / name / "configs"
        configs.mkdir(parents=True)
        data.write_bytes(COMPRESS[comp](text(fmt).encode()) if name.endswith(comp) else text(fmt).encode())
        (configs / "sql.yaml").write_text(SQL.format(data=data, model=model))
        seed_decision(tmp_path / name / "cache", model)  # the fast-encoder decision, proved once per run
        result = build(load_config("sql", configs), tmp_path / name / "cache", log=lambda *_: None, progress=False)
        shards.append({p.name: p.read_bytes() for p in sorted(result.path.glob("*.arrow"))})
    assert shards[0] == shards[1] and set(shards[0]) == {"train-00000.arrow", "val-00000.arrow"}


@pytest.mark.parametrize("name", ["rows.csv", "rows.tsv.gz"])
def test_a_csv_row_longer_than_pyarrows_block_is_read(tmp_path, name):
    """A cell of several MB (a whole file's code in one row): pyarrow's CSV reader refuses a row longer than
    its 1 MiB block ("straddling object straddles two block boundaries"), which stopped the build as a
    damaged file; load_dataset reads it. Read again from that row with a larger block, twice here."""
    rows = [{"question": f"q{i}", "answer": "x\n" * (size << 19), "n": str(i)}
            for i, size in enumerate((0, 2, 0, 0, 5, 0))]  # 2 MB, then 5 MB: a block of 4, then 16 MiB
    data = text("tsv" if ".tsv" in name else "csv", rows).encode()
    (tmp_path / name).write_bytes(gzip.compress(data, compresslevel=1) if name.endswith(".gz") else data)
    got = read(tmp_path / name, batch_rows=4)
    assert [start for start, _ in got] == [0, 4]
    assert [a for _, columns in got for a in columns["answer"]] == [r["answer"] for r in rows]
    assert [q for _, columns in got for q in columns["question"]] == [r["question"] for r in rows]


@pytest.mark.parametrize("comp", COMPRESS)
def test_compressed_data_named_as_plain_text_is_one_line_saying_to_rename_it(tmp_path, comp):
    """gzip's bytes named train.jsonl (load_dataset reads a file by its first bytes; packtrain by its name)
    said 'cannot be read as jsonl (UnicodeDecodeError ...); check the file', or that line 1 is not JSON."""
    name = {"gz": "gzip", "bz2": "bz2", "xz": "xz"}[comp]
    for fmt in FORMATS:
        path = tmp_path / f"rows.{fmt}"
        path.write_bytes(COMPRESS[comp](text(fmt).encode()))
        with pytest.raises(SourceError) as e:
            read(path)
        assert str(e.value) == (f"{path}: holds {name}-compressed data, not {fmt} text; rename it rows.{fmt}.{comp} (a "
                                "compressed file is read as its name says), or decompress it")
    path.write_text("BZh9 is text\tanswer\tn\n")  # a plain file that starts like one: read as it is
    assert read(path, ["n"]) == []
