"""Relative dates in facts made absolute, in code: "yesterday" said on 8 May 2023 is 7 May 2023.

A fact read weeks later must not say "yesterday". Small models get calendar arithmetic wrong, so the
model never does it: after grounding, each relative expression in a fact gets the absolute date it
means appended, computed from the day the text was said (its `occurred_at`, else the save time), e.g.
"Caroline went to a support group yesterday (7 May 2023)". The expression stays, so grounding and spans
are unchanged, and a search for either form finds the fact.

Arithmetic is on calendar dates (never on seconds), so DST days of 23 or 25 hours change nothing;
months are clamped to their length (a month before 31 March is 28 or 29 February).

The rules read ASCII only (`re.ASCII`): "ſix days ago" or "last ſunday" (U+017F, which Unicode case folding
matches as "s") or "３ days ago" is not read, and an expression whose date is off the calendar ("in 999
days" in 9998) gets none: what the rules cannot read they skip, and a fact is never failed by its text.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from .grounding import GroundedFact
from .guard import reads_nothing_on_error
from .phatic import states_nothing
from .sentences import sentence_spans

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
NUMBER_WORDS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "a couple of": 2,
    "a few": 3,
}
_COUNT = r"(\d{1,3}|a|an|one|two|three|four|five|six|seven|eight|nine|ten|a couple of|a few)"
_UNIT = r"(day|week|month|year)s?"
_DAY_NAME = "(" + "|".join(WEEKDAYS) + ")"
_WHICH = {"last": -1, "next": 1, "this": 0}
_RULE_FLAGS = re.I | re.ASCII  # "ſix" matches "six" under Unicode case folding, but is no key of NUMBER_WORDS


def occurred(when: datetime | None, saved_at: float, zone: str) -> tuple[float | None, str]:
    """(epoch or None, its calendar day) for a save: `when` with an offset counts in that offset (the
    caller's own clock), a naive `when` in `zone`, and no `when` is the save time in `zone`."""
    if when is None:
        return None, datetime.fromtimestamp(saved_at, ZoneInfo(zone)).date().isoformat()
    local = when if when.tzinfo is not None else when.replace(tzinfo=ZoneInfo(zone))
    return local.astimezone(UTC).timestamp(), local.date().isoformat()


def day(d: date) -> str:
    return f"{d.day} {calendar.month_name[d.month]} {d.year}"


def month(d: date) -> str:
    return f"{calendar.month_name[d.month]} {d.year}"


def add_months(d: date, months: int) -> date:
    """`d` moved by whole months, clamped to the target month's length (31 Mar - 1 month = 28/29 Feb)."""
    index = d.year * 12 + d.month - 1 + months
    year, month0 = divmod(index, 12)
    return date(year, month0 + 1, min(d.day, calendar.monthrange(year, month0 + 1)[1]))


def _count(word: str) -> int:
    return int(word) if word.isdigit() else NUMBER_WORDS[word.lower()]  # an ASCII match: always a key


def _vague(count: str) -> str:
    return "around " if count.lower() in ("a few", "a couple of") else ""


def _shift(today: date, n: int, unit: str) -> str:
    """The date `n` units from `today` (negative: before), at the precision the unit carries."""
    unit = unit.lower()
    if unit == "day":
        return day(today + timedelta(days=n))
    if unit == "week":
        return "the week of " + day(_monday(today + timedelta(weeks=n)))
    if unit == "month":
        return month(add_months(today, n))
    return str(today.year + n)


def _monday(d: date) -> date:
    return d - timedelta(days=d.weekday())


def _weekday(today: date, which: str, name: str) -> str:
    """last X: the most recent X before today; next X: the first X after today; this X: X of this week."""
    target = WEEKDAYS.index(name.lower())
    if which == "last":
        back = (today.weekday() - target) % 7 or 7
        return day(today - timedelta(days=back))
    if which == "next":
        ahead = (target - today.weekday()) % 7 or 7
        return day(today + timedelta(days=ahead))
    return day(_monday(today) + timedelta(days=target))


Rule = tuple[re.Pattern[str], Callable[[re.Match[str], date], str]]

_RULES: list[Rule] = [
    (re.compile(r"\bthe day before yesterday\b", _RULE_FLAGS), lambda m, t: day(t - timedelta(days=2))),
    (re.compile(r"\bthe day after tomorrow\b", _RULE_FLAGS), lambda m, t: day(t + timedelta(days=2))),
    (re.compile(r"\b(yesterday|last night)\b", _RULE_FLAGS), lambda m, t: day(t - timedelta(days=1))),
    (re.compile(r"\btomorrow\b", _RULE_FLAGS), lambda m, t: day(t + timedelta(days=1))),
    (re.compile(r"\b(today|tonight|this (morning|afternoon|evening))\b", _RULE_FLAGS), lambda m, t: day(t)),
    (
        re.compile(rf"\b{_COUNT} {_UNIT} ago\b", _RULE_FLAGS),
        lambda m, t: _vague(m.group(1)) + _shift(t, -_count(m.group(1)), m.group(2)),
    ),
    (
        re.compile(rf"\bin {_COUNT} {_UNIT}\b", _RULE_FLAGS),
        lambda m, t: _vague(m.group(1)) + _shift(t, _count(m.group(1)), m.group(2)),
    ),
    (
        re.compile(rf"\b(last|next|this) {_DAY_NAME}\b", _RULE_FLAGS),
        lambda m, t: _weekday(t, m.group(1).lower(), m.group(2)),
    ),
    (
        re.compile(r"\b(last|next|this) weekend\b", _RULE_FLAGS),
        lambda m, t: "the weekend of " + day(_monday(t) + timedelta(days=5 + 7 * _WHICH[m.group(1).lower()])),
    ),
    (
        re.compile(r"\b(last|next|this) (week|month|year)\b", _RULE_FLAGS),
        lambda m, t: _shift(t, _WHICH[m.group(1).lower()], m.group(2)),
    ),
]


@reads_nothing_on_error(lambda text, today: text)
def resolve(text: str, today: date) -> str:
    """`text` with the absolute date appended after each relative date expression it holds, except in a
    sentence that states nothing ("Talk to you tomorrow!")."""
    found: list[tuple[int, int, str]] = []
    talk = [(start, end) for start, end in sentence_spans(text) if states_nothing(text[start:end])]
    for pattern, meaning in _RULES:
        for match in pattern.finditer(text):
            if any(start < match.end() and match.start() < end for start, end, _ in found):
                continue  # already covered by a longer expression ("the day before yesterday")
            if any(start <= match.start() < end for start, end in talk):
                continue  # "thanks for your patience today" states nothing: no date makes it a fact
            try:
                absolute = meaning(match, today)
            except (OverflowError, ValueError):  # "in 999 days" in 9998: off the calendar, no date given
                continue
            found.append((match.start(), match.end(), absolute))
    for _start, end, absolute in sorted(found, reverse=True):
        if text[end:].lstrip().startswith(f"({absolute})"):
            continue  # resolved before (a retry): never twice
        text = f"{text[:end]} ({absolute}){text[end:]}"
    return text


def resolve_facts(facts: list[GroundedFact], today: date) -> list[GroundedFact]:
    """Each fact with its relative dates resolved; its spans and sources unchanged."""
    return [replace(f, text=resolve(f.text, today)) for f in facts]
