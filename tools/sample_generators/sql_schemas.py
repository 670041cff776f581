"""The SQL samples' data: 29 domains of CREATE TABLE schemas, as text in a small line language, and
its parser (:data:`SQL_DOMAINS`); sql.py generates questions and queries over them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sample_generators.common import Column


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
