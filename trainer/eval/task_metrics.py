"""Per-expert task metrics: pure functions from (generated answer, reference answer) to numbers.

Which metrics an expert gets (``train.task_metric``; ``auto`` picks by the expert's name, its part
before any ``.stage``):

- ``sql``: ``parses`` (sqlglot parses it as one statement: a query, an insert/update/delete, a
  create/drop/alter) and ``exact_match`` after normalizing both sides with
  sqlglot (keywords, spacing, quoting and a trailing ``;`` do not count)::

      >>> normalize_sql("select  name from T where ID=1;")
      'SELECT name FROM T WHERE ID = 1'
      >>> score("sql", "SELECT name FROM T WHERE ID = 1", "select name from T where ID=1;")
      {'parses': True, 'exact_match': True}

- ``json``: ``parses`` and ``exact_match`` of the parsed values (key order and spacing do not count)::

      >>> score("json", '{"b": [1, 2], "a": null}', '{"a": null, "b": [1,2]}')
      {'parses': True, 'exact_match': True}

- ``exact`` (neo4j, typescript and any other expert): ``exact_match`` of the whitespace-normalized
  texts (runs of whitespace become one space, ends stripped, a trailing ``;`` dropped)::

      >>> score("exact", "MATCH (n)\\n  RETURN n;", "MATCH (n) RETURN n")
      {'exact_match': True}
"""

from __future__ import annotations

import json
import re
from typing import Literal

Metric = Literal["sql", "json", "exact"]
KNOWN_EXPERTS: dict[str, Metric] = {"sql": "sql", "json": "json", "neo4j": "exact", "typescript": "exact"}


def metric_for(expert: str, configured: str = "auto") -> Metric:
    """The metric family of ``expert``: ``configured`` unless ``auto``, else by name (``sql.stage2`` is sql)."""
    if configured != "auto":
        return configured  # type: ignore[return-value]
    return KNOWN_EXPERTS.get(expert.split(".")[0], "exact")


def normalize_text(text: str) -> str:
    """Whitespace runs -> one space, ends stripped, one trailing ``;`` dropped."""
    text = re.sub(r"\s+", " ", text).strip()
    return text[:-1].rstrip() if text.endswith(";") else text


def normalize_sql(text: str) -> str | None:
    """The SQL as sqlglot writes it back (one statement, canonical keywords and spacing); None when
    it does not parse as exactly one statement."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    STATEMENTS = (exp.Query, exp.DML, exp.DDL, exp.Drop, exp.Alter)  # a query, a change, a definition

    text = text.strip().rstrip(";").strip()
    if not text:
        return None
    try:
        statements = sqlglot.parse(text, error_level=sqlglot.ErrorLevel.RAISE)
    except (SqlglotError, RecursionError, ValueError):
        return None
    if len(statements) != 1 or not isinstance(statements[0], STATEMENTS):
        return None  # sqlglot reads any bare word as a column ("SELEC name": column SELEC, alias name)
    return statements[0].sql(pretty=False)


def parse_json(text: str) -> tuple[bool, object]:
    """(parses, value) of a JSON text."""
    try:
        return True, json.loads(text)
    except (ValueError, RecursionError):
        return False, None


def score(metric: Metric, answer: str, reference: str) -> dict[str, bool]:
    """The metrics of one answer against its reference."""
    if metric == "sql":
        ours, theirs = normalize_sql(answer), normalize_sql(reference)
        match = ours == theirs if ours is not None and theirs is not None else normalize_text(answer) == normalize_text(reference)
        return {"parses": ours is not None, "exact_match": match}
    if metric == "json":
        ok, value = parse_json(answer)
        ref_ok, expected = parse_json(reference)
        match = ok and ref_ok and value == expected if ref_ok else normalize_text(answer) == normalize_text(reference)
        return {"parses": ok, "exact_match": bool(match)}
    return {"exact_match": normalize_text(answer) == normalize_text(reference)}


def aggregate(scores: list[dict[str, bool]]) -> dict[str, float]:
    """The mean of every metric over the examples (``{"exact_match": 0.5, ...}``); {} for none."""
    if not scores:
        return {}
    return {key: sum(s[key] for s in scores) / len(scores) for key in scores[0]}
