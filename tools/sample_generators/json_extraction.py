"""JSON extraction samples: passage -> compact JSON object of the requested keys."""

from __future__ import annotations

import json
from random import Random

from sample_generators.common import CITIES, COMPANIES, COUNTRIES, article, cap, person

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
