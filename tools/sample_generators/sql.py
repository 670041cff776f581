"""SQL samples: question + CREATE TABLE context (b-mc2/sql-create-context style) -> SQL query, over the
schemas of sql_schemas.py."""

from __future__ import annotations

import re
from random import Random

from sample_generators.common import CMP, Column, article, cap, plural
from sample_generators.sql_schemas import SQL_DOMAINS, Table


SHOW = ["What are the", "List the", "Show the", "Find the", "Give me the", "Return the", "Which are the"]


def sql_literal(value: str | float | int) -> str:
    return "'" + value.replace("'", "''") + "'" if isinstance(value, str) else str(value)


def nl_literal(value: str | float | int, rng: Random) -> str:
    if isinstance(value, str):
        return rng.choice(['"{}"', "'{}'", "{}"]).format(value)
    return str(value)


def condition(rng: Random, table: Table, alias: str = "", exclude: Column | None = None):
    """A random WHERE condition on ``table``: (sql, phrase after "with", phrase after "whose"), or None
    when the table has no column for it."""
    prefix = f"{alias}." if alias else ""
    options = [c for c in table.columns if c.kind in ("num", "text") and c is not exclude]
    if not options:
        return None
    col = rng.choice(options)
    value = col.value(rng)
    if col.kind == "num":
        op = rng.choice(list(CMP))
        words = rng.choice(CMP[op])
        return f"{prefix}{col.name} {op} {value}", f"{col.phrase} {words} {value}", f"{col.phrase} is {words} {value}"
    literal = nl_literal(value, rng)
    with_phrase = rng.choice([f"{col.phrase} {literal}", f"{col.phrase} equal to {literal}", f"the {col.phrase} {literal}"])
    return f"{prefix}{col.name} = {sql_literal(value)}", with_phrase, f"{col.phrase} is {literal}"


def pick_table(rng: Random, domain: list[Table], need: tuple[str, ...]) -> Table | None:
    def ok(t: Table) -> bool:
        return all({"label": t.label is not None, "num": bool(t.of("num")),
                    "cat": bool(t.groupable())}[n] for n in need)
    candidates = [t for t in domain if ok(t)]
    return rng.choice(candidates) if candidates else None


def sql_select_where(rng, domain):
    t = pick_table(rng, domain, ("label",))
    if not t or not (cond := condition(rng, t, exclude=t.label)):
        return None
    where, with_phrase, whose_phrase = cond
    cols = [t.label] + rng.sample([c for c in t.columns if c.kind in ("num", "text") and c is not t.label],
                                  k=rng.choice([0, 0, 1]))
    what = " and ".join(plural(c.phrase) if i == 0 else c.phrase for i, c in enumerate(cols))
    question = rng.choice([
        f"{rng.choice(SHOW)} {what} of {plural(t.singular)} whose {whose_phrase}.",
        f"{rng.choice(SHOW)} {what} of all {plural(t.singular)} with {with_phrase}.",
        f"Which {plural(t.singular)} have {with_phrase}? Give their {what}.",
        f"What are the {what} of {plural(t.singular)} with {with_phrase}?",
    ])
    return question, f"SELECT {', '.join(c.name for c in cols)} FROM {t.name} WHERE {where}", [t]


def sql_two_conditions(rng, domain):
    t = pick_table(rng, domain, ("label",))
    first = t and condition(rng, t, exclude=t.label)
    second = t and condition(rng, t, exclude=t.label)
    if not first or not second or first[0].split()[0] == second[0].split()[0]:
        return None
    joiner = rng.choice(["AND", "AND", "OR"])
    question = rng.choice([
        f"{rng.choice(SHOW)} {plural(t.label.phrase)} of {plural(t.singular)} whose {first[2]} {joiner.lower()} whose {second[2]}.",
        f"Which {plural(t.singular)} have {first[1]} {joiner.lower()} {second[1]}? List their {plural(t.label.phrase)}.",
    ])
    return question, f"SELECT {t.label.name} FROM {t.name} WHERE {first[0]} {joiner} {second[0]}", [t]


def sql_count(rng, domain):
    t = rng.choice(domain)
    cond = rng.random() < 0.7 and condition(rng, t)
    if not cond:
        question = rng.choice([f"How many {plural(t.singular)} are there?", f"Count the number of {plural(t.singular)}.",
                               f"What is the total number of {plural(t.singular)}?"])
        return question, f"SELECT COUNT(*) FROM {t.name}", [t]
    question = rng.choice([f"How many {plural(t.singular)} have {cond[1]}?",
                           f"Count the {plural(t.singular)} whose {cond[2]}.",
                           f"What is the number of {plural(t.singular)} with {cond[1]}?"])
    return question, f"SELECT COUNT(*) FROM {t.name} WHERE {cond[0]}", [t]


AGG = {"AVG": ["average", "mean"], "MAX": ["maximum", "highest", "largest"],
       "MIN": ["minimum", "lowest", "smallest"], "SUM": ["total", "sum of the"]}


def sql_aggregate(rng, domain):
    t = pick_table(rng, domain, ("num",))
    if not t:
        return None
    col = rng.choice(t.of("num"))
    if rng.random() < 0.25:
        question = rng.choice([f"What are the maximum and minimum {col.phrase} of all {plural(t.singular)}?",
                               f"Show the highest and lowest {col.phrase} among {plural(t.singular)}."])
        return question, f"SELECT MAX({col.name}), MIN({col.name}) FROM {t.name}", [t]
    fn = rng.choice(list(AGG))
    cond = rng.random() < 0.5 and condition(rng, t, exclude=col)
    question = f"What is the {rng.choice(AGG[fn])} {col.phrase} of {plural(t.singular)}"
    sql = f"SELECT {fn}({col.name}) FROM {t.name}"
    if cond:
        question += f" whose {cond[2]}"
        sql += f" WHERE {cond[0]}"
    return question + "?", sql, [t]


def sql_group(rng, domain):
    t = pick_table(rng, domain, ("cat",))
    if not t:
        return None
    cat = rng.choice(t.groupable())
    nums = t.of("num")
    if nums and rng.random() < 0.5:
        num, fn = rng.choice(nums), rng.choice(list(AGG))
        question = rng.choice([f"What is the {AGG[fn][0]} {num.phrase} for each {cat.phrase}?",
                               f"For each {cat.phrase}, show the {cat.phrase} and the {AGG[fn][0]} {num.phrase} of its {plural(t.singular)}."])
        return question, f"SELECT {cat.name}, {fn}({num.name}) FROM {t.name} GROUP BY {cat.name}", [t]
    question = rng.choice([f"How many {plural(t.singular)} are there for each {cat.phrase}?",
                           f"Show each {cat.phrase} and the number of {plural(t.singular)} with it.",
                           f"Count the {plural(t.singular)} per {cat.phrase}."])
    return question, f"SELECT {cat.name}, COUNT(*) FROM {t.name} GROUP BY {cat.name}", [t]


def sql_having(rng, domain):
    t = pick_table(rng, domain, ("cat",))
    if not t:
        return None
    cat = rng.choice(t.groupable())
    n = rng.randint(1, 12)
    if rng.random() < 0.4:
        question = rng.choice([f"Which {cat.phrase} has the most {plural(t.singular)}?",
                               f"What is the most common {cat.phrase} among {plural(t.singular)}?"])
        return question, f"SELECT {cat.name} FROM {t.name} GROUP BY {cat.name} ORDER BY COUNT(*) DESC LIMIT 1", [t]
    op = rng.choice([">", ">="])
    question = rng.choice([f"Which {plural(cat.phrase)} have {CMP[op][0]} {n} {plural(t.singular)}?",
                           f"List the {plural(cat.phrase)} shared by {CMP[op][1]} {n} {plural(t.singular)}."])
    return question, f"SELECT {cat.name} FROM {t.name} GROUP BY {cat.name} HAVING COUNT(*) {op} {n}", [t]


def sql_order(rng, domain):
    t = pick_table(rng, domain, ("label", "num"))
    if not t:
        return None
    num = rng.choice(t.of("num"))
    desc = rng.random() < 0.6
    word = "highest" if desc else "lowest"
    direction = " DESC" if desc else rng.choice(["", " ASC"])
    shape = rng.random()
    if shape < 0.35:
        question = rng.choice([f"What is the {t.label.phrase} of the {t.singular} with the {word} {num.phrase}?",
                               f"Which {t.singular} has the {word} {num.phrase}? Give its {t.label.phrase}."])
        return question, f"SELECT {t.label.name} FROM {t.name} ORDER BY {num.name}{direction} LIMIT 1", [t]
    if shape < 0.7:
        k = rng.randint(2, 10)
        question = rng.choice([f"List the {plural(t.label.phrase)} of the {k} {plural(t.singular)} with the {word} {num.phrase}.",
                               f"Show the top {k} {plural(t.singular)} by {'' if desc else 'lowest '}{num.phrase}."])
        return question, f"SELECT {t.label.name} FROM {t.name} ORDER BY {num.name}{direction} LIMIT {k}", [t]
    order = "descending" if desc else "ascending"
    question = rng.choice([f"List the {t.label.phrase} and {num.phrase} of all {plural(t.singular)}, sorted by {num.phrase} in {order} order.",
                           f"Show every {t.singular}'s {t.label.phrase} and {num.phrase}, ordered by {num.phrase} {order}."])
    return question, f"SELECT {t.label.name}, {num.name} FROM {t.name} ORDER BY {num.name}{direction}", [t]


def sql_distinct(rng, domain):
    t = pick_table(rng, domain, ("cat",))
    if not t:
        return None
    cat = rng.choice(t.groupable())
    question = rng.choice([f"What are the distinct {plural(cat.phrase)} of {plural(t.singular)}?",
                           f"List all the different {plural(cat.phrase)} that {plural(t.singular)} have.",
                           f"How many different {plural(cat.phrase)} are there among {plural(t.singular)}?"])
    if question.startswith("How many"):
        return question, f"SELECT COUNT(DISTINCT {cat.name}) FROM {t.name}", [t]
    return question, f"SELECT DISTINCT {cat.name} FROM {t.name}", [t]


def sql_between_like(rng, domain):
    t = pick_table(rng, domain, ("label",))
    if not t:
        return None
    if t.of("num") and rng.random() < 0.5:
        num = rng.choice(t.of("num"))
        a, b = sorted((num.value(rng), num.value(rng)))
        if a == b:
            return None
        question = rng.choice([f"{rng.choice(SHOW)} {plural(t.label.phrase)} of {plural(t.singular)} with {num.phrase} between {a} and {b}.",
                               f"Which {plural(t.singular)} have {article(num.phrase)} from {a} to {b}?"])
        return question, f"SELECT {t.label.name} FROM {t.name} WHERE {num.name} BETWEEN {a} AND {b}", [t]
    text = rng.choice(t.of("text"))
    sample = str(text.value(rng))
    words = re.findall(r"[A-Za-zÀ-ÿ]{3,}", sample)
    if not words:
        return None
    word = rng.choice(words)
    if rng.random() < 0.5:
        question = f"Which {plural(t.singular)} have {article(text.phrase)} containing '{word}'? Show their {plural(t.label.phrase)}."
        return question, f"SELECT {t.label.name} FROM {t.name} WHERE {text.name} LIKE '%{word}%'", [t]
    start = word[: rng.randint(1, 3)]
    question = f"{rng.choice(SHOW)} {plural(t.label.phrase)} of {plural(t.singular)} whose {text.phrase} starts with '{start}'."
    return question, f"SELECT {t.label.name} FROM {t.name} WHERE {text.name} LIKE '{start}%'", [t]


def sql_subquery(rng, domain):
    t = pick_table(rng, domain, ("label", "num"))
    if not t:
        return None
    num = rng.choice(t.of("num"))
    op = rng.choice([">", "<"])
    word = "above" if op == ">" else "below"
    question = rng.choice([f"{rng.choice(SHOW)} {plural(t.label.phrase)} of {plural(t.singular)} whose {num.phrase} is {word} the average.",
                           f"Which {plural(t.singular)} have {article(num.phrase)} {word} the average {num.phrase} of all {plural(t.singular)}?"])
    return question, f"SELECT {t.label.name} FROM {t.name} WHERE {num.name} {op} (SELECT AVG({num.name}) FROM {t.name})", [t]


def fk_edges(domain: list[Table]) -> list[tuple[Table, Column, Table]]:
    """(child, foreign-key column, parent) for every foreign key whose parent has a key column."""
    by_name = {t.name: t for t in domain}
    return [(t, c, by_name[c.ref]) for t in domain for c in t.of("fk") if by_name[c.ref].key]


def sql_membership(rng, domain):
    edges = [e for e in fk_edges(domain) if e[2].label]
    if not edges:
        return None
    child, fk, parent = rng.choice(edges)
    if rng.random() < 0.5 or not (cond := condition(rng, child)):
        question = rng.choice([f"Which {plural(parent.singular)} have no {plural(child.singular)}? Give their {plural(parent.label.phrase)}.",
                               f"List the {plural(parent.label.phrase)} of {plural(parent.singular)} that do not appear in any {child.singular}."])
        return question, (f"SELECT {parent.label.name} FROM {parent.name} WHERE {parent.key.name} NOT IN "
                          f"(SELECT {fk.name} FROM {child.name})"), [parent, child]
    question = f"{rng.choice(SHOW)} {plural(parent.label.phrase)} of {plural(parent.singular)} that have at least one {child.singular} with {cond[1]}."
    return question, (f"SELECT {parent.label.name} FROM {parent.name} WHERE {parent.key.name} IN "
                      f"(SELECT {fk.name} FROM {child.name} WHERE {cond[0]})"), [parent, child]


def sql_join(rng, domain):
    edges = fk_edges(domain)
    if not edges:
        return None
    child, fk, parent = rng.choice(edges)
    on = f"T1.{fk.name} = T2.{parent.key.name}"
    src = f"{child.name} AS T1 JOIN {parent.name} AS T2 ON {on}"
    shape = rng.random()
    if parent.label and shape < 0.35:
        question = rng.choice([f"How many {plural(child.singular)} does each {parent.singular} have? Show the {parent.label.phrase} and the count.",
                               f"For each {parent.singular}, list its {parent.label.phrase} and the number of {plural(child.singular)}."])
        return question, f"SELECT T2.{parent.label.name}, COUNT(*) FROM {src} GROUP BY T1.{fk.name}", [child, parent]
    if parent.label and shape < 0.55:
        question = rng.choice([f"What is the {parent.label.phrase} of the {parent.singular} with the most {plural(child.singular)}?",
                               f"Which {parent.singular} has the largest number of {plural(child.singular)}? Give its {parent.label.phrase}."])
        return question, (f"SELECT T2.{parent.label.name} FROM {src} GROUP BY T1.{fk.name} "
                          "ORDER BY COUNT(*) DESC LIMIT 1"), [child, parent]
    target = child.label or next((c for c in child.columns if c.kind in ("num", "text")), None)
    cond = condition(rng, parent, alias="T2")
    if not target or not cond:
        return None
    question = rng.choice([f"{rng.choice(SHOW)} {plural(target.phrase)} of {plural(child.singular)} whose {parent.singular}'s {cond[2]}.",
                           f"Find the {plural(target.phrase)} of the {plural(child.singular)} linked to {plural(parent.singular)} with {cond[1]}."])
    return question, f"SELECT T1.{target.name} FROM {src} WHERE {cond[0]}", [child, parent]


def sql_join3(rng, domain):
    edges = fk_edges(domain)
    pairs = [(a, b) for a in edges for b in edges if a is not b and a[0] is b[0] and a[2] is not b[2]]
    if not pairs:
        return None
    (bridge, fk1, left), (_, fk2, right) = rng.choice(pairs)
    if not left.label or not (cond := condition(rng, right, alias="T3")):
        return None
    src = (f"{left.name} AS T1 JOIN {bridge.name} AS T2 ON T1.{left.key.name} = T2.{fk1.name} "
           f"JOIN {right.name} AS T3 ON T2.{fk2.name} = T3.{right.key.name}")
    question = rng.choice([
        f"{rng.choice(SHOW)} {plural(left.label.phrase)} of {plural(left.singular)} connected through {plural(bridge.singular)} to {plural(right.singular)} with {cond[1]}.",
        f"Which {plural(left.singular)} have {plural(bridge.singular)} involving {article(right.singular)} whose {cond[2]}? List their {plural(left.label.phrase)}.",
    ])
    distinct = "DISTINCT " if rng.random() < 0.5 else ""
    return question, f"SELECT {distinct}T1.{left.label.name} FROM {src} WHERE {cond[0]}", [left, bridge, right]


SQL_SHAPES = [
    (sql_select_where, 14), (sql_two_conditions, 6), (sql_count, 9), (sql_aggregate, 9), (sql_group, 8),
    (sql_having, 6), (sql_order, 10), (sql_distinct, 4), (sql_between_like, 7), (sql_subquery, 5),
    (sql_membership, 5), (sql_join, 11), (sql_join3, 6),
]


def sql_row(rng: Random) -> dict:
    shapes, weights = zip(*SQL_SHAPES)
    while True:
        domain = rng.choice(SQL_DOMAINS)
        made = rng.choices(shapes, weights)[0](rng, domain)
        if made:
            break
    question, answer, used = made
    extra = [t for t in domain if t not in used]
    extra = rng.sample(extra, k=min(len(extra), rng.choice([0, 0, 0, 1, 1, 2, 3, 5])))
    tables = [t for t in domain if t in used or t in extra]  # schema order, as a database dump lists them
    return {"question": cap(question), "context": ", ".join(t.create() for t in tables), "answer": answer}
