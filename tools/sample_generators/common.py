"""Shared vocabulary (names, places, companies, comparisons) and the column model the SQL and
Cypher generators both use."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from random import Random

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


CMP = {
    ">": ["greater than", "more than", "above", "over", "higher than"],
    "<": ["less than", "below", "under", "lower than", "smaller than"],
    ">=": ["at least", "no less than", "greater than or equal to"],
    "<=": ["at most", "no more than", "less than or equal to"],
}
