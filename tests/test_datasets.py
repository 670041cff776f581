"""The real datasets of docs/DATASETS.md (Spider for sql, text2cypher for neo4j) build with the
documented config snippets: small fixtures of the same shapes, written here (never ../shared/data)."""

from __future__ import annotations

import csv
import json

from build_fixtures import make_tokenizer, seed_decision
from tokenizers import Tokenizer

from packtrain.core.configfile import load_config
from packtrain.core.shardfile import open_shard
from packtrain.pipeline.orchestrate.build import build
from packtrain.pipeline.read.discover import resolve_source
from packtrain.core.config_sources import SourceConfig
from packtrain.pipeline.read.sources import iter_batches

# The snippets of docs/DATASETS.md, with the dataset paths and the tokenizer filled in by the test.
SPIDER = """\
sources:
  - name: {data}/spider/train_spider.json
    columns: {{answer: query}}
format:
  prompt: "### Database\\n{{db_id}}\\n\\n### Question\\n{{question}}\\n\\n### SQL\\n"
  answer: "{{answer}}"
model:
  name: {model}
build:
  num_proc: 1
pack:
  val_fraction: 0.0
"""
TEXT2CYPHER = """\
sources:
  - name: {data}/text2cypher/text2cypher_gpt4turbo.csv
format:
  prompt: "### Graph database\\n{{database}}\\n\\n### Question\\n{{question}}\\n\\n### Cypher\\n"
  answer: "{{cypher}}"
model:
  name: {model}
build:
  num_proc: 1
pack:
  val_fraction: 0.0
"""

CYPHER = "MATCH (u:User)-[r:INTERACTED]->(:User)\nWHERE r.weight > 5\nRETURN u.label, \"x, y\" AS tag\nLIMIT 5"


def write_fixtures(root):
    (root / "spider").mkdir(parents=True)
    (root / "spider" / "train_spider.json").write_text(json.dumps([
        {"db_id": "department_management", "question": "How many heads of the departments are older than 56 ?",
         "query": "SELECT count(*) FROM head WHERE age  >  56"},
        {"db_id": "concert_singer", "question": "How many singers do we have?", "query": "SELECT count(*) FROM singer"},
        {"db_id": "concert_singer", "question": "How many singers do we have?", "query": "SELECT count(*) FROM singer"},
    ], indent=2))
    (root / "text2cypher").mkdir()
    with open(root / "text2cypher" / "text2cypher_gpt4turbo.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["question", "cypher", "type", "database", "syntax_error", "timeout", "returns_results",
                         "false_schema"])
        writer.writerow(["Top 5 users by interactions?", CYPHER, "Complex Retrieval Queries", "bluesky", "False",
                         "False", "True", ""])
        writer.writerow(["How many movies?", "MATCH (m:Movie)\nRETURN count(m)", "Simple", "recommendations",
                         "False", "False", "True", ""])
    with open(root / "text2cypher" / "text2cypher_schemas.csv", "w", newline="") as f:  # beside it, other columns
        csv.writer(f).writerows([["database", "schema", "structured_schema"], ["bluesky", "Node properties:\n- User", "{}"]])


def build_expert(tmp_path, expert: str, snippet: str):
    data = tmp_path / "data"
    if not data.exists():
        write_fixtures(data)
    model = make_tokenizer(tmp_path / "model")
    configs = tmp_path / "configs"
    configs.mkdir(exist_ok=True)
    (configs / f"{expert}.yaml").write_text(snippet.format(data=data, model=model))
    seed_decision(tmp_path / "cache", model)  # the fast-encoder decision, proved once per run
    result = build(load_config(expert, configs), tmp_path / "cache", log=lambda *_: None, progress=False)
    report = json.loads((result.path / "report.json").read_text())
    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    ids, mask, doc_lens = open_shard(result.path / "train-00000.arrow", 2048).arrays()
    docs, at = [], 0
    for n in doc_lens[0]:
        doc_ids, doc_mask = ids[0, at : at + n], mask[0, at : at + n]
        docs.append((tokenizer.decode(doc_ids.tolist(), skip_special_tokens=False),
                     tokenizer.decode(doc_ids[doc_mask == 1].tolist(), skip_special_tokens=False)))
        at += n
    return report, sorted(docs)


def test_spider_train_builds_with_the_documented_snippet(tmp_path):
    report, docs = build_expert(tmp_path, "sql", SPIDER)
    assert (report["train"]["documents"], report["duplicates"], report["bad_rows"]) == (2, 1, 0)
    assert docs[1] == ("### Database\ndepartment_management\n\n### Question\nHow many heads of the departments are "
                       "older than 56 ?\n\n### SQL\nSELECT count(*) FROM head WHERE age  >  56<|endoftext|>",
                       "SELECT count(*) FROM head WHERE age  >  56<|endoftext|>")


def test_text2cypher_builds_with_its_multi_line_quoted_cells(tmp_path):
    report, docs = build_expert(tmp_path, "neo4j", TEXT2CYPHER)
    assert (report["train"]["documents"], report["bad_rows"]) == (2, 0)
    assert docs[1] == ("### Graph database\nrecommendations\n\n### Question\nHow many movies?\n\n### Cypher\n"
                       "MATCH (m:Movie)\nRETURN count(m)<|endoftext|>", "MATCH (m:Movie)\nRETURN count(m)<|endoftext|>")
    assert docs[0][1] == CYPHER + "<|endoftext|>"


def test_csv_cells_spanning_lines_are_read_as_written(tmp_path):
    write_fixtures(tmp_path)
    source = resolve_source(SourceConfig(name=str(tmp_path / "text2cypher" / "text2cypher_gpt4turbo.csv")))
    batches = list(iter_batches(source, ["cypher", "false_schema"], batch_rows=10))
    assert batches[0].columns == {"cypher": [CYPHER, "MATCH (m:Movie)\nRETURN count(m)"], "false_schema": ["", ""]}


def test_a_csv_larger_than_one_reader_block_with_multi_line_cells(tmp_path):
    # pyarrow cuts a CSV into 1 MiB blocks at newlines; a quoted cell spanning a cut must stay whole
    path = tmp_path / "big.csv"
    cells = [f"MATCH (n:Node{{id: {i}}})\nWHERE n.score > {i % 97}\nRETURN n, \"a, b\" AS tag" + "\n// pad" * 12
             for i in range(8000)]
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([["question", "cypher"], *([f"q{i}", c] for i, c in enumerate(cells))])
    assert path.stat().st_size > 2**20
    batches = iter_batches(resolve_source(SourceConfig(name=str(path))), ["cypher"], batch_rows=1000)
    assert [cell for batch in batches for cell in batch.columns["cypher"]] == cells
