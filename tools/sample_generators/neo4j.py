"""Cypher samples: question + graph schema (neo4j text2cypher style) -> Cypher query, over the graph
domains of neo4j_graphs.py."""

from __future__ import annotations

import json
import re
from random import Random

from sample_generators.common import CMP, Column, article, cap, plural
from sample_generators.neo4j_graphs import GRAPH_DOMAINS, Graph, Label, Rel


def prop_line(prop: Column, rng: Random, rel: bool = False) -> str:
    if prop.kind == "text":
        stats = f'Example: "{prop.value(rng)}"' if prop.pool or len(prop.values) > 5 or rng.random() < 0.7 else \
            f"Available options: {json.dumps(prop.values, ensure_ascii=False).replace(chr(34), chr(39))}"
    elif prop.type == "DATE":
        stats = f"Min: {int(prop.low)}-01-01, Max: {int(prop.high)}-12-31"
    elif prop.type == "LIST":
        stats = f"Min Size: 1, Max Size: {rng.randint(2, 9)}"
    elif prop.type == "BOOLEAN":
        stats = ""
    else:
        fmt = (lambda v: f"{v:g}") if prop.type == "FLOAT" else (lambda v: str(int(v)))
        stats = f"Min: {fmt(prop.low)}, Max: {fmt(prop.high)}"
    head = f"`{prop.name}: {prop.type}`" if rel else f"`{prop.name}`: {prop.type}"
    return f"  - {head} {stats}".rstrip()


def graph_schema(graph: Graph, labels: list[str], rng: Random) -> str:
    """The schema text for the given labels and every relationship among them, in neo4j's format."""
    lines = ["Node properties:"]
    for name in labels:
        lines.append(f"- **{name}**")
        lines.extend(prop_line(p, rng) for p in graph.labels[name].props)
    rels = [r for r in graph.rels if r.src in labels and r.dst in labels]
    lines.append("Relationship properties:")
    for r in rels:
        if r.prop:
            lines += [f"- **{r.type}**", prop_line(r.prop, rng, rel=True)]
    lines.append("The relationships:")
    lines.extend(f"(:{r.src})-[:{r.type}]->(:{r.dst})" for r in rels)
    return "\n".join(lines)


def var(label: str, taken: tuple[str, ...] = ()) -> str:
    v = label[0].lower()
    return v + "2" if v in taken else v


def cy_literal(value) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'" if isinstance(value, str) else str(value)


def cy_where(rng: Random, label: Label, v: str, exclude: Column | None = None):
    options = [p for p in label.props if p.kind in ("num", "text") and p is not exclude and p.type != "DATE"]
    options += [p for p in label.props if p.type == "BOOLEAN"]
    if not options:
        return None
    p = rng.choice(options)
    if p.type == "BOOLEAN":
        flag = rng.random() < 0.5
        return f"{v}.{p.name} = {'true' if flag else 'false'}", f"{p.name} set to {'true' if flag else 'false'}"
    if p.kind == "num":
        op = rng.choice([">", "<", ">=", "<="])
        value = p.value(rng)
        return f"{v}.{p.name} {op} {value}", f"{p.name} {rng.choice(CMP[op])} {value}"
    value = p.value(rng)
    if rng.random() < 0.2 and p.values:
        part = value[: rng.randint(2, 4)]
        verb, phrase = rng.choice([("STARTS WITH", "starting with"), ("CONTAINS", "containing")])
        return f"{v}.{p.name} {verb} {cy_literal(part)}", f"{p.name} {phrase} '{part}'"
    return f"{v}.{p.name} = {cy_literal(value)}", f"{p.name} '{value}'"


def cy_filter(rng, g):
    label = rng.choice(list(g.labels.values()))
    v = var(label.name)
    cond = cy_where(rng, label, v, exclude=None)
    if not cond:
        return None
    ret = label.display
    others = [p for p in label.props if p is not ret and p.kind == "num"]
    extra = rng.choice(others) if others and rng.random() < 0.4 else None
    returns = f"{v}.{ret.name}" + (f", {v}.{extra.name}" if extra else "")
    limit = rng.choice([None, None, 3, 5, 10])
    q = rng.choice([f"Which {label.name} nodes have {cond[1]}?", f"List the {ret.name} of every {label.name} with {cond[1]}.",
                    f"Find the {plural(label.name)} with {cond[1]}."])
    if limit:
        q = rng.choice([f"Show {limit} {plural(label.name)} with {cond[1]}.", f"List the first {limit} {label.name} nodes with {cond[1]}."])
    cypher = f"MATCH ({v}:{label.name})\nWHERE {cond[0]}\nRETURN {returns}" + (f"\nLIMIT {limit}" if limit else "")
    return q, cypher, [label.name]


def cy_lookup(rng, g):
    label = rng.choice(list(g.labels.values()))
    key = label.display
    if len(label.props) < 2:
        return None
    prop = rng.choice([p for p in label.props if p is not key])
    value = key.value(rng)
    v = var(label.name)
    q = rng.choice([f"What is the {prop.name} of the {label.name} with {key.name} '{value}'?",
                    f"Return the {prop.name} for {label.name} '{value}'."])
    return q, f"MATCH ({v}:{label.name} {{{key.name}: {cy_literal(value)}}})\nRETURN {v}.{prop.name}", [label.name]


def verb(rel_type: str, plural_subject: bool = False) -> str:
    """HAS_CATEGORY -> 'has category' (or 'have category' for a plural subject)."""
    first, *rest = rel_type.lower().split("_")
    if plural_subject:
        first = {"has": "have", "supplies": "supply"}.get(first, first[:-1] if re.search(r"[^su]s$", first) else first)
    return " ".join([first, *rest])


def rel_pattern(r: Rel, a: str, b: str, rv: str = "") -> str:
    return f"({a}:{r.src})-[{rv}:{r.type}]->({b}:{r.dst})"


def cy_neighbors(rng, g):
    r = rng.choice(g.rels)
    a, b = var(r.src), var(r.dst, (var(r.src),))
    forward = rng.random() < 0.5  # filter on the target, return the source (or the other way round)
    fixed, ret_label, fv, rv = (g.labels[r.dst], g.labels[r.src], b, a) if forward else (g.labels[r.src], g.labels[r.dst], a, b)
    value = fixed.display.value(rng)
    pattern = rel_pattern(r, a, b).replace(f"({fv}:{fixed.name})", f"({fv}:{fixed.name} {{{fixed.display.name}: {cy_literal(value)}}})")
    q = (f"Which {plural(ret_label.name)} {verb(r.type, True)} the {fixed.name} '{value}'?" if forward
         else f"What {plural(ret_label.name)} does the {fixed.name} '{value}' {verb(r.type, True)}?")
    q = rng.choice([q, f"List the {ret_label.display.name} of {ret_label.name} nodes connected by {r.type} to {fixed.name} '{value}'."])
    distinct = "DISTINCT " if rng.random() < 0.4 else ""
    return q, f"MATCH {pattern}\nRETURN {distinct}{rv}.{ret_label.display.name}", [r.src, r.dst]


def cy_top_count(rng, g):
    r = rng.choice(g.rels)
    a, b = var(r.src), var(r.dst, (var(r.src),))
    by_source = rng.random() < 0.6
    group, gv, other, ov = (g.labels[r.src], a, g.labels[r.dst], b) if by_source else (g.labels[r.dst], b, g.labels[r.src], a)
    k = rng.choice([1, 3, 5, 10])
    alias = rng.choice(["count", "total", f"num{plural(other.name)}", f"{other.name.lower()}Count"])
    q = rng.choice([f"Which {k} {plural(group.name)} have the most {r.type} relationships with {plural(other.name)}?",
                    f"Top {k} {group.name} nodes by number of connected {plural(other.name)} via {r.type}.",
                    f"Find the {group.name} with the most {plural(other.name)}." if k == 1 else
                    f"List {k} {plural(group.name)} with the highest count of {plural(other.name)}."])
    cypher = (f"MATCH {rel_pattern(r, a, b)}\nWITH {gv}, count({ov}) AS {alias}\nORDER BY {alias} DESC\nLIMIT {k}\n"
              f"RETURN {gv}.{group.display.name}, {alias}")
    if rng.random() < 0.5:
        cypher = (f"MATCH {rel_pattern(r, a, b)}\nRETURN {gv}.{group.display.name} AS {group.display.name}, count({ov}) AS {alias}\n"
                  f"ORDER BY {alias} DESC\nLIMIT {k}")
    return q, cypher, [r.src, r.dst]


CY_AGG = {"avg": "average", "sum": "total", "max": "maximum", "min": "minimum"}


def cy_aggregate(rng, g):
    rels = [r for r in g.rels if g.labels[r.dst].nums() or g.labels[r.src].nums()]
    if not rels:
        return None
    r = rng.choice(rels)
    a, b = var(r.src), var(r.dst, (var(r.src),))
    if g.labels[r.dst].nums() and (not g.labels[r.src].nums() or rng.random() < 0.5):
        group, gv, numl, nv = g.labels[r.src], a, g.labels[r.dst], b
    else:
        group, gv, numl, nv = g.labels[r.dst], b, g.labels[r.src], a
    num = rng.choice(numl.nums())
    fn = rng.choice(list(CY_AGG))
    alias = f"{fn}{num.name[0].upper()}{num.name[1:]}"
    if rng.random() < 0.4:
        threshold = num.value(rng)
        q = f"Which {plural(group.name)} have {article(CY_AGG[fn])} {numl.name} {num.name} above {threshold}?"
        cypher = (f"MATCH {rel_pattern(r, a, b)}\nWITH {gv}, {fn}({nv}.{num.name}) AS {alias}\nWHERE {alias} > {threshold}\n"
                  f"RETURN {gv}.{group.display.name}, {alias}")
        return q, cypher, [r.src, r.dst]
    k = rng.choice([3, 5, 10])
    q = rng.choice([f"What is the {CY_AGG[fn]} {num.name} of {plural(numl.name)} for each {group.name}? Show the top {k}.",
                    f"For each {group.name}, compute the {CY_AGG[fn]} {num.name} of its {plural(numl.name)} and return the {k} highest."])
    cypher = (f"MATCH {rel_pattern(r, a, b)}\nRETURN {gv}.{group.display.name}, {fn}({nv}.{num.name}) AS {alias}\n"
              f"ORDER BY {alias} DESC\nLIMIT {k}")
    return q, cypher, [r.src, r.dst]


def cy_two_hop(rng, g):
    chains = [(r1, r2) for r1 in g.rels for r2 in g.rels if r1.dst == r2.src and r1 is not r2 and r1.src != r2.dst]
    if not chains:
        return None
    r1, r2 = rng.choice(chains)
    a, b = var(r1.src), var(r1.dst, (var(r1.src),))
    c = var(r2.dst, (a, b))
    end = g.labels[r2.dst]
    value = end.display.value(rng)
    start = g.labels[r1.src]
    q = rng.choice([f"Which {plural(start.name)} are linked to the {end.name} '{value}' through a {r1.dst}?",
                    f"Find {start.name} nodes that {verb(r1.type, True)} a {r1.dst} which {verb(r2.type)} the {end.name} '{value}'."])
    cypher = (f"MATCH ({a}:{r1.src})-[:{r1.type}]->({b}:{r1.dst})-[:{r2.type}]->({c}:{r2.dst} {{{end.display.name}: {cy_literal(value)}}})\n"
              f"RETURN DISTINCT {a}.{start.display.name}")
    if rng.random() < 0.4:
        k = rng.choice([3, 5])
        q = f"For the {end.name} '{value}', which {k} {plural(start.name)} reach it through the most {plural(r1.dst)}?"
        cypher = (f"MATCH ({a}:{r1.src})-[:{r1.type}]->({b}:{r1.dst})-[:{r2.type}]->({c}:{r2.dst} {{{end.display.name}: {cy_literal(value)}}})\n"
                  f"WITH {a}, count(DISTINCT {b}) AS paths\nORDER BY paths DESC\nLIMIT {k}\nRETURN {a}.{start.display.name}, paths")
    return q, cypher, [r1.src, r1.dst, r2.dst]


def cy_optional(rng, g):
    r = rng.choice(g.rels)
    a, b = var(r.src), var(r.dst, (var(r.src),))
    src = g.labels[r.src]
    cond = cy_where(rng, src, a) if rng.random() < 0.5 else None
    where = f"\nWHERE {cond[0]}" if cond else ""
    scope = f" with {cond[1]}" if cond else ""
    if rng.random() < 0.5:
        q = f"For every {src.name}{scope}, how many {plural(r.dst)} does it have via {r.type}, including those with none?"
        cypher = (f"MATCH ({a}:{r.src}){where}\nOPTIONAL MATCH ({a})-[:{r.type}]->({b}:{r.dst})\n"
                  f"RETURN {a}.{src.display.name}, count({b}) AS {r.dst.lower()}Count")
    else:
        q = f"List {plural(src.name)}{scope} together with the {g.labels[r.dst].display.name} of any {r.dst} they are connected to by {r.type}."
        cypher = (f"MATCH ({a}:{r.src}){where}\nOPTIONAL MATCH ({a})-[:{r.type}]->({b}:{r.dst})\n"
                  f"RETURN {a}.{src.display.name}, collect({b}.{g.labels[r.dst].display.name}) AS {r.dst.lower()}s")
    return q, cypher, [r.src, r.dst]


def cy_without(rng, g):
    r = rng.choice(g.rels)
    a = var(r.src)
    src = g.labels[r.src]
    k = rng.choice([None, 5, 10])
    q = f"Which {plural(src.name)} have no {r.type} relationship to any {r.dst}?" + (f" Return {k} of them." if k else "")
    cypher = f"MATCH ({a}:{r.src})\nWHERE NOT ({a})-[:{r.type}]->(:{r.dst})\nRETURN {a}.{src.display.name}" + (f"\nLIMIT {k}" if k else "")
    return q, cypher, [r.src, r.dst]


def cy_rel_prop(rng, g):
    rels = [r for r in g.rels if r.prop and r.prop.kind == "num"]
    if not rels:
        return None
    r = rng.choice(rels)
    a, b = var(r.src), var(r.dst, (var(r.src),))
    value = r.prop.value(rng)
    op = rng.choice([">", "<", ">="])
    src, dst = g.labels[r.src], g.labels[r.dst]
    q = rng.choice([f"Find {r.src}-{r.dst} pairs connected by {r.type} where {r.prop.name} is {CMP[op][0]} {value}.",
                    f"Which {plural(r.src)} have a {r.type} relationship with {r.prop.name} {CMP[op][1]} {value}? Show the {r.dst} too."])
    order = f"\nORDER BY r.{r.prop.name} DESC" if rng.random() < 0.5 else ""
    cypher = (f"MATCH {rel_pattern(r, a, b, 'r')}\nWHERE r.{r.prop.name} {op} {value}\n"
              f"RETURN {a}.{src.display.name}, {b}.{dst.display.name}, r.{r.prop.name}{order}")
    return q, cypher, [r.src, r.dst]


def cy_count(rng, g):
    label = rng.choice(list(g.labels.values()))
    v = var(label.name)
    cond = cy_where(rng, label, v)
    if not cond or rng.random() < 0.2:
        return f"How many {label.name} nodes are in the graph?", f"MATCH ({v}:{label.name})\nRETURN count({v})", [label.name]
    q = rng.choice([f"How many {plural(label.name)} have {cond[1]}?", f"Count the {label.name} nodes with {cond[1]}."])
    return q, f"MATCH ({v}:{label.name})\nWHERE {cond[0]}\nRETURN count({v}) AS count", [label.name]


def cy_order(rng, g):
    labels = [l for l in g.labels.values() if l.nums()]
    if not labels:
        return None
    label = rng.choice(labels)
    num = rng.choice(label.nums())
    v = var(label.name)
    desc = rng.random() < 0.6
    k = rng.choice([1, 3, 5, 10])
    q = rng.choice([f"Which {k} {plural(label.name)} have the {'highest' if desc else 'lowest'} {num.name}?",
                    f"Show the top {k} {label.name} nodes ordered by {num.name} {'descending' if desc else 'ascending'}."])
    if k == 1:
        q = f"Which {label.name} has the {'highest' if desc else 'lowest'} {num.name}?"
    cypher = (f"MATCH ({v}:{label.name})\nWHERE {v}.{num.name} IS NOT NULL\nRETURN {v}.{label.display.name}, {v}.{num.name}\n"
              f"ORDER BY {v}.{num.name}{' DESC' if desc else ''}\nLIMIT {k}")
    return q, cypher, [label.name]


def cy_shared(rng, g):
    r = rng.choice(g.rels)
    if r.src == r.dst:
        return None
    a, b = var(r.src), var(r.dst, (var(r.src),))
    src = g.labels[r.src]
    value = src.display.value(rng)
    k = rng.choice([3, 5])
    q = f"Which {plural(r.src)} share the most {plural(r.dst)} with the {r.src} '{value}' (via {r.type})? Give the top {k}."
    cypher = (f"MATCH ({a}:{r.src} {{{src.display.name}: {cy_literal(value)}}})-[:{r.type}]->({b}:{r.dst})<-[:{r.type}]-(other:{r.src})\n"
              f"WHERE other <> {a}\nRETURN other.{src.display.name}, count({b}) AS shared\nORDER BY shared DESC\nLIMIT {k}")
    return q, cypher, [r.src, r.dst]


def cy_path(rng, g):
    rels = [r for r in g.rels if r.src == r.dst]
    if not rels:
        return None
    r = rng.choice(rels)
    label = g.labels[r.src]
    x, y = label.display.value(rng), label.display.value(rng)
    if x == y:
        return None
    if rng.random() < 0.5:
        q = f"What is the shortest {r.type} path between the {plural(label.name)} '{x}' and '{y}'?"
        cypher = (f"MATCH p = shortestPath((a:{label.name} {{{label.display.name}: {cy_literal(x)}}})-[:{r.type}*]-"
                  f"(b:{label.name} {{{label.display.name}: {cy_literal(y)}}}))\nRETURN length(p) AS hops, [n IN nodes(p) | n.{label.display.name}] AS route")
    else:
        depth = rng.randint(2, 4)
        q = f"Which {plural(label.name)} can be reached from '{x}' in at most {depth} {r.type} steps?"
        cypher = (f"MATCH (a:{label.name} {{{label.display.name}: {cy_literal(x)}}})-[:{r.type}*1..{depth}]->(b:{label.name})\n"
                  f"WHERE b <> a\nRETURN DISTINCT b.{label.display.name}")
    return q, cypher, [label.name]


CYPHER_SHAPES = [(cy_filter, 12), (cy_lookup, 7), (cy_neighbors, 12), (cy_top_count, 10), (cy_aggregate, 9),
                 (cy_two_hop, 10), (cy_optional, 6), (cy_without, 5), (cy_rel_prop, 6), (cy_count, 7), (cy_order, 8),
                 (cy_shared, 5), (cy_path, 3)]


def graph_variant(rng: Random, graph: Graph) -> Graph:
    """The graph with each label keeping its display property and a random subset of the others,
    as different deployments of one kind of database differ."""
    labels = {}
    for name, label in graph.labels.items():
        rest = [p for p in label.props if p is not label.display]
        keep = sorted(rng.sample(range(len(rest)), rng.randint(min(1, len(rest)), len(rest))))
        labels[name] = Label(name, [label.display] + [rest[i] for i in keep])
    return Graph(labels, graph.rels)


def neo4j_row(rng: Random) -> dict:
    shapes, weights = zip(*CYPHER_SHAPES)
    while True:
        graph = graph_variant(rng, rng.choice(GRAPH_DOMAINS))
        made = rng.choices(shapes, weights)[0](rng, graph)
        if made:
            break
    question, cypher, used = made
    others = [name for name in graph.labels if name not in used]
    extra = rng.sample(others, k=min(len(others), rng.choice([0, 0, 0, 0, 0, 0, 1, 2])))
    labels = [name for name in graph.labels if name in used or name in extra]
    return {"question": cap(question), "schema": graph_schema(graph, labels, rng), "cypher": cypher}
