"""The recall benchmark's synthetic team: fact sentences from templates, their agents and tags, and the queries.

Every further fact is a variant of a pool sentence (same words, other numbers), so a small
pool of real embeddings stands for a team of 100k facts (see recall_loader).
"""

from __future__ import annotations

import random

TEAM = "bench-recall"
SMALL_AGENT, BIG_AGENT = "agent-2pct", "agent-30pct"
TAGS = 10
FACTS_PER_MEMORY = 5

NAMES = [
    "Alice Moreno",
    "Bilal Haddad",
    "Chen Wei",
    "Dana Kowalski",
    "Emeka Obi",
    "Fatima Zahra",
    "Gustav Berg",
    "Hana Sato",
    "Ivan Petrov",
    "Julia Costa",
    "Kofi Mensah",
    "Lena Fischer",
    "Mateo Ruiz",
    "Nadia Rahman",
    "Omar Farouk",
    "Priya Natarajan",
    "Quinn Harper",
    "Rosa Lindqvist",
    "Sam Oduya",
    "Tariq Aziz",
]
SERVICES = [
    "billing",
    "search",
    "checkout",
    "auth",
    "notifications",
    "analytics",
    "inventory",
    "payments",
    "shipping",
    "reporting",
    "gateway",
    "scheduler",
]
CUSTOMERS = [
    "Acme Corp",
    "Globex",
    "Initech",
    "Umbrella",
    "Stark Industries",
    "Wayne Enterprises",
    "Hooli",
    "Vandelay Imports",
    "Soylent",
    "Cyberdyne",
    "Tyrell",
    "Wonka Industries",
]
CITIES = ["Berlin", "Lisbon", "Zurich", "Nairobi", "Osaka", "Toronto", "Austin", "Warsaw", "Dublin", "Seoul"]
THINGS = [
    "green tea",
    "espresso",
    "window seats",
    "bullet-point summaries",
    "morning meetings",
    "dark mode",
    "vegetarian food",
    "async updates",
    "video calls",
    "written specs",
    "early flights",
    "quiet rooms",
]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
TEMPLATES = [
    "{name} prefers {thing} when working from the {city} office, desk {n}.",
    "The {service} deploy for {customer} finished in {n} minutes on {month} {d}.",
    "{customer} renewed the enterprise plan for {n} seats starting {month} {d}.",
    "{name} reported a bug in the {service} service, ticket {n}.",
    "The p99 latency of the {service} API rose to {n} ms in {city} on {month} {d}.",
    "{name} moved to the {city} office on {month} {d} and leads the {service} team of {n} people.",
    "{customer} asked to pay invoices in {city} by bank transfer within {n} days.",
    "{name} is on call for {service} from {month} {d} for {n} days.",
    "The {service} database migration for {customer} copied {n} thousand rows.",
    "{name} booked a trip to {city} on {month} {d} to meet {customer}, booking {n}.",
    "{customer} reported that {service} emails arrive {n} minutes late.",
    "{name} dislikes {thing} and asked for alternatives before {month} {d}, request {n}.",
]
QUERY_TEMPLATES = [
    "What does {name} prefer?",
    "How long did the {service} deploy take for {customer}?",
    "How many seats did {customer} renew?",
    "Which bug did {name} report?",
    "latency of the {service} API",
    "Who leads the {service} team?",
    "How does {customer} pay invoices?",
    "who is on call for {service}",
    "{service} database migration rows",
    "When is {name} travelling to {city}?",
    "Are {service} emails delayed for {customer}?",
    "What does {name} dislike?",
]


def fact_text(i: int, pool: int) -> tuple[str, int]:
    """The i-th fact and the pool sentence it varies: same words as its pool sentence, other numbers."""
    base = i % pool
    rng = random.Random(base)
    slots: dict[str, object] = {
        "name": rng.choice(NAMES),
        "service": rng.choice(SERVICES),
        "customer": rng.choice(CUSTOMERS),
        "city": rng.choice(CITIES),
        "thing": rng.choice(THINGS),
        "month": rng.choice(MONTHS),
    }
    variant = random.Random(i)
    slots.update(n=variant.randint(2, 9999), d=variant.randint(1, 28))
    return TEMPLATES[base % len(TEMPLATES)].format(**slots), base


def agent_of(memory_no: int) -> str:
    """2% of memories to one agent, 30% to another, the rest spread over eight more."""
    r = memory_no % 50
    return SMALL_AGENT if r == 0 else BIG_AGENT if r <= 15 else f"agent-{r % 8}"


def queries(count: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        out.append(
            QUERY_TEMPLATES[i % len(QUERY_TEMPLATES)].format(
                name=rng.choice(NAMES),
                service=rng.choice(SERVICES),
                customer=rng.choice(CUSTOMERS),
                city=rng.choice(CITIES),
            )
        )
    return out
