"""The consolidation prompt, and turning its answer into one grounded line: "Subject: point; point; ...".

The model only rewords and merges: every point it returns must be made of the facts' own words (a point
with words the facts do not hold is dropped), and when nothing usable comes back the line is built from
the facts themselves. Dates stay: each fact is shown with the day it was said.
"""

from __future__ import annotations

import json
import re
from datetime import date
from typing import Any

from ..contract.text import STOPWORDS, normalize
from ..storage.consolidation import SourceFact

PROMPT_VERSION = "consolidate-v1"
MAX_POINT_CHARS = 160
GROUNDED_SHARE = 0.8  # of a point's content words that must appear in its facts

SYSTEM_PROMPT = (
    "You merge facts about one subject into a short list of points.\n"
    'Reply with JSON only: {"facts": ["...", "..."]}.\n'
    "Rules:\n"
    "- One point per distinct thing; merge facts that say the same thing, drop nothing else.\n"
    '- Leave the subject\'s name out of each point; start with the verb ("attends a support group").\n'
    "- Keep every date, number and name exactly as written; keep the day in brackets, as (7 May 2023).\n"
    "- Use only the words of the facts. Never add anything."
)


def schema(max_points: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "facts": {
                "type": "array",
                "maxItems": max_points,
                "items": {"type": "string", "minLength": 3, "maxLength": MAX_POINT_CHARS},
            }
        },
        "required": ["facts"],
        "additionalProperties": False,
    }


def _day(fact: SourceFact) -> str:
    if not fact.occurred_day:
        return ""
    try:
        day = date.fromisoformat(fact.occurred_day)
    except ValueError:
        return ""
    return f" ({day.day} {day.strftime('%B')} {day.year})"


def build_messages(subject: str, facts: list[SourceFact]) -> list[dict[str, str]]:
    lines = "\n".join(f"{fact.text}{_day(fact)}" for fact in facts)
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"Subject: {subject}\nFacts:\n{lines}"},
    ]


def _stems(text: str) -> set[str]:
    return {w[:5] for w in normalize(text).split() if len(w) > 1 and w not in STOPWORDS}


def _without_subject(subject: str, text: str) -> str:
    text = re.sub(r"^\s*[-*•]\s*", "", text).strip().rstrip(".;")
    if text.lower().startswith(subject.lower()):
        text = re.sub(r"^(?:'s|’s)?[\s,:]*", "", text[len(subject) :])
    return text.strip()


def parse_points(content: str) -> list[str]:
    try:
        data = json.loads(content)
    except ValueError:
        return []
    points = data.get("facts") if isinstance(data, dict) else None
    return [p for p in points if isinstance(p, str)] if isinstance(points, list) else []


def grounded(subject: str, points: list[str], facts: list[SourceFact]) -> list[str]:
    """The points made of the facts' words (and the subject's, and the days shown), each once."""
    said = _stems(" ".join(f.text for f in facts))
    known = said | _stems(subject + " " + " ".join(_day(f) for f in facts))
    out: list[str] = []
    for point in points:
        point = _without_subject(subject, point)
        words = _stems(point)
        if not words & said or len(words & known) < GROUNDED_SHARE * len(words):
            continue  # a date alone, or words the facts do not hold
        if point and point.lower() not in {p.lower() for p in out}:
            out.append(point)
    return out


def complete(subject: str, points: list[str], facts: list[SourceFact]) -> list[str]:
    """The model's points, plus any fact they left out (most of its words in none of them): merging may
    shorten the line, never lose what a source said."""
    said = _stems(" ".join(points))
    missing = [
        f
        for f in facts
        if (words := _stems(_without_subject(subject, f.text))) and len(words & said) < 0.5 * len(words)
    ]
    return points + [p for p in from_facts(subject, missing) if p.lower() not in {q.lower() for q in points}]


def from_facts(subject: str, facts: list[SourceFact]) -> list[str]:
    """The line's points when the model gave none usable: the facts themselves, with their days."""
    out: list[str] = []
    for fact in facts:
        point = _without_subject(subject, fact.text)
        day = _day(fact)
        if day and day.strip(" ()") not in point:
            point += day
        if point and point.lower() not in {p.lower() for p in out}:
            out.append(point)
    return out


def line(subject: str, points: list[str]) -> str:
    return f"{subject}: " + "; ".join(points)
