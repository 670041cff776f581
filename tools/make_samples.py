"""Generate the bundled sample datasets in ``pipeline/assets/samples/``.

    python tools/make_samples.py                 # rewrite the committed files
    python tools/make_samples.py --out /tmp/s    # write elsewhere (the tests compare bytes)

Four files, one JSON object per line (UTF-8, sorted keys, ``ensure_ascii=False``, ``\\n`` ends),
``ROWS`` distinct rows each, with the field names the expert configs' templates use:

    sql.jsonl         question, context, answer    (b-mc2/sql-create-context shape)
    json.jsonl        text, schema, answer         (passage -> extracted JSON object)
    neo4j.jsonl       question, schema, cypher     (neo4j text2cypher shape)
    typescript.jsonl  instruction, output          (TypeScript task -> code)

Everything is synthetic: small hand-written vocabularies combined by ``random.Random(seed)``
(one generator per file, seeded from ``--seed``), so the output is the same on every machine and
Python version. Only the standard library is used and nothing touches the network. The public
Spider and text2cypher sets shaped the vocabulary sizes, phrasing and lengths; no record of theirs
is copied.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from random import Random

ROWS = 3000
SEED = 1234
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "pipeline" / "assets" / "samples"

# ================================================================================================
# Shared vocabulary

FIRST_NAMES = (
    "James Mary Ana Liam Olivia Noah Emma Mateo Sofia Lucas Mia Ethan Ava Hiro Yuki Chen Wei Priya "
    "Arjun Fatima Omar Lena Jonas Ingrid Lars Chloé Hugo Camille Diego Lucía Marco Giulia Kofi Amara "
    "Sven Elif Mehmet Nadia Ivan Olga Pedro Inês Tom Grace Samuel Ruth Aiden Zoe Raj Leila Björn "
    "Aisha Tariq Hannah Felix Nora Mei Kenji Rosa Pablo Maya Daniel Sara Yusuf Zainab Erik Freya"
).split()
LAST_NAMES = (
    "Smith Garcia Müller Rossi Tanaka Kim Nguyen Okafor Silva Novak Johansson Dubois Kowalski Patel "
    "Cohen Ali Hansen Moreau Costa Brown Wilson Lee Martin Schmidt Fischer Jensen Ivanova Yılmaz "
    "Haddad Mendes Ortiz Walsh Byrne Kaur Singh Sato Ito Park Chen López Adeyemi Bauer Ferrari "
    "Nakamura Reyes Andersson Horvat Petrov Oliveira Murphy Clarke Dimitrov Banerjee Mensah Weber"
).split()
CITIES = (
    "Lisbon|Toronto|Osaka|Nairobi|Denver|Lyon|Kraków|Austin|Melbourne|Bogotá|Seoul|Hamburg|Dublin|"
    "Porto|Chicago|Madrid|Oslo|Accra|Seattle|Mumbai|Prague|Boston|Vienna|Lima|Zürich|Atlanta|Cairo|"
    "Helsinki|Montreal|Santiago|Manila|Tunis|Valencia|Glasgow|Phoenix|Nagoya|Bergen|Leeds|Turin|Quito"
).split("|")
COUNTRIES = (
    "Portugal|Canada|Japan|Kenya|France|Poland|Brazil|Germany|Ireland|Spain|Norway|Ghana|India|"
    "Czechia|Austria|Peru|Switzerland|Egypt|Finland|Chile|Mexico|Italy|Sweden|Nigeria|Australia|"
    "Argentina|Vietnam|Turkey|Netherlands|Colombia"
).split("|")
COMPANIES = (
    "Northwind Labs|Bluepeak Systems|Acme Logistics|Helios Energy|Copperleaf Foods|Orbital Media|"
    "Greenline Transit|Brightwave Health|Stonebridge Bank|Lumen Analytics|Redwood Outfitters|"
    "Kestrel Robotics|Maple & Finch|Tidewater Apparel|Quantix Software|Harbor Freight Co.|"
    "Silverpine Studios|Vantage Insurance|Nimbus Cloud|Juniper Books"
).split("|")


def person(rng: Random) -> str:
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"


def plural(phrase: str) -> str:
    """English plural of the last word of ``phrase`` (good enough for our vocabulary)."""
    head, _, word = phrase.rpartition(" ")
    irregular = {"person": "people", "Person": "People", "child": "children", "staff": "staff", "series": "series",
                 "media": "media", "data": "data", "information": "information"}
    if word in irregular:
        word = irregular[word]
    elif re.search(r"[^aeiou]y$", word):
        word = word[:-1] + "ies"
    elif re.search(r"(s|x|z|ch|sh)$", word):
        word += "es"
    else:
        word += "s"
    return f"{head} {word}" if head else word


def article(phrase: str) -> str:
    return ("an " if phrase[:1].lower() in "aeiou" else "a ") + phrase


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]


# ================================================================================================
# SQL: question + CREATE TABLE context -> SQL query
#
# Schema language, one table per line under a "# domain" header:
#   table|plural phrase: column TYPE kind; ...
# kinds: key (primary key), >table (foreign key), =a,b,c (categorical values),
#        @person / @city / @country / @company (values from a pool), lo..hi (number range;
#        a '.' in the bounds makes it fractional).

SQL_SCHEMAS = """
# company
department|departments: department_id INTEGER key; name VARCHAR =Sales,Marketing,Engineering,Finance,Legal,Support,Research; budget INTEGER 50000..2000000; floor INTEGER 1..12
employee|employees: employee_id INTEGER key; name VARCHAR @person; age INTEGER 21..64; salary INTEGER 32000..180000; city VARCHAR @city; department_id INTEGER >department; hire_year INTEGER 1995..2023
project|projects: project_id INTEGER key; title VARCHAR =Apollo,Atlas,Borealis,Cobalt,Delta,Ember,Falcon,Granite,Helix,Ion; department_id INTEGER >department; cost REAL 1000.0..90000.0; status VARCHAR =planned,active,paused,done
assignment|assignments: employee_id INTEGER >employee; project_id INTEGER >project; hours INTEGER 5..400; role VARCHAR =lead,developer,analyst,tester
# aviation
airline|airlines: airline_id INTEGER key; name VARCHAR =SkyJet,AeroNova,Polar Air,Sunwing,BlueCrest,Condor Line; country VARCHAR @country; fleet_size INTEGER 8..320
airport|airports: airport_id INTEGER key; name VARCHAR =Harbor Field,Central Intl,North Point,Riverside,Lakeview,Summit Regional; city VARCHAR @city; elevation INTEGER 2..2400
flight|flights: flight_id INTEGER key; flight_number VARCHAR =AN101,SJ220,PA317,SW404,BC512,CL618,AN730,SJ845; airline_id INTEGER >airline; origin_airport_id INTEGER >airport; distance INTEGER 150..9800; price REAL 49.0..1450.0; duration_minutes INTEGER 35..780
pilot|pilots: pilot_id INTEGER key; name VARCHAR @person; age INTEGER 25..63; rank VARCHAR =captain,first officer,second officer; airline_id INTEGER >airline; flight_hours INTEGER 300..24000
# music
artist|artists: artist_id INTEGER key; name VARCHAR =The Lanterns,Mira Vale,Northbound,Golden Static,Kofi & The Tide,Paper Moons,Velvet Arcade,Sol Cardenas; country VARCHAR @country; formed_year INTEGER 1965..2021; genre VARCHAR =rock,jazz,pop,folk,hip hop,electronic,blues
album|albums: album_id INTEGER key; title VARCHAR =Night Drive,Quiet Harbor,Neon Fields,Salt and Stone,First Light,Wild Atlas,Glass Rooms; artist_id INTEGER >artist; release_year INTEGER 1970..2024; sales INTEGER 1000..4000000
song|songs: song_id INTEGER key; title VARCHAR =Hold On,Blue Hour,Paper Planes,Running Home,Echoes,Gravity,Slow Burn,Open Road,Little Fires; album_id INTEGER >album; duration_seconds INTEGER 95..540; plays INTEGER 100..90000000; rating REAL 1.0..5.0
# school
student|students: student_id INTEGER key; name VARCHAR @person; age INTEGER 17..29; major VARCHAR =Biology,History,Mathematics,Physics,Economics,Philosophy,Chemistry; gpa REAL 1.8..4.0; hometown VARCHAR @city
course|courses: course_id INTEGER key; title VARCHAR =Linear Algebra,World History,Organic Chemistry,Microeconomics,Ethics,Genetics,Statistics; credits INTEGER 1..6; department VARCHAR =Science,Humanities,Social Sciences
enrollment|enrollments: student_id INTEGER >student; course_id INTEGER >course; grade INTEGER 40..100; semester VARCHAR =Fall,Spring,Summer
teacher|teachers: teacher_id INTEGER key; name VARCHAR @person; course_id INTEGER >course; years_experience INTEGER 1..38; salary INTEGER 38000..120000
# hospital
hospital|hospitals: hospital_id INTEGER key; name VARCHAR =St. Mary,Riverside General,Hillcrest,Mercy Care,Lakeshore Clinic,Northgate Medical; city VARCHAR @city; beds INTEGER 40..1200; founded INTEGER 1880..2015
doctor|doctors: doctor_id INTEGER key; name VARCHAR @person; specialty VARCHAR =cardiology,oncology,pediatrics,neurology,radiology,surgery; hospital_id INTEGER >hospital; years_practice INTEGER 1..40
patient|patients: patient_id INTEGER key; name VARCHAR @person; age INTEGER 1..97; gender VARCHAR =F,M,X; doctor_id INTEGER >doctor; insurance VARCHAR =public,private,none
appointment|appointments: appointment_id INTEGER key; patient_id INTEGER >patient; doctor_id INTEGER >doctor; cost REAL 20.0..950.0; reason VARCHAR =checkup,follow-up,surgery,scan,vaccination
# retail
customer|customers: customer_id INTEGER key; name VARCHAR @person; city VARCHAR @city; loyalty_level VARCHAR =bronze,silver,gold,platinum; age INTEGER 18..85
product|products: product_id INTEGER key; name VARCHAR =desk lamp,office chair,water bottle,backpack,headphones,notebook,coffee grinder,yoga mat; category VARCHAR =home,office,sports,electronics,kitchen; price REAL 3.5..899.0; stock INTEGER 0..500
orders|orders: order_id INTEGER key; customer_id INTEGER >customer; order_date VARCHAR =2023-01-15,2023-03-02,2023-06-21,2023-09-10,2024-02-05,2024-04-18; status VARCHAR =pending,shipped,delivered,returned; total REAL 5.0..2500.0
order_item|order items: order_id INTEGER >orders; product_id INTEGER >product; quantity INTEGER 1..12; discount REAL 0.0..0.5
store|stores: store_id INTEGER key; name VARCHAR =Downtown,Mall East,Airport,Harborside,Old Town; city VARCHAR @city; area_sqm INTEGER 80..4500; opened_year INTEGER 1990..2023
# sports
team|teams: team_id INTEGER key; name VARCHAR =Falcons,Rovers,Comets,Harriers,Titans,Wolves,Pilots,Mariners; city VARCHAR @city; founded INTEGER 1880..2010; stadium_capacity INTEGER 5000..90000
player|players: player_id INTEGER key; name VARCHAR @person; position VARCHAR =goalkeeper,defender,midfielder,forward; team_id INTEGER >team; age INTEGER 17..39; goals INTEGER 0..45; nationality VARCHAR @country
match_result|matches: match_id INTEGER key; home_team_id INTEGER >team; season INTEGER 2015..2024; attendance INTEGER 800..88000; home_goals INTEGER 0..7; away_goals INTEGER 0..7
coach|coaches: coach_id INTEGER key; name VARCHAR @person; team_id INTEGER >team; start_year INTEGER 2000..2024; wins INTEGER 0..420
# library
author|authors: author_id INTEGER key; name VARCHAR @person; birth_year INTEGER 1890..1995; nationality VARCHAR @country
book|books: book_id INTEGER key; title VARCHAR =The Silent Shore,Iron Garden,A Map of Rain,The Last Orchard,Small Hours,River of Glass,Borrowed Light; author_id INTEGER >author; pages INTEGER 90..1100; publication_year INTEGER 1920..2024; genre VARCHAR =mystery,fantasy,biography,romance,science fiction,poetry
member|members: member_id INTEGER key; name VARCHAR @person; membership_type VARCHAR =standard,student,senior,family; join_year INTEGER 2001..2024
loan|loans: loan_id INTEGER key; book_id INTEGER >book; member_id INTEGER >member; days_borrowed INTEGER 1..60; late_fee REAL 0.0..25.0
# real estate
agent|agents: agent_id INTEGER key; name VARCHAR @person; agency VARCHAR @company; commission_rate REAL 1.0..6.0
property|properties: property_id INTEGER key; address VARCHAR =12 Elm Street,4 Harbor Road,88 Station Lane,7 Mill Court,31 Park Avenue,19 Cedar Way; city VARCHAR @city; bedrooms INTEGER 1..7; price INTEGER 85000..2400000; property_type VARCHAR =apartment,house,townhouse,studio; agent_id INTEGER >agent
viewing|viewings: viewing_id INTEGER key; property_id INTEGER >property; visitor_name VARCHAR @person; rating INTEGER 1..5
# movies
director|directors: director_id INTEGER key; name VARCHAR @person; birth_year INTEGER 1930..1992; country VARCHAR @country
film|films: film_id INTEGER key; title VARCHAR =Harbor Lights,The Long Winter,Glass City,Red Meridian,Paper Kingdom,Night Orchard,Silent Tide,Echo Park; director_id INTEGER >director; release_year INTEGER 1960..2024; budget INTEGER 200000..250000000; gross INTEGER 10000..900000000; rating REAL 1.0..10.0
cinema|cinemas: cinema_id INTEGER key; name VARCHAR =Rialto,Odeon,Palace,Majestic,Lumière,Starlight; city VARCHAR @city; capacity INTEGER 60..1400
screening|screenings: film_id INTEGER >film; cinema_id INTEGER >cinema; show_time VARCHAR =18:00,20:30,21:15,14:45,16:10; tickets_sold INTEGER 0..1400
# transport
train|trains: train_id INTEGER key; name VARCHAR =Coastal Express,Night Owl,Alpine Arrow,Capital Link,Valley Runner; train_type VARCHAR =high speed,regional,sleeper,commuter; max_speed INTEGER 80..320
station|stations: station_id INTEGER key; name VARCHAR =Central,North Gate,Riverside,Old Town,Harbor,University,Airport; city VARCHAR @city; platforms INTEGER 1..24; annual_passengers INTEGER 10000..90000000
route|routes: route_id INTEGER key; train_id INTEGER >train; station_id INTEGER >station; departure_hour INTEGER 0..23; delay_minutes INTEGER 0..180
# restaurants
restaurant|restaurants: restaurant_id INTEGER key; name VARCHAR =Casa Verde,The Copper Pot,Sakura House,Le Petit Four,Spice Route,Blue Fig; cuisine VARCHAR =Italian,Japanese,Mexican,Indian,French,Thai,Lebanese; city VARCHAR @city; rating REAL 1.0..5.0; seats INTEGER 12..220
dish|dishes: dish_id INTEGER key; name VARCHAR =lasagna,ramen,tacos al pastor,butter chicken,ratatouille,pad thai,falafel plate; restaurant_id INTEGER >restaurant; price REAL 4.5..48.0; calories INTEGER 150..1600; is_vegetarian VARCHAR =yes,no
review|reviews: review_id INTEGER key; restaurant_id INTEGER >restaurant; reviewer VARCHAR @person; stars INTEGER 1..5; review_year INTEGER 2012..2024
# banking
bank|banks: bank_id INTEGER key; name VARCHAR =Stonebridge Bank,First Harbor,Union Savings,Crescent Trust,Alpine Credit; country VARCHAR @country; assets INTEGER 1000000..900000000
account|accounts: account_id INTEGER key; owner_name VARCHAR @person; bank_id INTEGER >bank; account_type VARCHAR =checking,savings,business; balance REAL 0.0..250000.0; opened_year INTEGER 1990..2024
transaction_log|transactions: transaction_id INTEGER key; account_id INTEGER >account; amount REAL 1.0..20000.0; transaction_type VARCHAR =deposit,withdrawal,transfer,fee; transaction_year INTEGER 2018..2024
# hotels
hotel|hotels: hotel_id INTEGER key; name VARCHAR =Grand Meridian,Seaside Inn,The Alpine Lodge,Park Plaza,Harbor View; city VARCHAR @city; star_rating INTEGER 1..5; rooms INTEGER 8..900
guest|guests: guest_id INTEGER key; name VARCHAR @person; country VARCHAR @country; age INTEGER 18..90
booking|bookings: booking_id INTEGER key; hotel_id INTEGER >hotel; guest_id INTEGER >guest; nights INTEGER 1..21; room_type VARCHAR =single,double,suite,family; total_price REAL 60.0..9000.0
# manufacturing
factory|factories: factory_id INTEGER key; name VARCHAR =Plant A,Plant B,Northside Works,Delta Mill,Eastgate Foundry; city VARCHAR @city; workers INTEGER 20..4000; opened_year INTEGER 1950..2022
machine|machines: machine_id INTEGER key; model VARCHAR =X-200,Titan 5,Press 9000,Lathe Pro,Cutter Max; factory_id INTEGER >factory; power_kw REAL 1.5..850.0; install_year INTEGER 1985..2024; machine_status VARCHAR =running,idle,maintenance,retired
maintenance|maintenance records: record_id INTEGER key; machine_id INTEGER >machine; cost REAL 50.0..45000.0; technician VARCHAR @person; downtime_hours INTEGER 0..96
# museums
museum|museums: museum_id INTEGER key; name VARCHAR =City Museum,Modern Art Hall,Natural History House,Maritime Museum,Science Center; city VARCHAR @city; open_year INTEGER 1850..2020; num_staff INTEGER 5..900
exhibition|exhibitions: exhibition_id INTEGER key; theme VARCHAR =Impressionism,Ancient Egypt,Deep Sea,Space Age,Bauhaus,Textiles; museum_id INTEGER >museum; exhibition_year INTEGER 2000..2024; ticket_price REAL 0.0..35.0
visit|visits: visit_id INTEGER key; exhibition_id INTEGER >exhibition; visitor_count INTEGER 10..90000; visit_month VARCHAR =January,April,July,October,December
# farming
farm|farms: farm_id INTEGER key; name VARCHAR =Green Acres,Hilltop,Willow Creek,Sunny Meadow,Red Barn; country VARCHAR @country; hectares INTEGER 5..12000; organic VARCHAR =yes,no
crop|crops: crop_id INTEGER key; crop_name VARCHAR =wheat,barley,corn,soybeans,potatoes,grapes,olives; farm_id INTEGER >farm; yield_tons REAL 0.5..9000.0; harvest_year INTEGER 2010..2024
livestock|livestock records: record_id INTEGER key; farm_id INTEGER >farm; animal VARCHAR =cattle,sheep,goats,pigs,chickens; head_count INTEGER 1..20000
# software
developer|developers: developer_id INTEGER key; name VARCHAR @person; country VARCHAR @country; experience_years INTEGER 0..35; level VARCHAR =junior,mid,senior,principal
repository|repositories: repo_id INTEGER key; repo_name VARCHAR =atlas-api,web-client,billing-service,data-pipeline,auth-gateway,mobile-app; language VARCHAR =Python,TypeScript,Go,Rust,Java,Kotlin; stars INTEGER 0..85000; owner_id INTEGER >developer
commit_log|commits: commit_id INTEGER key; repo_id INTEGER >repository; developer_id INTEGER >developer; lines_added INTEGER 1..5000; lines_removed INTEGER 0..3000; commit_year INTEGER 2015..2024
issue|issues: issue_id INTEGER key; repo_id INTEGER >repository; severity VARCHAR =low,medium,high,critical; days_open INTEGER 0..700; issue_state VARCHAR =open,closed
# events
venue|venues: venue_id INTEGER key; name VARCHAR =Blue Hall,The Arena,Riverside Park,Old Theatre,Expo Center; city VARCHAR @city; capacity INTEGER 100..80000
concert|concerts: concert_id INTEGER key; venue_id INTEGER >venue; headliner VARCHAR =The Lanterns,Mira Vale,Northbound,Golden Static,Paper Moons; concert_year INTEGER 2005..2024; tickets_sold INTEGER 50..78000; ticket_price REAL 10.0..250.0
sponsor|sponsors: sponsor_id INTEGER key; company VARCHAR @company; concert_id INTEGER >concert; amount INTEGER 1000..500000
# wildlife
park|parks: park_id INTEGER key; name VARCHAR =Blue Ridge,Red Canyon,Cedar Valley,Lake Mira,Stone Hills; country VARCHAR @country; area_km2 INTEGER 10..20000; established INTEGER 1872..2015
species|species: species_id INTEGER key; common_name VARCHAR =red fox,grey wolf,brown bear,golden eagle,lynx,otter,bison; conservation_status VARCHAR =least concern,vulnerable,endangered; average_weight REAL 0.5..900.0
sighting|sightings: sighting_id INTEGER key; park_id INTEGER >park; species_id INTEGER >species; sighting_year INTEGER 2000..2024; animals_counted INTEGER 1..400
# elections
party|parties: party_id INTEGER key; name VARCHAR =Green Alliance,Liberal Union,Labour Front,Civic Party,People's Voice; founded_year INTEGER 1890..2019; ideology VARCHAR =centre,left,right,green
candidate|candidates: candidate_id INTEGER key; name VARCHAR @person; party_id INTEGER >party; age INTEGER 25..82; votes INTEGER 100..900000; district VARCHAR =North,South,East,West,Central
# shipping
ship|ships: ship_id INTEGER key; name VARCHAR =Northern Star,Sea Breeze,Iron Duke,Aurora,Polar Dawn,Santa Clara; ship_type VARCHAR =cargo,tanker,ferry,cruise; tonnage INTEGER 500..220000; built_year INTEGER 1960..2023; flag VARCHAR @country
port|ports: port_id INTEGER key; name VARCHAR =Rotterdam Bay,Port Mira,Harbor Nine,Cape Lumen,Saltwick; country VARCHAR @country; berths INTEGER 2..120
voyage|voyages: voyage_id INTEGER key; ship_id INTEGER >ship; port_id INTEGER >port; days_at_sea INTEGER 1..80; cargo_tons INTEGER 0..200000
# gym
gym_member|gym members: member_id INTEGER key; name VARCHAR @person; age INTEGER 16..80; plan VARCHAR =basic,plus,premium; monthly_fee REAL 15.0..120.0
trainer|trainers: trainer_id INTEGER key; name VARCHAR @person; specialty VARCHAR =yoga,strength,cardio,pilates,boxing; hourly_rate REAL 20.0..150.0
session|sessions: session_id INTEGER key; member_id INTEGER >gym_member; trainer_id INTEGER >trainer; duration_minutes INTEGER 20..120; calories_burned INTEGER 80..1200
# insurance
policy_holder|policy holders: holder_id INTEGER key; name VARCHAR @person; age INTEGER 18..92; city VARCHAR @city
policy|policies: policy_id INTEGER key; holder_id INTEGER >policy_holder; policy_type VARCHAR =car,home,life,travel,health; annual_premium REAL 90.0..9000.0; start_year INTEGER 2000..2024
claim|claims: claim_id INTEGER key; policy_id INTEGER >policy; amount_claimed REAL 50.0..400000.0; claim_status VARCHAR =open,approved,rejected,paid; claim_year INTEGER 2005..2024
# games
game|games: game_id INTEGER key; title VARCHAR =Star Forge,Tiny Kingdoms,Neon Drift,Dungeon Bakery,Orbit Tactics,Pixel Farm; genre VARCHAR =strategy,racing,puzzle,rpg,simulation; release_year INTEGER 1995..2024; price REAL 0.0..69.99
studio|studios: studio_id INTEGER key; name VARCHAR @company; country VARCHAR @country; employees INTEGER 3..8000
player_score|player scores: score_id INTEGER key; game_id INTEGER >game; player_name VARCHAR @person; score INTEGER 0..999999; hours_played INTEGER 1..3000
# climate
weather_station|weather stations: station_id INTEGER key; name VARCHAR =Mount Kea,Lake Pier,Airport East,Valley Floor,Cape North; country VARCHAR @country; altitude INTEGER 0..4200
measurement|measurements: measurement_id INTEGER key; station_id INTEGER >weather_station; measure_year INTEGER 1990..2024; avg_temperature REAL -25.0..35.0; rainfall_mm INTEGER 0..4000; wind_speed REAL 0.0..120.0
# charity
charity|charities: charity_id INTEGER key; name VARCHAR =Clean Water Now,Books for All,Green Future,Open Hands,Health Bridge; cause VARCHAR =education,health,environment,poverty,animals; founded INTEGER 1950..2022
donor|donors: donor_id INTEGER key; name VARCHAR @person; city VARCHAR @city; donor_type VARCHAR =individual,corporate,foundation
donation|donations: donation_id INTEGER key; donor_id INTEGER >donor; charity_id INTEGER >charity; amount REAL 5.0..250000.0; donation_year INTEGER 2010..2024
# automotive
manufacturer|manufacturers: manufacturer_id INTEGER key; name VARCHAR =Voltra,Kestrel Motors,Aurelia,Norden,Tessaro; country VARCHAR @country; founded INTEGER 1900..2015
car_model|car models: model_id INTEGER key; model_name VARCHAR =Aero,Cruiser,Spark,Nomad,Vista,Bolt GT; manufacturer_id INTEGER >manufacturer; horsepower INTEGER 70..780; fuel_type VARCHAR =petrol,diesel,electric,hybrid; base_price INTEGER 12000..210000
dealer|dealers: dealer_id INTEGER key; name VARCHAR @company; city VARCHAR @city; model_id INTEGER >car_model; units_sold INTEGER 0..5000
# tv
tv_channel|TV channels: channel_id INTEGER key; name VARCHAR =Channel One,Metro TV,Nova,Sports Plus,Kids Zone; country VARCHAR @country; language VARCHAR =English,Spanish,French,German,Japanese
tv_show|TV shows: show_id INTEGER key; title VARCHAR =Kitchen Wars,The Deep End,Night Desk,Wild Coast,Home Again; channel_id INTEGER >tv_channel; seasons INTEGER 1..25; viewers_millions REAL 0.1..22.0; show_genre VARCHAR =drama,comedy,reality,documentary,news
episode|episodes: episode_id INTEGER key; show_id INTEGER >tv_show; episode_title VARCHAR =Pilot,The Return,Crossroads,Homecoming,Finale,Aftermath; air_year INTEGER 1995..2024; rating REAL 1.0..10.0
"""

POOLS: dict[str, Callable[[Random], str]] = {
    "person": person,
    "city": lambda rng: rng.choice(CITIES),
    "country": lambda rng: rng.choice(COUNTRIES),
    "company": lambda rng: rng.choice(COMPANIES),
}


@dataclass
class Column:
    name: str
    type: str
    kind: str  # key | fk | text | num
    values: list[str] = field(default_factory=list)  # text: fixed values ([] = pooled)
    pool: str = ""
    low: float = 0
    high: float = 0
    ref: str = ""

    @property
    def phrase(self) -> str:
        words = self.name.replace("_", " ")
        return re.sub(r"^num ", "number of ", words)

    @property
    def categorical(self) -> bool:
        return self.kind == "text" and (bool(self.values) or self.pool in ("city", "country"))

    def value(self, rng: Random) -> str | float | int:
        if self.kind == "text":
            return rng.choice(self.values) if self.values else POOLS[self.pool](rng)
        if self.type == "REAL":
            return round(rng.uniform(self.low, self.high), 1)
        return nice_int(rng, int(self.low), int(self.high))


def nice_int(rng: Random, low: int, high: int) -> int:
    """A random integer in [low, high], rounded the way people write thresholds."""
    value = rng.randint(low, high)
    for step in (100000, 10000, 1000, 100, 10):
        if high - low >= step * 20:
            return max(low, min(high, round(value / step) * step))
    return value


@dataclass
class Table:
    name: str
    plural: str
    columns: list[Column]

    @property
    def singular(self) -> str:
        head, _, word = self.plural.rpartition(" ")
        return f"{head} {_singular(word)}" if head else _singular(word)

    def of(self, kind: str) -> list[Column]:
        return [c for c in self.columns if c.kind == kind]

    @property
    def label(self) -> Column | None:
        texts = [c for c in self.of("text") if not c.categorical]
        return texts[0] if texts else (self.of("text") or [None])[0]

    def groupable(self) -> list[Column]:
        """Categorical columns worth grouping by (not the table's label, e.g. a department's name)."""
        return [c for c in self.columns if c.categorical and c is not self.label]

    @property
    def key(self) -> Column | None:
        return (self.of("key") or [None])[0]

    def create(self) -> str:
        return f"CREATE TABLE {self.name} ({', '.join(f'{c.name} {c.type}' for c in self.columns)})"


def _singular(word: str) -> str:
    if word.endswith("ies"):
        return word[:-3] + "y"
    if re.search(r"(ses|xes|ches|shes)$", word):
        return word[:-2]
    return word[:-1] if word.endswith("s") and word != "species" else word


def parse_sql_schemas(text: str) -> list[list[Table]]:
    domains: list[list[Table]] = []
    for line in text.strip().splitlines():
        if line.startswith("#"):
            domains.append([])
            continue
        head, _, body = line.partition(": ")
        name, _, plural_phrase = head.partition("|")
        columns = []
        for spec in body.split("; "):
            col_name, col_type, kind = spec.split(" ", 2)
            column = Column(col_name, col_type, "text")
            if kind == "key":
                column.kind = "key"
            elif kind.startswith(">"):
                column.kind, column.ref = "fk", kind[1:]
            elif kind.startswith("="):
                column.values = kind[1:].split(",")
            elif kind.startswith("@"):
                column.pool = kind[1:]
            else:
                low, high = kind.split("..")
                column.kind, column.low, column.high = "num", float(low), float(high)
            columns.append(column)
        domains[-1].append(Table(name, plural_phrase, columns))
    return domains


SQL_DOMAINS = parse_sql_schemas(SQL_SCHEMAS)

CMP = {
    ">": ["greater than", "more than", "above", "over", "higher than"],
    "<": ["less than", "below", "under", "lower than", "smaller than"],
    ">=": ["at least", "no less than", "greater than or equal to"],
    "<=": ["at most", "no more than", "less than or equal to"],
}
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


# ================================================================================================
# JSON extraction: passage -> compact JSON object of the requested keys
#
# Each passage kind returns the text and the facts it states, as (key, type, value) in schema order;
# a row asks for a subset of them (sometimes plus a key the text does not mention, answered null).

MONTHS = "January February March April May June July August September October November December".split()
PRODUCTS = [("wireless mouse", 24.99), ("mechanical keyboard", 89.0), ("USB-C hub", 39.5), ("desk lamp", 32.0),
            ("espresso cups (set of 4)", 18.75), ("running shoes", 119.95), ("yoga mat", 27.4), ("water bottle", 14.0),
            ("noise-cancelling headphones", 249.0), ("linen shirt", 45.0), ("cast-iron skillet", 54.9),
            ("phone case", 12.5), ("backpack", 69.0), ("notebook", 6.25), ("LED strip", 21.3), ("plant pot", 9.8),
            ("monitor stand", 58.0), ("wool scarf", 36.0), ("tea sampler", 22.0), ("e-reader", 139.99)]
CURRENCIES = [("USD", "$"), ("EUR", "€"), ("GBP", "£")]
JOBS = ["data analyst", "backend engineer", "nurse practitioner", "warehouse supervisor", "UX designer",
        "accountant", "customer success manager", "electrician", "sous chef", "product manager", "lab technician",
        "high school teacher", "DevOps engineer", "marketing coordinator", "truck driver"]
EVENTS = ["Spring Tech Meetup", "Harbor Jazz Night", "Community Book Fair", "Open Source Summit", "Charity 10K Run",
          "Farmers' Market Day", "Indie Film Showcase", "Startup Pitch Evening", "Winter Craft Market",
          "Data Science Workshop", "Photography Walk", "Chess Open"]
VENUES = ["the Grand Hall", "Riverside Park", "the Old Library", "Pier 9", "the Civic Center", "Hotel Lumen",
          "the University Auditorium", "Warehouse 12", "the Botanical Garden"]
ISSUES = [("I cannot log in since the last update", "login"), ("I was charged twice for one order", "billing"),
          ("the package arrived damaged", "shipping"), ("the app crashes on startup", "bug"),
          ("I want to cancel my subscription", "account"), ("the password reset email never arrives", "login"),
          ("my invoice shows the wrong address", "billing"), ("my order is two weeks late", "shipping"),
          ("exporting a report to CSV fails with an error", "bug"), ("I need to change the email on my account", "account")]
SKILLS = ["Python", "SQL", "Excel", "Kubernetes", "Figma", "TypeScript", "accounting", "negotiation", "Spanish",
          "project management", "welding", "public speaking", "machine learning", "customer service"]
HOBBIES = ["climbing", "chess", "baking", "sailing", "photography", "gardening", "running marathons",
           "playing the cello", "birdwatching", "woodworking"]


def date_parts(rng: Random, years=(2021, 2025)) -> tuple[str, str]:
    """A random date as (text, ISO) e.g. ("March 5, 2024", "2024-03-05"), in one of several text styles."""
    y, m, d = rng.randint(*years), rng.randint(1, 12), rng.randint(1, 28)
    text = rng.choice([f"{MONTHS[m - 1]} {d}, {y}", f"{d} {MONTHS[m - 1]} {y}", f"{y}-{m:02d}-{d:02d}",
                       f"{MONTHS[m - 1][:3]} {d}, {y}"])
    return text, f"{y}-{m:02d}-{d:02d}"


def money(amount: float, symbol: str) -> str:
    return f"{symbol}{amount:,.2f}"


def email_of(name: str, rng: Random) -> str:
    first, last = name.lower().split()
    plain = {"ü": "u", "é": "e", "í": "i", "ê": "e", "ö": "o", "ı": "i", "ó": "o", "ç": "c"}
    first, last = ("".join(plain.get(ch, ch) for ch in part) for part in (first, last))
    return f"{rng.choice([first, first[0]])}{rng.choice(['.', '_', ''])}{last}@{rng.choice(['example.com', 'mail.test', 'inbox.example.org'])}"


def json_order(rng):
    name, (code, sym) = person(rng), rng.choice(CURRENCIES)
    order_id = f"{rng.choice(['ORD', 'A', 'NW', 'SO'])}-{rng.randint(10000, 999999)}"
    items = [(p, rng.randint(1, 4), price) for p, price in rng.sample(PRODUCTS, rng.randint(1, 4))]
    shipping = rng.choice([0.0, 4.99, 7.5, 12.0])
    total = round(sum(q * p for _, q, p in items) + shipping, 2)
    date_text, date_iso = date_parts(rng)
    city = rng.choice(CITIES)
    lines = "\n".join(f"- {q} x {p} @ {money(price, sym)}" for p, q, price in items)
    text = rng.choice([
        f"Hi {name.split()[0]},\n\nThanks for your order! Order {order_id} was placed on {date_text} and will ship to {name}, {city}.\n\n{lines}\n\nShipping: {money(shipping, sym)}\nTotal charged: {money(total, sym)} ({code})\n\nThe {rng.choice(COMPANIES)} team",
        f"Order confirmation #{order_id}\nCustomer: {name}\nDate: {date_text}\nShip to: {city}\nItems:\n{lines}\nShipping {money(shipping, sym)}, grand total {money(total, sym)} {code}.",
        f"Dear {name}, we received your order {order_id} on {date_text}. You bought:\n{lines}\nIt ships to {city}; shipping costs {money(shipping, sym)}. Amount due: {money(total, sym)}.",
    ])
    return text, [("order_id", "string", order_id), ("customer_name", "string", name), ("order_date", "string (YYYY-MM-DD)", date_iso),
                  ("items", [{"name": "string", "quantity": "integer", "unit_price": "number"}],
                   [{"name": p, "quantity": q, "unit_price": price} for p, q, price in items]),
                  ("shipping_cost", "number", shipping), ("total", "number", total), ("currency", "string", code),
                  ("shipping_city", "string", city)]


def json_bio(rng):
    name, city, country = person(rng), rng.choice(CITIES), rng.choice(COUNTRIES)
    age, job = rng.randint(22, 78), rng.choice(JOBS)
    employer = rng.choice(COMPANIES)
    years = rng.randint(1, min(30, age - 20))
    skills = rng.sample(SKILLS, rng.randint(1, 4))
    hobby = rng.choice(HOBBIES)
    text = rng.choice([
        f"{name} is a {age}-year-old {job} based in {city}, {country}. For the past {years} years they have worked at {employer}, where colleagues know them for {', '.join(skills)}. Outside work, {name.split()[0]} enjoys {hobby}.",
        f"Meet {name}! Born and raised in {country}, {name.split()[0]} now lives in {city} and works as a {job} at {employer} ({years} years and counting). Age: {age}. Key skills: {'; '.join(skills)}. Favourite pastime: {hobby}.",
        f"Speaker bio: {name} ({age}) has spent {years} years as a {job} with {employer}. They live in {city} ({country}) and bring deep expertise in {' and '.join(skills)}. When not working, they are usually {hobby}.",
    ])
    return text, [("name", "string", name), ("age", "integer", age), ("occupation", "string", job),
                  ("employer", "string", employer), ("years_at_employer", "integer", years), ("city", "string", city),
                  ("country", "string", country), ("skills", ["string"], skills), ("hobby", "string", hobby)]


def json_ticket(rng):
    name = person(rng)
    email = email_of(name, rng)
    issue, category = rng.choice(ISSUES)
    priority = rng.choice(["low", "medium", "high", "urgent"])
    ticket = rng.randint(1000, 99999)
    date_text, date_iso = date_parts(rng, (2023, 2025))
    order = rng.random() < 0.5 and f"{rng.randint(100000, 999999)}"
    order_part = f" Order number: {order}." if order else ""
    text = rng.choice([
        f"Ticket #{ticket} ({priority} priority), opened {date_text}\nFrom: {name} <{email}>\nMessage: \"{cap(issue)}.\"{order_part} The customer asked for a reply within {rng.randint(1, 3)} business days.",
        f"Support request from {name} ({email}) on {date_text}: \"{cap(issue)}.\"{order_part} Marked as {priority}. Reference {ticket}.",
        f"[{priority.upper()}] #{ticket} - {date_text}\n{name} writes: \"Hello, {issue}. Please help.\"{order_part} Contact: {email}",
    ])
    return text, [("ticket_id", "integer", ticket), ("customer_name", "string", name), ("email", "string", email),
                  ("opened_on", "string (YYYY-MM-DD)", date_iso), ("priority", "string", priority), ("category", "string", category),
                  ("order_number", "string|null", order or None)]


def json_event(rng):
    event, venue, city = rng.choice(EVENTS), rng.choice(VENUES), rng.choice(CITIES)
    date_text, date_iso = date_parts(rng, (2024, 2026))
    hour, minute = rng.randint(8, 21), rng.choice([0, 15, 30, 45])
    price = rng.choice([0, 5, 10, 12.5, 15, 20, 25, 35, 49])
    capacity = rng.choice([40, 60, 80, 120, 150, 200, 300, 500, 1000])
    organizer = rng.choice(COMPANIES + [person(rng)])
    time_text = f"{(hour - 1) % 12 + 1}:{minute:02d} {'AM' if hour < 12 else 'PM'}" if rng.random() < 0.5 else f"{hour:02d}:{minute:02d}"
    price_text = "free entry" if price == 0 else f"tickets cost {money(price, '$')}"
    text = rng.choice([
        f"Join us for the {event} on {date_text} at {time_text} at {venue} in {city}! Organized by {organizer}. Space is limited to {capacity} people; {price_text}.",
        f"ANNOUNCEMENT: {event}\nWhen: {date_text}, {time_text}\nWhere: {venue}, {city}\nHost: {organizer}\nCapacity: {capacity}\nPrice: {'free' if price == 0 else money(price, '$')}",
        f"{organizer} is proud to present the {event}. Doors open {date_text} at {time_text}, {venue} ({city}). Up to {capacity} guests, {price_text}. See you there!",
    ])
    return text, [("event_name", "string", event), ("date", "string (YYYY-MM-DD)", date_iso), ("start_time", "string", f"{hour:02d}:{minute:02d}"),
                  ("venue", "string", venue.removeprefix("the ")), ("city", "string", city), ("organizer", "string", organizer),
                  ("capacity", "integer", capacity), ("ticket_price", "number", float(price)), ("is_free", "boolean", price == 0)]


def json_product(rng):
    product, base = rng.choice(PRODUCTS)
    brand = rng.choice(["Nordvik", "Acorn", "Lumo", "Tessel", "Brava", "Kiku", "Orla", "Vento"])
    price = round(base * rng.choice([0.8, 0.9, 1.0, 1.1, 1.25]), 2)
    code, sym = rng.choice(CURRENCIES)
    rating = round(rng.uniform(2.5, 5.0), 1)
    reviews = rng.randint(0, 5000)
    stock = rng.choice([0, 0, 3, 12, 40, 150])
    colors = rng.sample(["black", "white", "sage green", "navy", "sand", "red", "grey"], rng.randint(1, 3))
    sku = f"{brand[:3].upper()}-{rng.randint(100, 999)}-{rng.choice('ABCDEFGH')}"
    stock_text = "Currently out of stock." if stock == 0 else f"Only {stock} left in stock." if stock < 20 else "In stock."
    text = rng.choice([
        f"{brand} {product} (SKU {sku}) - {money(price, sym)}. Available in {', '.join(colors)}. Rated {rating}/5 from {reviews:,} reviews. {stock_text}",
        f"New from {brand}: the {product}. Colors: {' / '.join(colors)}. Price {money(price, sym)} {code}. Customers give it {rating} stars ({reviews:,} ratings). {stock_text} Item code: {sku}.",
    ])
    return text, [("brand", "string", brand), ("product", "string", product), ("sku", "string", sku),
                  ("price", "number", price), ("currency", "string", code), ("colors", ["string"], colors),
                  ("rating", "number", rating), ("review_count", "integer", reviews), ("in_stock", "boolean", stock > 0)]


def json_job(rng):
    job, company, city = rng.choice(JOBS), rng.choice(COMPANIES), rng.choice(CITIES)
    low = rng.randrange(35, 140) * 1000
    high = low + rng.randrange(5, 40) * 1000
    remote = rng.choice(["remote", "hybrid", "on-site"])
    years = rng.randint(0, 10)
    skills = rng.sample(SKILLS, rng.randint(2, 4))
    deadline_text, deadline_iso = date_parts(rng, (2024, 2026))
    text = rng.choice([
        f"{company} is hiring a {job} in {city} ({remote}). Salary: ${low:,} - ${high:,} per year. You have {years}+ years of experience and know {', '.join(skills)}. Apply by {deadline_text}.",
        f"Job opening: {cap(job)}\nCompany: {company}\nLocation: {city}, {remote}\nPay range: {low // 1000}k-{high // 1000}k USD\nRequirements: at least {years} years of experience; {', '.join(skills)}\nApplications close {deadline_text}.",
    ])
    return text, [("title", "string", job), ("company", "string", company), ("location", "string", city),
                  ("work_mode", "string", remote), ("salary_min", "integer", low), ("salary_max", "integer", high),
                  ("min_years_experience", "integer", years), ("skills", ["string"], skills), ("apply_by", "string (YYYY-MM-DD)", deadline_iso)]


def json_flight(rng):
    name = person(rng)
    origin, dest = rng.sample(CITIES, 2)
    flight = f"{rng.choice(['AN', 'SJ', 'PA', 'BC', 'CL'])}{rng.randint(100, 9999)}"
    date_text, date_iso = date_parts(rng, (2024, 2026))
    seat = f"{rng.randint(1, 45)}{rng.choice('ABCDEF')}"
    cabin = rng.choice(["economy", "premium economy", "business"])
    bags = rng.randint(0, 3)
    pnr = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(6))
    text = rng.choice([
        f"Booking reference {pnr}. Passenger {name} is confirmed on flight {flight} from {origin} to {dest} on {date_text}, seat {seat} ({cabin}), with {bags} checked bag{'s' if bags != 1 else ''}.",
        f"Your trip to {dest}\nPassenger: {name}\nFlight {flight}, {origin} -> {dest}\nDeparture date: {date_text}\nCabin: {cabin}, seat {seat}\nChecked baggage: {bags}\nConfirmation code: {pnr}",
    ])
    return text, [("booking_reference", "string", pnr), ("passenger", "string", name), ("flight_number", "string", flight),
                  ("origin", "string", origin), ("destination", "string", dest), ("departure_date", "string (YYYY-MM-DD)", date_iso),
                  ("seat", "string", seat), ("cabin", "string", cabin), ("checked_bags", "integer", bags)]


def json_rental(rng):
    city = rng.choice(CITIES)
    bedrooms, bathrooms = rng.randint(0, 4), rng.randint(1, 3)
    area = rng.randrange(25, 180)
    rent = rng.randrange(45, 400) * 10
    code, sym = rng.choice(CURRENCIES)
    pets = rng.random() < 0.5
    furnished = rng.random() < 0.5
    agent = person(rng)
    date_text, date_iso = date_parts(rng, (2024, 2025))
    kind = "studio" if bedrooms == 0 else f"{bedrooms}-bedroom apartment"
    text = rng.choice([
        f"Bright {'furnished ' if furnished else ''}{kind} in central {city}, {area} m², {bathrooms} bathroom{'s' if bathrooms > 1 else ''}. Rent {money(rent, sym)} per month. {'Pets welcome.' if pets else 'No pets, sorry.'} Available from {date_text}. Contact {agent}.",
        f"FOR RENT - {city}: {kind}, {area} square meters, {bathrooms} bath. {'Comes furnished.' if furnished else 'Unfurnished.'} {money(rent, sym)}/month ({code}). Pets: {'yes' if pets else 'no'}. Move-in {date_text}. Ask for {agent}.",
    ])
    return text, [("city", "string", city), ("bedrooms", "integer", bedrooms), ("bathrooms", "integer", bathrooms),
                  ("area_m2", "integer", area), ("monthly_rent", "number", float(rent)), ("currency", "string", code),
                  ("furnished", "boolean", furnished), ("pets_allowed", "boolean", pets), ("available_from", "string (YYYY-MM-DD)", date_iso),
                  ("contact", "string", agent)]


def json_appointment(rng):
    patient, doctor = person(rng), person(rng)
    specialty = rng.choice(["dermatology", "cardiology", "physiotherapy", "dentistry", "ophthalmology", "general practice"])
    date_text, date_iso = date_parts(rng, (2024, 2025))
    hour, minute = rng.randint(8, 17), rng.choice([0, 20, 30, 40])
    clinic = rng.choice(["Hillcrest Clinic", "Mercy Care", "Lakeshore Medical", "Northgate Health", "St. Mary Practice"])
    fasting = rng.random() < 0.3
    text = rng.choice([
        f"Reminder: {patient} has {article(specialty)} appointment with Dr. {doctor} at {clinic} on {date_text} at {hour:02d}:{minute:02d}.{' Please do not eat for 8 hours before the visit.' if fasting else ''} Reply C to confirm.",
        f"Dear {patient},\nthis confirms your visit to Dr. {doctor} ({specialty}) on {date_text}, {hour:02d}:{minute:02d}, at {clinic}.{' Fasting is required.' if fasting else ' No preparation is needed.'}",
    ])
    return text, [("patient", "string", patient), ("doctor", "string", doctor), ("specialty", "string", specialty),
                  ("clinic", "string", clinic), ("date", "string (YYYY-MM-DD)", date_iso), ("time", "string", f"{hour:02d}:{minute:02d}"),
                  ("fasting_required", "boolean", fasting)]


JSON_KINDS = [json_order, json_bio, json_ticket, json_event, json_product, json_job, json_flight, json_rental,
              json_appointment]
OPTIONAL_EXTRAS = [("phone", "string|null"), ("notes", "string|null"), ("discount_code", "string|null"),
                   ("website", "string|null"), ("loyalty_number", "string|null")]


def json_row(rng: Random) -> dict:
    text, facts = rng.choice(JSON_KINDS)(rng)
    keep = sorted(rng.sample(range(len(facts)), rng.randint(min(3, len(facts)), len(facts))))
    chosen = [facts[i] for i in keep]
    if rng.random() < 0.15:
        extra = rng.choice(OPTIONAL_EXTRAS)
        if extra[0] not in {k for k, _, _ in chosen}:
            chosen.insert(rng.randint(0, len(chosen)), (*extra, None))
    schema = {key: type_ for key, type_, _ in chosen}
    answer = {key: value for key, _, value in chosen}
    compact = dict(separators=(",", ":"), ensure_ascii=False)
    return {"text": text, "schema": json.dumps(schema, **compact), "answer": json.dumps(answer, **compact)}


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


# ================================================================================================
# TypeScript: task instruction -> code
#
# Entities: "Name: field type; ..." (a trailing ? marks an optional field). Tasks combine an entity,
# some of its fields and one of a dozen task kinds.

TS_ENTITIES = """
User: id number; name string; email string; age number; isActive boolean; createdAt Date; role "admin" | "editor" | "viewer"; tags string[]; nickname? string
Product: id string; title string; price number; stock number; category "books" | "toys" | "tools" | "garden"; discontinued boolean; rating? number
Order: id string; customerId string; total number; currency "USD" | "EUR" | "GBP"; status "pending" | "paid" | "shipped" | "cancelled"; placedAt Date; itemCount number; couponCode? string
Invoice: id number; number string; amount number; dueDate Date; paid boolean; customerName string; lineCount number; notes? string
Task: id number; title string; done boolean; priority "low" | "medium" | "high"; estimateHours number; assignee? string; dueAt? Date
Book: isbn string; title string; author string; pages number; publishedYear number; genre "fiction" | "history" | "science" | "poetry"; available boolean
Flight: code string; origin string; destination string; departure Date; seatsLeft number; price number; status "scheduled" | "delayed" | "landed" | "cancelled"
Employee: id number; fullName string; department string; salary number; hiredAt Date; remote boolean; managerId? number
Ticket: id number; subject string; severity "low" | "normal" | "urgent"; open boolean; createdAt Date; reporterEmail string; assigneeId? number
Article: slug string; title string; body string; wordCount number; published boolean; publishedAt? Date; tags string[]
SensorReading: sensorId string; timestamp Date; temperature number; humidity number; batteryLevel number; faulty boolean
Transaction: id string; accountId string; amount number; kind "credit" | "debit"; bookedAt Date; description string; pending boolean
Movie: id number; title string; year number; rating number; genres string[]; runtimeMinutes number; director? string
Recipe: id number; name string; servings number; prepMinutes number; vegetarian boolean; cuisine "italian" | "thai" | "mexican" | "indian"; ingredients string[]
Vehicle: vin string; make string; model string; year number; mileage number; fuel "petrol" | "diesel" | "electric" | "hybrid"; forSale boolean
Course: code string; title string; credits number; capacity number; enrolled number; level "intro" | "intermediate" | "advanced"; instructor? string
Appointment: id number; patientName string; startsAt Date; durationMinutes number; confirmed boolean; kind "checkup" | "followup" | "surgery"
Repo: id number; name string; stars number; forks number; language string; archived boolean; updatedAt Date; license? string
Song: id number; title string; artist string; durationSeconds number; plays number; explicit boolean; album? string
HotelRoom: number string; floor number; beds number; nightlyRate number; smoking boolean; view "sea" | "city" | "garden"
Shipment: trackingId string; weightKg number; destinationCountry string; shippedAt Date; delivered boolean; carrier "dhl" | "ups" | "fedex" | "post"
Review: id number; productId string; stars number; text string; verified boolean; createdAt Date; helpfulVotes number
"""


@dataclass
class TsField:
    name: str
    type: str
    optional: bool

    @property
    def decl(self) -> str:
        return f"{self.name}{'?' if self.optional else ''}: {self.type};"

    @property
    def base(self) -> str:
        """typeof-able kind: string | number | boolean | Date | array | union."""
        if self.type.endswith("[]"):
            return "array"
        if '"' in self.type:
            return "union"
        return self.type


@dataclass
class TsEntity:
    name: str
    fields: list[TsField]

    @property
    def id(self) -> TsField:
        return self.fields[0]

    @property
    def plural(self) -> str:
        return plural(self.name)

    @property
    def var(self) -> str:
        return self.name[0].lower() + self.name[1:]

    def of(self, *bases: str, required: bool = False) -> list[TsField]:
        return [f for f in self.fields if f.base in bases and not (required and f.optional)]

    def interface(self, fields: list[TsField] | None = None, export: bool = True) -> str:
        body = "\n".join(f"  {f.decl}" for f in (fields or self.fields))
        return f"{'export ' if export else ''}interface {self.name} {{\n{body}\n}}"


def parse_ts_entities(text: str) -> list[TsEntity]:
    entities = []
    for line in text.strip().splitlines():
        name, _, body = line.partition(": ")
        fields = []
        for spec in body.split("; "):
            field_name, type_ = spec.split(" ", 1)
            fields.append(TsField(field_name.rstrip("?"), type_, field_name.endswith("?")))
        entities.append(TsEntity(name, fields))
    return entities


TS_ENTITY_LIST = parse_ts_entities(TS_ENTITIES)


def camel(*words: str) -> str:
    first, *rest = words
    return first[0].lower() + first[1:] + "".join(w[0].upper() + w[1:] for w in rest)


def ts_interface(rng, e):
    fields = [e.id] + rng.sample(e.fields[1:], rng.randint(2, len(e.fields) - 1))
    fields.sort(key=e.fields.index)
    readonly = rng.random() < 0.3
    described = ", ".join(f"`{f.name}` ({'optional ' if f.optional else ''}{f.type.replace(chr(34), chr(39))})" for f in fields)
    instr = rng.choice([f"Define a TypeScript interface `{e.name}` with the fields {described}.",
                        f"Write an exported interface named {e.name} describing an object with: {described}."])
    if readonly:
        instr += f" Make `{e.id.name}` readonly."
    code = e.interface(fields)
    if readonly:
        code = code.replace(f"  {e.id.name}:", f"  readonly {e.id.name}:", 1)
    return instr, code


def ts_filter(rng, e):
    f = rng.choice(e.of("boolean", "union", "string", "number", required=True)[1:] or e.fields[1:2])
    name = camel("filter", e.plural, "by", f.name)
    if f.base == "number":
        instr = f"Write a typed function `{name}` that returns the {e.plural.lower()} whose `{f.name}` is between `min` and `max` (inclusive), without mutating the input."
        code = (f"{e.interface()}\n\nexport function {name}(items: readonly {e.name}[], min: number, max: number): {e.name}[] {{\n"
                f"  return items.filter((item) => item.{f.name} >= min && item.{f.name} <= max);\n}}")
    else:
        param = f'{e.name}["{f.name}"]' if f.base == "union" else f.type
        instr = f"Write a function `{name}(items, {f.name})` that keeps only the {e.name} objects with the given `{f.name}`. Use precise parameter types."
        code = (f"{e.interface()}\n\nexport function {name}(items: readonly {e.name}[], {f.name}: {param}): {e.name}[] {{\n"
                f"  return items.filter((item) => item.{f.name} === {f.name});\n}}")
    return instr, code


def ts_aggregate(rng, e):
    nums = e.of("number", required=True)
    nums = [n for n in nums if n is not e.id] or nums
    if not nums:
        return None
    f = rng.choice(nums)
    kind = rng.choice(["sum", "average", "max"])
    name = camel(kind, f.name)
    if kind == "sum":
        body = f"  return items.reduce((total, item) => total + item.{f.name}, 0);"
        ret = "number"
    elif kind == "average":
        body = (f"  if (items.length === 0) {{\n    return 0;\n  }}\n"
                f"  const total = items.reduce((sum, item) => sum + item.{f.name}, 0);\n  return total / items.length;")
        ret = "number"
    else:
        body = (f"  let best: {e.name} | undefined;\n  for (const item of items) {{\n"
                f"    if (best === undefined || item.{f.name} > best.{f.name}) {{\n      best = item;\n    }}\n  }}\n  return best;")
        ret = f"{e.name} | undefined"
    what = {"sum": f"the sum of `{f.name}`", "average": f"the average `{f.name}` (0 for an empty list)",
            "max": f"the {e.name} with the largest `{f.name}` (or undefined for an empty list)"}[kind]
    instr = f"Implement `{name}(items: {e.name}[])` in TypeScript returning {what} over a list of {e.plural.lower()}."
    return instr, f"{e.interface()}\n\nexport function {name}(items: readonly {e.name}[]): {ret} {{\n{body}\n}}"


def ts_group(rng, e):
    keys = e.of("union", "boolean", "string", required=True)[1:]
    if not keys:
        return None
    f = rng.choice(keys)
    name = camel("group", e.plural, "by", f.name)
    if rng.random() < 0.5:
        key_type = f'{e.name}["{f.name}"]' if f.base == "union" else "string"
        record = f"Partial<Record<{key_type}, {e.name}[]>>" if f.base == "union" else f"Record<string, {e.name}[]>"
        key_expr = f"String(item.{f.name})" if f.base == "boolean" else f"item.{f.name}"
        code = (f"{e.interface()}\n\nexport function {name}(items: readonly {e.name}[]): {record} {{\n"
                f"  const groups: {record} = {{}};\n  for (const item of items) {{\n    const key = {key_expr};\n"
                f"    (groups[key] ??= []).push(item);\n  }}\n  return groups;\n}}")
        instr = f"Write `{name}`, which groups {e.plural.lower()} by their `{f.name}` into a plain object, fully typed."
    else:
        key_type = f.type if f.base in ("string", "boolean") else f'{e.name}["{f.name}"]'
        code = (f"{e.interface()}\n\nexport function {name}(items: Iterable<{e.name}>): Map<{key_type}, {e.name}[]> {{\n"
                f"  const groups = new Map<{key_type}, {e.name}[]>();\n  for (const item of items) {{\n"
                f"    const bucket = groups.get(item.{f.name});\n    if (bucket) {{\n      bucket.push(item);\n    }} else {{\n"
                f"      groups.set(item.{f.name}, [item]);\n    }}\n  }}\n  return groups;\n}}")
        instr = f"Group an iterable of {e.name} by `{f.name}` and return a `Map`. Name the function `{name}` and type it precisely."
    return instr, code


def ts_sort(rng, e):
    f = rng.choice(e.of("number", "string", "Date", required=True))
    desc = rng.random() < 0.5
    name = camel("sort", e.plural, "by", f.name)
    a, b = ("b", "a") if desc else ("a", "b")
    compare = {"number": f"{a}.{f.name} - {b}.{f.name}", "string": f"{a}.{f.name}.localeCompare({b}.{f.name})",
               "Date": f"{a}.{f.name}.getTime() - {b}.{f.name}.getTime()"}[f.base]
    instr = f"Write `{name}` that returns a new array of {e.plural.lower()} sorted by `{f.name}` in {'descending' if desc else 'ascending'} order; do not mutate the argument."
    return instr, (f"{e.interface()}\n\nexport function {name}(items: readonly {e.name}[]): {e.name}[] {{\n"
                   f"  return [...items].sort((a, b) => {compare});\n}}")


def ts_check(f: TsField, target: str) -> str:
    access = f"{target}.{f.name}"
    if f.base in ("string", "number", "boolean"):
        check = f'typeof {access} === "{f.base}"'
    elif f.base == "Date":
        check = f"{access} instanceof Date"
    elif f.base == "array":
        check = f'Array.isArray({access}) && {access}.every((x) => typeof x === "{f.type[:-2]}")'
    else:
        options = [o.strip() for o in f.type.split("|")]
        check = f"[{', '.join(options)}].includes({access} as string)"
    return f"({access} === undefined || {check})" if f.optional else check


def ts_guard(rng, e):
    name = f"is{e.name}"
    checks = "\n    && ".join(ts_check(f, "v") for f in e.fields)
    instr = rng.choice([f"Write a type guard `{name}(value: unknown): value is {e.name}` that validates every field at runtime.",
                        f"I receive untyped JSON. Implement a TypeScript user-defined type guard for the {e.name} interface below.\n\n{e.interface(export=False)}"])
    code = (f"{e.interface()}\n\nexport function {name}(value: unknown): value is {e.name} {{\n"
            f"  if (typeof value !== \"object\" || value === null) {{\n    return false;\n  }}\n"
            f"  const v = value as Record<string, unknown>;\n  return {checks};\n}}")
    return instr, code


def ts_fetch(rng, e):
    path = "/api/" + re.sub(r"(?<!^)(?=[A-Z])", "-", e.plural).lower()
    dates = e.of("Date")
    if rng.random() < 0.5:
        name = camel("fetch", e.name)
        revive = "".join(f"\n    {f.name}: {'data.' + f.name + ' === undefined ? undefined : ' if f.optional else ''}new Date(data.{f.name}),"
                         for f in dates)
        ret = "{\n    ...data," + revive + "\n  }" if dates else "data"
        raw = f"Omit<{e.name}, {' | '.join(repr(f.name).replace(chr(39), chr(34)) for f in dates)}> & Record<{' | '.join(repr(f.name).replace(chr(39), chr(34)) for f in dates)}, string>" if dates else e.name
        instr = f"Write an async function `{name}(baseUrl, {e.id.name})` that GETs `{path}/:{e.id.name}`, throws an `HttpError` with the status on a non-2xx response, and returns a typed {e.name}" + (" with date strings converted to Date objects." if dates else ".")
        code = (f"{e.interface()}\n\nexport class HttpError extends Error {{\n  constructor(public readonly status: number, message: string) {{\n"
                f"    super(message);\n    this.name = \"HttpError\";\n  }}\n}}\n\n"
                f"export async function {name}(baseUrl: string, {e.id.name}: {e.id.type}, init?: RequestInit): Promise<{e.name}> {{\n"
                f"  const response = await fetch(`${{baseUrl}}{path}/${{encodeURIComponent(String({e.id.name}))}}`, init);\n"
                f"  if (!response.ok) {{\n    throw new HttpError(response.status, `GET {path} failed: ${{response.statusText}}`);\n  }}\n"
                f"  const data = (await response.json()) as {raw};\n  return {ret};\n}}")
        return instr, code
    name = camel("list", e.plural)
    filters = rng.sample(e.of("string", "union", "boolean", "number", required=True)[1:], k=min(2, len(e.of("string", "union", "boolean", "number", required=True)[1:])))
    params = "".join(f"\n  {f.name}?: {f.type};" for f in filters)
    instr = (f"Create a typed fetch wrapper `{name}` for `GET {path}` that accepts optional query filters "
             f"({', '.join(f.name for f in filters) or 'none'}) plus `page` and `pageSize`, aborts after a timeout, and returns `Page<{e.name}>`.")
    code = (f"{e.interface()}\n\nexport interface Page<T> {{\n  items: T[];\n  total: number;\n  page: number;\n}}\n\n"
            f"export interface {e.name}Query {{{params}\n  page?: number;\n  pageSize?: number;\n}}\n\n"
            f"export async function {name}(baseUrl: string, query: {e.name}Query = {{}}, timeoutMs = {rng.choice([3000, 5000, 10000])}): Promise<Page<{e.name}>> {{\n"
            f"  const params = new URLSearchParams();\n  for (const [key, value] of Object.entries(query)) {{\n"
            f"    if (value !== undefined) {{\n      params.set(key, String(value));\n    }}\n  }}\n"
            f"  const controller = new AbortController();\n  const timer = setTimeout(() => controller.abort(), timeoutMs);\n"
            f"  try {{\n    const response = await fetch(`${{baseUrl}}{path}?${{params}}`, {{ signal: controller.signal }});\n"
            f"    if (!response.ok) {{\n      throw new Error(`GET {path} failed with ${{response.status}}`);\n    }}\n"
            f"    return (await response.json()) as Page<{e.name}>;\n  }} finally {{\n    clearTimeout(timer);\n  }}\n}}")
    return instr, code


TS_UTILITIES = {
    "DeepPartial": ("makes every property optional, recursively (arrays and Dates stay as they are)",
                    "export type DeepPartial<T> = T extends Date | readonly unknown[]\n  ? T\n  : T extends object\n    ? { [K in keyof T]?: DeepPartial<T[K]> }\n    : T;"),
    "DeepReadonly": ("makes every property readonly, recursively, including arrays",
                     "export type DeepReadonly<T> = T extends (infer U)[]\n  ? ReadonlyArray<DeepReadonly<U>>\n  : T extends Date\n    ? T\n    : T extends object\n      ? { readonly [K in keyof T]: DeepReadonly<T[K]> }\n      : T;"),
    "KeysOfType": ("gives the keys of T whose value type is assignable to V",
                   "export type KeysOfType<T, V> = {\n  [K in keyof T]-?: T[K] extends V ? K : never;\n}[keyof T];"),
    "PickByType": ("picks the properties of T whose value type is assignable to V",
                   "export type PickByType<T, V> = {\n  [K in keyof T as T[K] extends V ? K : never]: T[K];\n};"),
    "OptionalKeys": ("gives the union of the optional keys of T",
                     "export type OptionalKeys<T> = {\n  [K in keyof T]-?: {} extends Pick<T, K> ? K : never;\n}[keyof T];"),
    "Mutable": ("removes readonly from every property of T",
                "export type Mutable<T> = {\n  -readonly [K in keyof T]: T[K];\n};"),
    "Nullable": ("allows null for every property of T",
                 "export type Nullable<T> = {\n  [K in keyof T]: T[K] | null;\n};"),
    "RequireKeys": ("makes the keys K of T required and leaves the rest unchanged",
                    "export type RequireKeys<T, K extends keyof T> = Omit<T, K> & Required<Pick<T, K>>;"),
    "Serialized": ("turns every Date property of T into an ISO string, as JSON.stringify does",
                   "export type Serialized<T> = {\n  [K in keyof T]: T[K] extends Date\n    ? string\n    : T[K] extends Date | undefined\n      ? string | undefined\n      : T[K];\n};"),
    "ValueOf": ("gives the union of the value types of T", "export type ValueOf<T> = T[keyof T];"),
    "Setters": ("maps each property `foo` of T to a method `setFoo(value)`",
                "export type Setters<T> = {\n  [K in keyof T as `set${Capitalize<string & K>}`]: (value: T[K]) => void;\n};"),
}


def ts_utility(rng, e):
    name = rng.choice(list(TS_UTILITIES))
    what, code = TS_UTILITIES[name]
    usage_name = {"KeysOfType": f"{e.name}NumberKeys", "PickByType": f"{e.name}StringFields",
                  "RequireKeys": f"Strict{e.name}"}.get(name, f"{name}{e.name}")
    args = {"KeysOfType": f"{e.name}, number", "PickByType": f"{e.name}, string",
            "RequireKeys": f"{e.name}, {' | '.join(chr(34) + f.name + chr(34) for f in e.fields if f.optional) or chr(34) + e.id.name + chr(34)}"}.get(name, e.name)
    instr = rng.choice([f"Write a generic utility type `{name}<T>` that {what}, and use it to declare `{usage_name}` for the {e.name} interface.",
                        f"Create a TypeScript mapped type called {name} that {what}. Show it applied to {e.name}."])
    return instr, f"{e.interface()}\n\n{code}\n\nexport type {usage_name} = {name}<{args}>;"


def ts_store(rng, e):
    cls = f"{e.name}{rng.choice(['Store', 'Repository', 'Registry'])}"
    idt = e.id
    instr = (f"Implement a class `{cls}` that keeps {e.plural.lower()} in memory keyed by `{idt.name}`, with `add`, `get`, "
             f"`update` (partial patch, `{idt.name}` cannot change), `remove` and `list(predicate?)`. No frameworks.")
    code = (f"{e.interface()}\n\nexport class {cls} {{\n  private readonly items = new Map<{idt.type}, {e.name}>();\n\n"
            f"  add(item: {e.name}): void {{\n    if (this.items.has(item.{idt.name})) {{\n"
            f"      throw new Error(`{e.name} ${{item.{idt.name}}} already exists`);\n    }}\n    this.items.set(item.{idt.name}, item);\n  }}\n\n"
            f"  get({idt.name}: {idt.type}): {e.name} | undefined {{\n    return this.items.get({idt.name});\n  }}\n\n"
            f"  update({idt.name}: {idt.type}, patch: Partial<Omit<{e.name}, \"{idt.name}\">>): {e.name} {{\n"
            f"    const current = this.items.get({idt.name});\n    if (!current) {{\n      throw new Error(`{e.name} ${{{idt.name}}} not found`);\n    }}\n"
            f"    const updated = {{ ...current, ...patch }};\n    this.items.set({idt.name}, updated);\n    return updated;\n  }}\n\n"
            f"  remove({idt.name}: {idt.type}): boolean {{\n    return this.items.delete({idt.name});\n  }}\n\n"
            f"  list(predicate: (item: {e.name}) => boolean = () => true): {e.name}[] {{\n    return [...this.items.values()].filter(predicate);\n  }}\n}}")
    return instr, code


def ts_union(rng, e):
    t = e.name
    idt = e.id
    changes = rng.sample(e.fields[1:], k=min(2, len(e.fields) - 1))
    instr = (f"Model the events of a {t} lifecycle as a discriminated union `{t}Event` (created, updated with a patch, deleted) "
             f"and write a reducer `apply{t}Event(state: Map<{idt.type}, {t}>, event: {t}Event)` that returns a new Map and checks exhaustiveness with `never`.")
    code = (f"{e.interface()}\n\nexport type {t}Event =\n  | {{ type: \"created\"; {e.var}: {t} }}\n"
            f"  | {{ type: \"updated\"; {idt.name}: {idt.type}; changes: Partial<Pick<{t}, {' | '.join(chr(34) + f.name + chr(34) for f in changes)}>> }}\n"
            f"  | {{ type: \"deleted\"; {idt.name}: {idt.type} }};\n\n"
            f"export function apply{t}Event(state: Map<{idt.type}, {t}>, event: {t}Event): Map<{idt.type}, {t}> {{\n"
            f"  const next = new Map(state);\n  switch (event.type) {{\n    case \"created\":\n"
            f"      next.set(event.{e.var}.{idt.name}, event.{e.var});\n      return next;\n    case \"updated\": {{\n"
            f"      const current = next.get(event.{idt.name});\n      if (current) {{\n        next.set(event.{idt.name}, {{ ...current, ...event.changes }});\n      }}\n"
            f"      return next;\n    }}\n    case \"deleted\":\n      next.delete(event.{idt.name});\n      return next;\n"
            f"    default: {{\n      const unreachable: never = event;\n      throw new Error(`unknown event ${{JSON.stringify(unreachable)}}`);\n    }}\n  }}\n}}")
    return instr, code


def ts_fix(rng, e):
    nums = [f for f in e.of("number", required=True) if f is not e.id]
    options = (["find"] if label(e) else []) + (["reduce"] if nums else []) + (["optional"] if any(f.optional and f.base == "string" for f in e.fields) else [])
    bug = rng.choice(options + ["param"])
    idt = e.id
    if bug == "find":
        broken = (f"function get{e.name}{cap(label(e))}(items: {e.name}[], {idt.name}: {idt.type}): string {{\n"
                  f"  const found = items.find((item) => item.{idt.name} === {idt.name});\n  return found.{label(e)};\n}}")
        error = "Object is possibly 'undefined'. (TS18048)"
        fixed = (f"function get{e.name}{cap(label(e))}(items: {e.name}[], {idt.name}: {idt.type}): string | undefined {{\n"
                 f"  const found = items.find((item) => item.{idt.name} === {idt.name});\n  return found?.{label(e)};\n}}")
    elif bug == "reduce":
        f = rng.choice(nums)
        broken = f"function total{cap(f.name)}(items: {e.name}[]): number {{\n  return items.reduce((sum, item) => sum + item.{f.name});\n}}"
        error = f"Operator '+' cannot be applied to types '{e.name}' and 'number'. (TS2365)"
        fixed = f"function total{cap(f.name)}(items: {e.name}[]): number {{\n  return items.reduce((sum, item) => sum + item.{f.name}, 0);\n}}"
    elif bug == "optional":
        f = next(f for f in e.fields if f.optional and f.base == "string")
        broken = f"function {f.name}Initial(item: {e.name}): string {{\n  return item.{f.name}.charAt(0).toUpperCase();\n}}"
        error = f"'item.{f.name}' is possibly 'undefined'. (TS18048)"
        fixed = f"function {f.name}Initial(item: {e.name}): string {{\n  return item.{f.name}?.charAt(0).toUpperCase() ?? \"\";\n}}"
    else:
        f = rng.choice(e.fields[1:])
        broken = f"function pluck{cap(f.name)}(items) {{\n  return items.map((item) => item.{f.name});\n}}"
        error = "Parameter 'items' implicitly has an 'any' type. (TS7006)"
        ret = f"({f.type} | undefined)[]" if f.optional else (f"({f.type})[]" if "|" in f.type else f"{f.type}[]")
        fixed = f"function pluck{cap(f.name)}(items: readonly {e.name}[]): {ret} {{\n  return items.map((item) => item.{f.name});\n}}"
    instr = (f"Fix the type error in this TypeScript code (strict mode):\n\n{e.interface(export=False)}\n\n{broken}\n\n"
             f"The compiler says: {error}")
    return instr, fixed


def label(e: TsEntity) -> str | None:
    """The first required string field that is not the id, if any (a name, title, ...)."""
    strings = [f for f in e.of("string", required=True) if f is not e.id]
    return strings[0].name if strings else None


def ts_validate(rng, e):
    fields = [f for f in e.fields if f.base in ("string", "number") and not f.optional]
    if len(fields) < 2:
        return None
    chosen = rng.sample(fields, k=min(len(fields), rng.randint(2, 3)))
    rules = []
    for f in chosen:
        if f.base == "string":
            rules.append((f"`{f.name}` must be a non-empty string",
                          f"  if (typeof input.{f.name} !== \"string\" || input.{f.name}.trim() === \"\") {{\n    errors.push(\"{f.name} must be a non-empty string\");\n  }}"))
        else:
            rules.append((f"`{f.name}` must be a finite number >= 0",
                          f"  if (typeof input.{f.name} !== \"number\" || !Number.isFinite(input.{f.name}) || input.{f.name} < 0) {{\n    errors.push(\"{f.name} must be a finite number >= 0\");\n  }}"))
    name = camel("validate", e.name, "Input")
    picked = " | ".join(chr(34) + f.name + chr(34) for f in chosen)
    instr = (f"Write `{name}` that checks an untrusted object and returns a `Result` (ok with the typed value, or a list of error messages). Rules: "
             + "; ".join(r[0] for r in rules) + ".")
    code = (f"{e.interface()}\n\nexport type Result<T, E> = {{ ok: true; value: T }} | {{ ok: false; error: E }};\n\n"
            f"export type {e.name}Input = Pick<{e.name}, {picked}>;\n\n"
            f"export function {name}(input: Record<string, unknown>): Result<{e.name}Input, string[]> {{\n"
            f"  const errors: string[] = [];\n" + "\n".join(r[1] for r in rules) + "\n"
            f"  if (errors.length > 0) {{\n    return {{ ok: false, error: errors }};\n  }}\n"
            f"  return {{ ok: true, value: input as {e.name}Input }};\n}}")
    return instr, code


def ts_dto(rng, e):
    dates = e.of("Date")
    if not dates:
        return None
    name = camel("to", e.name, "Dto")
    conv = "".join(f"\n    {f.name}: {e.var}.{f.name}{'?' if f.optional else ''}.toISOString()," for f in dates)
    instr = f"Define `{e.name}Dto`, the JSON-safe version of {e.name} where every Date becomes an ISO string, and write `{name}` plus its inverse `from{e.name}Dto`."
    back = "".join(f"\n    {f.name}: {'dto.' + f.name + ' === undefined ? undefined : ' if f.optional else ''}new Date(dto.{f.name}),"
                   for f in dates)
    fields = "".join(f"\n  {f.name}{'?' if f.optional else ''}: string;" for f in dates)
    omit = " | ".join(chr(34) + f.name + chr(34) for f in dates)
    code = (f"{e.interface()}\n\nexport type {e.name}Dto = Omit<{e.name}, {omit}> & {{{fields}\n}};\n\n"
            f"export function {name}({e.var}: {e.name}): {e.name}Dto {{\n  return {{\n    ...{e.var},{conv}\n  }};\n}}\n\n"
            f"export function from{e.name}Dto(dto: {e.name}Dto): {e.name} {{\n  return {{\n    ...dto,{back}\n  }};\n}}")
    return instr, code


def ts_enum(rng, e):
    unions = e.of("union")
    if not unions:
        return None
    f = rng.choice(unions)
    values = [v.strip().strip('"') for v in f.type.split("|")]
    enum = f"{e.name}{cap(f.name)}"
    labels = {v: cap(v.replace("_", " ")) for v in values}
    if rng.random() < 0.5:
        members = "\n".join(f"  {cap(v)} = \"{v}\"," for v in values)
        code = (f"export enum {enum} {{\n{members}\n}}\n\nexport const {camel(enum, 'Labels')}: Record<{enum}, string> = {{\n"
                + "\n".join(f"  [{enum}.{cap(v)}]: \"{labels[v]}\"," for v in values)
                + f"\n}};\n\nexport function parse{enum}(raw: string): {enum} | undefined {{\n"
                f"  return (Object.values({enum}) as string[]).includes(raw) ? (raw as {enum}) : undefined;\n}}")
        instr = f"Replace the string union for {e.name}.{f.name} ({f.type.replace(chr(34), chr(39))}) with a string enum `{enum}`, add a label map and a safe `parse{enum}` function."
    else:
        code = (f"export const {camel(enum, 'Values')} = [{', '.join(chr(34) + v + chr(34) for v in values)}] as const;\n\n"
                f"export type {enum} = (typeof {camel(enum, 'Values')})[number];\n\n"
                f"export function is{enum}(value: unknown): value is {enum} {{\n"
                f"  return typeof value === \"string\" && ({camel(enum, 'Values')} as readonly string[]).includes(value);\n}}")
        instr = f"Derive the type `{enum}` ({f.type.replace(chr(34), chr(39))}) from a `const` array so the values exist at runtime too, and write a type guard for it."
    return instr, code


def ts_generic(rng, e):
    kind = rng.choice(["cache", "debounce", "retry", "paginate"])
    if kind == "cache":
        cap_n = rng.choice([50, 100, 500, 1000])
        instr = (f"Write a generic `LruCache<K, V>` class with a fixed capacity (evicts the least recently used entry), then "
                 f"create a cache of {e.plural.lower()} keyed by `{e.id.name}` with capacity {cap_n}.")
        code = (f"{e.interface()}\n\nexport class LruCache<K, V> {{\n  private readonly entries = new Map<K, V>();\n\n"
                f"  constructor(private readonly capacity: number) {{\n    if (capacity < 1) {{\n      throw new RangeError(\"capacity must be >= 1\");\n    }}\n  }}\n\n"
                f"  get(key: K): V | undefined {{\n    const value = this.entries.get(key);\n    if (value !== undefined) {{\n"
                f"      this.entries.delete(key);\n      this.entries.set(key, value);\n    }}\n    return value;\n  }}\n\n"
                f"  set(key: K, value: V): void {{\n    this.entries.delete(key);\n    this.entries.set(key, value);\n"
                f"    if (this.entries.size > this.capacity) {{\n      const oldest = this.entries.keys().next().value as K;\n"
                f"      this.entries.delete(oldest);\n    }}\n  }}\n}}\n\n"
                f"export const {e.var}Cache = new LruCache<{e.id.type}, {e.name}>({cap_n});")
    elif kind == "debounce":
        ms = rng.choice([150, 250, 300, 500])
        instr = f"Write a typed generic `debounce` helper that preserves the wrapped function's parameter types, and use it to debounce `save{e.name}(item: {e.name})` by {ms} ms."
        code = (f"{e.interface()}\n\nexport function debounce<A extends unknown[]>(fn: (...args: A) => void, waitMs: number): (...args: A) => void {{\n"
                f"  let timer: ReturnType<typeof setTimeout> | undefined;\n  return (...args: A) => {{\n"
                f"    if (timer !== undefined) {{\n      clearTimeout(timer);\n    }}\n    timer = setTimeout(() => fn(...args), waitMs);\n  }};\n}}\n\n"
                f"declare function save{e.name}(item: {e.name}): void;\n\nexport const debouncedSave{e.name} = debounce(save{e.name}, {ms});")
    elif kind == "retry":
        n = rng.randint(2, 6)
        instr = f"Write `withRetry<T>(task: () => Promise<T>, attempts: number)` with exponential backoff, and use it to load a {e.name} by id with {n} attempts."
        code = (f"{e.interface()}\n\nexport async function withRetry<T>(task: () => Promise<T>, attempts: number, baseDelayMs = 200): Promise<T> {{\n"
                f"  let lastError: unknown;\n  for (let attempt = 0; attempt < attempts; attempt++) {{\n    try {{\n      return await task();\n"
                f"    }} catch (error) {{\n      lastError = error;\n      await new Promise((resolve) => setTimeout(resolve, baseDelayMs * 2 ** attempt));\n"
                f"    }}\n  }}\n  throw lastError;\n}}\n\ndeclare function load{e.name}({e.id.name}: {e.id.type}): Promise<{e.name}>;\n\n"
                f"export function load{e.name}WithRetry({e.id.name}: {e.id.type}): Promise<{e.name}> {{\n  return withRetry(() => load{e.name}({e.id.name}), {n});\n}}")
    else:
        size = rng.choice([10, 20, 25, 50])
        instr = f"Write a generic async generator `paginate<T>` that walks a paged API until it runs out of items, and use it to collect every {e.name} with page size {size}."
        code = (f"{e.interface()}\n\nexport async function* paginate<T>(\n  fetchPage: (page: number, pageSize: number) => Promise<T[]>,\n  pageSize: number,\n): AsyncGenerator<T, void, undefined> {{\n"
                f"  for (let page = 1; ; page++) {{\n    const items = await fetchPage(page, pageSize);\n    yield* items;\n"
                f"    if (items.length < pageSize) {{\n      return;\n    }}\n  }}\n}}\n\n"
                f"declare function fetch{e.plural}Page(page: number, pageSize: number): Promise<{e.name}[]>;\n\n"
                f"export async function all{e.plural}(): Promise<{e.name}[]> {{\n  const result: {e.name}[] = [];\n"
                f"  for await (const item of paginate(fetch{e.plural}Page, {size})) {{\n    result.push(item);\n  }}\n  return result;\n}}")
    return instr, code


TS_KINDS = [(ts_interface, 10), (ts_filter, 10), (ts_aggregate, 10), (ts_group, 7), (ts_sort, 9), (ts_guard, 4),
            (ts_fetch, 4), (ts_utility, 9), (ts_store, 3), (ts_union, 3), (ts_fix, 10), (ts_validate, 2), (ts_dto, 4),
            (ts_enum, 6), (ts_generic, 3)]


def typescript_row(rng: Random) -> dict:
    kinds, weights = zip(*TS_KINDS)
    while True:
        entity = rng.choice(TS_ENTITY_LIST)
        rest = entity.fields[1:]
        keep = sorted(rng.sample(range(len(rest)), rng.randint(2, len(rest))))
        entity = TsEntity(entity.name, [entity.id] + [rest[i] for i in keep])  # a variant of the model
        kind = rng.choices(kinds, weights)[0]
        made = kind(rng, entity)
        if made:
            break
    instruction, output = made
    if kind in (ts_filter, ts_aggregate, ts_group, ts_sort) and rng.random() < 0.4:
        # The model type lives elsewhere in the codebase: import it instead of declaring it.
        output = output.replace(entity.interface(), f'import type {{ {entity.name} }} from "./models";', 1)
        instruction += f" The `{entity.name}` type is exported from `./models`."
    return {"instruction": instruction, "output": output}


# ================================================================================================
# Writing

GENERATORS: dict[str, Callable[[Random], dict]] = {
    "sql": sql_row, "json": json_row, "neo4j": neo4j_row, "typescript": typescript_row,
}


def generate(name: str, rows: int = ROWS, seed: int = SEED) -> list[dict]:
    """``rows`` distinct rows of sample ``name``; the same list for the same (name, rows, seed)."""
    rng = Random(f"{seed}:{name}")
    make_row = GENERATORS[name]
    seen: set[str] = set()
    out: list[dict] = []
    attempts = 0
    while len(out) < rows:
        attempts += 1
        if attempts > 50 * rows:
            raise RuntimeError(f"{name}: only {len(out)} distinct rows after {attempts} tries; widen the vocabulary")
        row = make_row(rng)
        line = json.dumps(row, ensure_ascii=False, sort_keys=True)
        if line not in seen:
            seen.add(line)
            out.append(row)
    return out


def write_samples(out_dir: str | Path = DEFAULT_OUT, rows: int = ROWS, seed: int = SEED) -> dict[str, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in GENERATORS:
        path = out_dir / f"{name}.jsonl"
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            for row in generate(name, rows, seed):
                f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
        paths[name] = path
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output directory (default: %(default)s)")
    parser.add_argument("--rows", type=int, default=ROWS, help="rows per file (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=SEED, help="random seed (default: %(default)s)")
    args = parser.parse_args(argv)
    for name, path in write_samples(args.out, args.rows, args.seed).items():
        print(f"{name:<11} {path}  {path.stat().st_size:>9,} bytes")


if __name__ == "__main__":
    main()
