"""Cypher samples: question + graph schema (neo4j text2cypher style) -> Cypher query."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from random import Random

from sample_generators.common import CMP, Column, article, cap, plural

# ================================================================================================
# Cypher: question + graph schema (neo4j text2cypher style) -> Cypher query
#
# Graph language, under a "# domain" header:
#   Label: prop TYPE kind; ...          kinds as for SQL; key props are ids; LIST/BOOLEAN need no kind
#   (:A)-[:REL]->(:B) prop TYPE kind    a relationship, optionally with one property

GRAPHS = """
# movies
Movie: title STRING =The Matrix,Harbor Lights,The Long Winter,Glass City,Red Meridian,Paper Kingdom,Night Orchard; released INTEGER 1970..2023; tagline STRING =Welcome to the real world,Every story ends,Nothing stays buried; imdbRating FLOAT 1.5..9.6; runtime INTEGER 70..210
Person: name STRING @person; born INTEGER 1930..2001
Genre: name STRING =Drama,Comedy,Thriller,Animation,Documentary,Sci-Fi
(:Person)-[:ACTED_IN]->(:Movie) roles LIST
(:Person)-[:DIRECTED]->(:Movie)
(:Movie)-[:IN_GENRE]->(:Genre)
(:Person)-[:REVIEWED]->(:Movie) rating INTEGER 1..100
# social
User: name STRING @person; handle STRING =@mira,@kofi_dev,@lena.k,@omar99,@sunny_s,@neo4jfan; followers INTEGER 0..2500000; verified BOOLEAN; joined DATE 2008..2024
Post: text STRING =Graphs are everywhere,Just shipped v2,Coffee first,Hello world,New blog post is live; likes INTEGER 0..90000; createdAt DATE 2015..2024
Hashtag: name STRING =graphs,opensource,ai,travel,coffee,music
(:User)-[:FOLLOWS]->(:User) since INTEGER 2008..2024
(:User)-[:POSTED]->(:Post)
(:Post)-[:TAGGED]->(:Hashtag)
(:User)-[:LIKED]->(:Post)
# retail
Customer: name STRING @person; country STRING @country; customerId STRING =ALFKI,BONAP,FRANK,QUICK,WARTH
Order: orderId STRING =10248,10249,10250,10251,10252; orderDate DATE 2020..2024; freight FLOAT 0.5..900.0
Product: productName STRING =Chai,Chang,Tofu,Ikura,Pavlova,Konbu,Geitost; unitPrice FLOAT 2.5..263.5; unitsInStock INTEGER 0..125; discontinued BOOLEAN
Category: categoryName STRING =Beverages,Condiments,Seafood,Dairy Products,Produce,Confections
Supplier: companyName STRING @company; country STRING @country
(:Customer)-[:PURCHASED]->(:Order)
(:Order)-[:ORDERS]->(:Product) quantity INTEGER 1..120
(:Product)-[:PART_OF]->(:Category)
(:Supplier)-[:SUPPLIES]->(:Product)
# qa
Question: title STRING =How to parse JSON in Rust,Why is my query slow,Best way to paginate,Fix CORS error; score INTEGER -10..900; answered BOOLEAN; views INTEGER 0..400000
Answer: body STRING =Use serde_json,Add an index on the join key,Use keyset pagination,Set the Access-Control-Allow-Origin header; score INTEGER -5..1200; accepted BOOLEAN
Tag: name STRING =rust,cypher,python,sql,javascript,docker
Member: displayName STRING @person; reputation INTEGER 1..250000
(:Member)-[:ASKED]->(:Question)
(:Member)-[:PROVIDED]->(:Answer)
(:Answer)-[:ANSWERS]->(:Question)
(:Question)-[:TAGGED]->(:Tag)
# streaming
Streamer: name STRING =pixelqueen,slowrunner,mapmaker,chefmo,lofi_lena; followers INTEGER 10..9000000; totalViewTime INTEGER 100..900000000
Game: name STRING =Rust,Chess,Minecraft,Valorant,Stardew Valley,Just Chatting
Viewer: name STRING =kestrel42,bluefin,orbit_cat,mapleleaf,nightowl; createdAt DATE 2012..2024
Language: name STRING =en,es,de,fr,ja,pt
(:Streamer)-[:PLAYS]->(:Game)
(:Viewer)-[:CHATTER]->(:Streamer)
(:Viewer)-[:MODERATOR]->(:Streamer)
(:Streamer)-[:HAS_LANGUAGE]->(:Language)
# companies
Organization: name STRING @company; revenue FLOAT 100000.0..90000000000.0; nbrEmployees INTEGER 2..300000; isPublic BOOLEAN; founded INTEGER 1850..2021
City: name STRING @city
Country: name STRING @country
Industry: name STRING =Software,Banking,Retail,Energy,Healthcare,Logistics
Executive: name STRING @person; age INTEGER 30..82
(:Organization)-[:IN_CITY]->(:City)
(:City)-[:IN_COUNTRY]->(:Country)
(:Organization)-[:HAS_CATEGORY]->(:Industry)
(:Organization)-[:HAS_CEO]->(:Executive)
(:Organization)-[:HAS_SUBSIDIARY]->(:Organization)
(:Organization)-[:HAS_INVESTOR]->(:Organization) stake FLOAT 0.1..60.0
# flights
Airport: code STRING =LIS,YYZ,KIX,NBO,DEN,LYS,KRK,AUS; name STRING =Humberto Delgado,Pearson,Kansai,Jomo Kenyatta,Denver Intl; elevation INTEGER 1..5500
Airline: name STRING =SkyJet,AeroNova,Polar Air,Sunwing,BlueCrest; alliance STRING =Star,Oneworld,SkyTeam,none
Flight: number STRING =AN101,SJ220,PA317,SW404,BC512; distance INTEGER 150..9800; durationMinutes INTEGER 40..800
Aircraft: model STRING =A320,B737,A350,B787,E190; seats INTEGER 70..440
(:Flight)-[:DEPARTS_FROM]->(:Airport)
(:Flight)-[:ARRIVES_AT]->(:Airport)
(:Airline)-[:OPERATES]->(:Flight)
(:Flight)-[:USES]->(:Aircraft)
# music
Artist: name STRING =The Lanterns,Mira Vale,Northbound,Golden Static,Paper Moons,Sol Cardenas; formed INTEGER 1965..2021; listeners INTEGER 100..60000000
Album: title STRING =Night Drive,Quiet Harbor,Neon Fields,First Light,Glass Rooms; year INTEGER 1970..2024; sales INTEGER 1000..40000000
Track: title STRING =Hold On,Blue Hour,Paper Planes,Echoes,Gravity,Open Road; durationSeconds INTEGER 90..600; streams INTEGER 0..3000000000
Label: name STRING =Harbor Records,Blue Note North,Static Sound,Moonlit
(:Artist)-[:RELEASED]->(:Album)
(:Album)-[:CONTAINS]->(:Track) position INTEGER 1..18
(:Album)-[:SIGNED_TO]->(:Label)
(:Artist)-[:COLLABORATED_WITH]->(:Artist)
# academia
Author: name STRING @person; hIndex INTEGER 0..140
Paper: title STRING =Graph Neural Networks at Scale,Sparse Attention Revisited,On Packing Sequences,Learning to Rank Cyphers; year INTEGER 1995..2024; citations INTEGER 0..45000
Venue: name STRING =NeurIPS,ICML,VLDB,SIGMOD,ACL,KDD
Institution: name STRING =Lumen University,Harbor Institute,North Tech,Alpine College; country STRING @country
(:Author)-[:WROTE]->(:Paper)
(:Paper)-[:PUBLISHED_IN]->(:Venue)
(:Paper)-[:CITES]->(:Paper)
(:Author)-[:AFFILIATED_WITH]->(:Institution) since INTEGER 1990..2024
# healthcare
Patient: name STRING @person; age INTEGER 0..99; bloodType STRING =A+,A-,B+,O+,O-,AB+
Doctor: name STRING @person; specialty STRING =cardiology,oncology,pediatrics,neurology,dermatology
Hospital: name STRING =St. Mary,Riverside General,Hillcrest,Mercy Care; beds INTEGER 40..1200
Condition: name STRING =asthma,diabetes,hypertension,migraine,anemia
Medication: name STRING =metformin,ibuprofen,lisinopril,salbutamol,atorvastatin; dosageMg INTEGER 5..1000
(:Patient)-[:TREATED_BY]->(:Doctor)
(:Doctor)-[:WORKS_AT]->(:Hospital)
(:Patient)-[:DIAGNOSED_WITH]->(:Condition) year INTEGER 1990..2024
(:Patient)-[:TAKES]->(:Medication)
(:Medication)-[:TREATS]->(:Condition)
# banking
Account: accountId STRING =ACC-001,ACC-204,ACC-377,ACC-918,ACC-550; balance FLOAT 0.0..900000.0; type STRING =checking,savings,business; flagged BOOLEAN
Client: name STRING @person; riskScore FLOAT 0.0..1.0
Bank: name STRING =Stonebridge Bank,First Harbor,Union Savings,Crescent Trust; country STRING @country
Transaction: amount FLOAT 1.0..250000.0; date DATE 2019..2024; currency STRING =USD,EUR,GBP,JPY
(:Client)-[:OWNS]->(:Account)
(:Account)-[:HELD_AT]->(:Bank)
(:Account)-[:SENT]->(:Transaction)
(:Transaction)-[:RECEIVED_BY]->(:Account)
# recipes
Recipe: name STRING =Shakshuka,Pad Thai,Risotto,Ramen,Tacos,Moussaka; prepMinutes INTEGER 5..240; calories INTEGER 120..1800; servings INTEGER 1..12
Ingredient: name STRING =garlic,tomato,rice,egg,chili,basil,tofu,lemon; isAllergen BOOLEAN
Cuisine: name STRING =Italian,Thai,Mexican,Japanese,Greek,Levantine
Chef: name STRING @person; stars INTEGER 0..3
(:Recipe)-[:USES]->(:Ingredient) grams INTEGER 1..800
(:Recipe)-[:FROM_CUISINE]->(:Cuisine)
(:Chef)-[:CREATED]->(:Recipe)
# library
Book: title STRING =The Silent Shore,Iron Garden,A Map of Rain,The Last Orchard,River of Glass; pages INTEGER 80..1200; published INTEGER 1900..2024; isbn STRING =978-0-14-118776-1,978-1-4028-9462-6,978-0-306-40615-7
Writer: name STRING @person; nationality STRING @country; born INTEGER 1880..1995
Publisher: name STRING =Juniper Books,Harbor Press,Lumen House,Northwind Editions
Reader: name STRING @person; memberSince INTEGER 1995..2024
(:Writer)-[:AUTHORED]->(:Book)
(:Book)-[:PUBLISHED_BY]->(:Publisher)
(:Reader)-[:BORROWED]->(:Book) days INTEGER 1..60
(:Reader)-[:RATED]->(:Book) stars INTEGER 1..5
# it_network
Server: hostname STRING =web-01,web-02,db-01,cache-01,api-03,batch-07; cpuCores INTEGER 2..128; memoryGb INTEGER 4..1024; os STRING =Ubuntu 22.04,Debian 12,RHEL 9,Windows Server 2022
Application: name STRING =billing,checkout,search,auth,reporting,inventory; version STRING =1.4.2,2.0.0,3.1.7,0.9.8
Datacenter: name STRING =dc-lisbon,dc-frankfurt,dc-oregon,dc-tokyo; region STRING =eu-west,eu-central,us-west,ap-northeast
Team: name STRING =Platform,Payments,Search,Data,Identity
(:Application)-[:RUNS_ON]->(:Server)
(:Server)-[:LOCATED_IN]->(:Datacenter)
(:Application)-[:DEPENDS_ON]->(:Application)
(:Team)-[:OWNS]->(:Application)
# sports
Player: name STRING @person; position STRING =goalkeeper,defender,midfielder,forward; age INTEGER 17..40; goals INTEGER 0..400
Club: name STRING =Falcons FC,Rovers,Comets United,Harriers,Titans SC; founded INTEGER 1870..2010
League: name STRING =Premier Division,Coastal League,Northern Cup,Liga Uno
Stadium: name STRING =Harbor Ground,The Oval,Riverside Arena,Summit Park; capacity INTEGER 3000..99000
(:Player)-[:PLAYS_FOR]->(:Club) since INTEGER 2005..2024
(:Club)-[:COMPETES_IN]->(:League)
(:Club)-[:HOME_GROUND]->(:Stadium)
(:Player)-[:TRANSFERRED_FROM]->(:Club) fee FLOAT 0.0..120.0
# transit
Station: name STRING =Central,North Gate,Riverside,Old Town,Harbor,University,Airport; zone INTEGER 1..6; dailyPassengers INTEGER 200..400000; accessible BOOLEAN
Line: name STRING =Red Line,Blue Line,Green Line,Circle Line,Airport Express; color STRING =red,blue,green,yellow,purple
Operator: name STRING =Metro Transit,City Rail,Harbor Lines
(:Station)-[:CONNECTED_TO]->(:Station) minutes INTEGER 1..25
(:Line)-[:STOPS_AT]->(:Station)
(:Operator)-[:RUNS]->(:Line)
"""


@dataclass
class Label:
    name: str
    props: list[Column]

    @property
    def display(self) -> Column:
        texts = [p for p in self.props if p.kind == "text"]
        return texts[0]

    def nums(self) -> list[Column]:
        return [p for p in self.props if p.kind == "num" and p.type in ("INTEGER", "FLOAT")]


@dataclass
class Rel:
    src: str
    type: str
    dst: str
    prop: Column | None = None


@dataclass
class Graph:
    labels: dict[str, Label]
    rels: list[Rel]


def parse_prop(spec: str) -> Column:
    name, type_, *kind = spec.split(" ", 2)
    col = Column(name, type_, "other")
    if kind:
        kind = kind[0]
        if kind.startswith("="):
            col.kind, col.values = "text", kind[1:].split(",")
        elif kind.startswith("@"):
            col.kind, col.pool = "text", kind[1:]
        else:
            low, high = kind.split("..")
            col.kind, col.low, col.high = "num", float(low), float(high)
    return col


def parse_graphs(text: str) -> list[Graph]:
    graphs: list[Graph] = []
    for line in text.strip().splitlines():
        if line.startswith("#"):
            graphs.append(Graph({}, []))
        elif line.startswith("(:"):
            m = re.match(r"\(:(\w+)\)-\[:(\w+)\]->\(:(\w+)\)(?: (.*))?$", line)
            graphs[-1].rels.append(Rel(m[1], m[2], m[3], parse_prop(m[4]) if m[4] else None))
        else:
            name, _, body = line.partition(": ")
            graphs[-1].labels[name] = Label(name, [parse_prop(s) for s in body.split("; ")])
            assert any(p.kind == "text" for p in graphs[-1].labels[name].props), f"{name} needs a text property"
    return graphs


GRAPH_DOMAINS = parse_graphs(GRAPHS)


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
