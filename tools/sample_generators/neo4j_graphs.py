"""The Cypher samples' data: 16 graph domains (labels, properties, relationships), as text in a small
line language, and its parser (:data:`GRAPH_DOMAINS`); neo4j.py generates questions and queries over them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sample_generators.common import Column


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
