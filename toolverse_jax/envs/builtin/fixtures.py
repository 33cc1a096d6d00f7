"""Seeded fixture data shared by built-in servers, so values line up across servers.

`people(seed)` is the same list for contacts, mail, calendar, bank and tickets under one seed, so a
contact's email found in `contacts` is a valid recipient in `mail` and a payee in `bank`.
"""

import datetime as _dt
import functools
import random

FIRST = ["Ada", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira",
         "Liam", "Maya", "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera",
         "Wei", "Yara", "Zane"]
LAST = ["Adams", "Brown", "Chen", "Diaz", "Evans", "Fischer", "Garcia", "Haddad", "Ito", "Jensen",
        "Kowalski", "Lopez", "Müller", "Nakamura", "Okafor", "Patel", "Rossi", "Silva", "Tanaka",
        "Usman", "Novak", "Weber", "Young", "Zhang"]
COMPANIES = ["acme", "globex", "initech", "umbrella", "hooli", "vandelay", "stark", "wayne"]
CITIES = [("SFO", "San Francisco"), ("JFK", "New York"), ("LHR", "London"), ("CDG", "Paris"),
          ("NRT", "Tokyo"), ("BER", "Berlin"), ("SIN", "Singapore"), ("SYD", "Sydney"),
          ("YYZ", "Toronto"), ("MAD", "Madrid")]
PRODUCTS = [("Wireless Mouse", "electronics", 24.99), ("Mechanical Keyboard", "electronics", 89.0),
            ("USB-C Hub", "electronics", 39.5), ("Noise-Cancelling Headphones", "electronics", 199.0),
            ("Desk Lamp", "home", 34.25), ("Office Chair", "home", 249.0), ("Coffee Grinder", "kitchen", 59.9),
            ("French Press", "kitchen", 27.0), ("Water Bottle", "sports", 18.75), ("Yoga Mat", "sports", 32.0),
            ("Running Shoes", "sports", 119.0), ("Backpack", "travel", 74.0), ("Travel Adapter", "travel", 21.5),
            ("Notebook A5", "office", 6.5), ("Fountain Pen", "office", 45.0), ("Monitor 27in", "electronics", 329.0)]
SUBJECTS = ["Quarterly report", "Lunch on Friday?", "Invoice #{n}", "Project kickoff", "Contract review",
            "Travel plans", "Team offsite", "Budget approval", "Welcome aboard", "Follow-up on our call"]
BASE_DATE = _dt.date(2026, 3, 2)


@functools.lru_cache(maxsize=64)
def people(seed: int, n: int = 20) -> tuple[dict, ...]:
    """Returns `n` distinct seeded people: name, email, phone, company, city."""
    rng = random.Random(f"people:{seed}")
    pairs = rng.sample([(f, l) for f in FIRST for l in LAST], n)
    out = []
    for i, (f, l) in enumerate(pairs):
        company = rng.choice(COMPANIES)
        slug = l.lower().replace("ü", "u")
        out.append({"name": f"{f} {l}", "email": f"{f.lower()}.{slug}@{company}.com",
                    "phone": f"+1-555-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}",
                    "company": company.capitalize(), "city": rng.choice(CITIES)[1]})
    return tuple(out)


USER = {"name": "Alex Morgan", "email": "alex.morgan@example.com"}


def day(offset: int) -> str:
    """Returns the ISO date `offset` days after the fixture base date (2026-03-02)."""
    return (BASE_DATE + _dt.timedelta(days=offset)).isoformat()


def parse_date(s: str, param: str = "date") -> _dt.date:
    """Returns a date from 'YYYY-MM-DD' or raises ValueError naming the param."""
    try:
        return _dt.date.fromisoformat(s)
    except (TypeError, ValueError):
        raise ValueError(f"'{param}' must be a date 'YYYY-MM-DD'; got {s!r}") from None
