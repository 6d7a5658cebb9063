"""Time in a question: what recall does with "when did ..." and with the dates a question names.

Facts carry absolute dates (`extraction/dates.py` appends "(7 May 2023)" to "yesterday"), and every saved
text has the day it happened (`occurred_at`, else its save time). A question that names a date ("in May
2023", "on 8 May", "2024-03-05", "last week", "3 days ago", "before June") gets the day windows it means,
and an item with a date in one gains a share of its score: a boost, not a filter, so a misread date never
hides the answer (`since`/`until` are the filter). A question that asks "when" favours the items whose own
text carries a date: the answer is a date. The rules read dates as notes, logs and chat lines write them,
never a layout of one source. Bounded: at most MAX_EXPRESSIONS expressions read of a query, MAX_ITEM_DATES
of an item's first window, an open window ("before June") reaches OPEN_SPAN_DAYS, a count ("400 weeks
ago") at most MAX_COUNT units. The rules read ASCII only (`re.ASCII`: "ſept 5", "aprıl 3" or "３ days ago" is no
date, where Unicode case folding would match what the tables cannot look up), and what they cannot read they
skip: a question or an item is never failed by its text.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from ..extraction.dates import NUMBER_WORDS, WEEKDAYS, add_months
from ..extraction.guard import reads_nothing_on_error
from ..pipeline.passages import PASSAGE_WINDOW_CHARS

MAX_EXPRESSIONS = 3  # date expressions read from one query, the first ones
MAX_ITEM_DATES = 8  # dates read from one item's text (its first window)
OPEN_SPAN_DAYS = 366  # how far "before X" / "after X" reaches
MAX_COUNT = 100  # "N units ago": at most this many
IN_WINDOW_BOOST = 1.0  # an item with a date in a window the question names: score x (1 + this)
DATED_BOOST = 0.25  # a "when" question: an item whose text carries a date: score x (1 + this)

YEAR_LOOKBACK = 32  # a date's start at most this far before its year ("Wednesday, September 30th, 2023")

Span = tuple[date, date]  # first and last day, inclusive

_MONTHS = {name.lower(): n for n, name in enumerate(calendar.month_name) if name}
_ABBREVIATIONS = {name.lower(): n for n, name in enumerate(calendar.month_abbr) if name} | {"sept": 9}
_FULL = "|".join(_MONTHS)
_ANY = "|".join(sorted(set(_MONTHS) | set(_ABBREVIATIONS), key=len, reverse=True))
_ORD = r"(?:st|nd|rd|th)?"
_COUNT = r"(\d{1,3}|a|an|one|two|three|four|five|six|seven|eight|nine|ten|a couple of|a few)"

# absolute dates, as any text writes them (the query's and the items' alike); a month name alone is read only
# after a word that makes it a time ("in May", not "May I"), an abbreviation only beside a day or a year
_ABSOLUTE = re.compile(
    r"\b(?P<iy>\d{4})-(?P<im>\d{2})-(?P<id>\d{2})\b"
    rf"|\b(?P<dd>\d{{1,2}}){_ORD} (?:of )?(?P<dm>{_ANY})\.?(?:,? (?P<dy>\d{{4}}))?\b"
    rf"|\b(?P<mm>{_ANY})\.? (?P<md>\d{{1,2}}){_ORD}\b(?!:)(?:,? (?P<my>\d{{4}})\b)?"
    rf"|\b(?P<ym>{_ANY})\.?,? (?P<yy>\d{{4}})\b"
    rf"|\b(?:in|during|of|since|before|after|until|by|early|late|mid-?)\s+(?P<bm>{_FULL})\b(?!\.?,? \d)"
    r"|\b(?:in|during|of|since|before|after|until|by)\s+(?P<by>(?:19|20)\d{2})\b(?![-/]\d)"
    r"|\((?P<py>(?:19|20)\d{2})\)",
    re.I | re.ASCII,
)
_RELATIVE = re.compile(
    r"\b(?P<yesterday>yesterday|last night)\b|\b(?P<today>today|tonight|this morning)\b"
    rf"|\b(?P<count>{_COUNT}) (?P<unit>day|week|month|year)s? ago\b"
    r"|\b(?P<which>last|this|previous) (?P<period>week|month|year|weekend)\b"
    rf"|\blast (?P<weekday>{'|'.join(WEEKDAYS)})\b",
    re.I | re.ASCII,
)
_YEAR = re.compile(r"(?<!\d)\d{4}(?!\d)", re.ASCII)
_WEEK_OF = re.compile(r"\bweek of\s*$", re.I | re.ASCII)
_MODIFIER = re.compile(
    r"(?:\b(?:the )?(?P<unit>day|week|month|year) )?\b(?P<side>before|after|since|until|prior to)\s*$", re.I | re.ASCII
)
_WHEN = re.compile(
    r"\b(?:when|since when|what (?:date|day|year|month)|which (?:date|day|year|month)|how long ago)\b", re.I | re.ASCII
)


@dataclass(frozen=True)
class Window:
    """Days a question names: a span, or a month (and days) of any year when it gave none ("on 8 May")."""

    span: Span
    yearless: bool = False

    def holds(self, item: Span) -> bool:
        if not self.yearless:
            return item[0] <= self.span[1] and self.span[0] <= item[1]
        if (item[1] - item[0]).days > 31:
            return False  # a year-long item date says nothing of a month
        days = ((item[0] + timedelta(days=n)) for n in range((item[1] - item[0]).days + 1))
        return any(self.span[0] <= _in_year(d, self.span[0].year) <= self.span[1] for d in days)


def _in_year(d: date, year: int) -> date:
    return d.replace(year=year, day=min(d.day, calendar.monthrange(year, d.month)[1]))


def _month(name: str) -> int | None:
    name = name.lower().rstrip(".")
    return _MONTHS.get(name) or _ABBREVIATIONS.get(name)


def _month_span(year: int, month: int) -> Span:
    return date(year, month, 1), date(year, month, calendar.monthrange(year, month)[1])


def _month_of(year: int, month: int | None) -> Span | None:
    """A month's span, or None for no such month ("May 0000": before the calendar)."""
    return _month_span(year, month) if month is not None and date.min.year <= year <= date.max.year else None


def _day(year: int, month: int | None, day: int) -> Span | None:
    if month is None:
        return None
    try:
        d = date(year, month, day)
    except ValueError:
        return None  # "31 February", "2024-13-40": not a date
    return d, d


def _absolute(m: re.Match[str]) -> tuple[Span | None, bool]:
    """(the span an absolute date means, yearless): a year-less day or month is read in leap year 2000."""
    g = m.groupdict()
    if g["iy"]:
        return _day(int(g["iy"]), int(g["im"]), int(g["id"])), False
    if g["dd"] or g["md"]:
        year = g["dy"] or g["my"]
        month, day = (_month(g["dm"]), int(g["dd"])) if g["dd"] else (_month(g["mm"]), int(g["md"]))
        return _day(int(year) if year else 2000, month, day), year is None
    if g["ym"]:
        return _month_of(int(g["yy"]), _month(g["ym"])), False
    if g["bm"]:
        return _month_of(2000, _month(g["bm"])), True
    year = int(g["by"] or g["py"])
    return (date(year, 1, 1), date(year, 12, 31)), False


def _count(word: str) -> int | None:
    return min(int(word), MAX_COUNT) if word.isdigit() else NUMBER_WORDS.get(word.lower())


def _period(today: date, unit: str, back: int) -> Span:
    """The calendar day, week (Monday to Sunday), month or year `back` units before `today`'s."""
    if unit == "day":
        d = today - timedelta(days=back)
        return d, d
    if unit == "week":
        monday = today - timedelta(days=today.weekday() + 7 * back)
        return monday, monday + timedelta(days=6)
    if unit == "month":
        first = add_months(today.replace(day=1), -back)
        return _month_span(first.year, first.month)
    return date(today.year - back, 1, 1), date(today.year - back, 12, 31)


def _relative(m: re.Match[str], today: date) -> Span | None:
    """The span a relative expression means, counted from `today` (the question's as_of)."""
    g = m.groupdict()
    if g["yesterday"]:
        return _period(today, "day", 1)
    if g["today"]:
        return _period(today, "day", 0)
    if g["count"]:
        count = _count(g["count"])
        return None if count is None else _period(today, g["unit"].lower(), count)
    if g["period"]:
        back = 0 if g["which"].lower() == "this" else 1
        if g["period"].lower() == "weekend":
            saturday = _period(today, "week", back)[0] + timedelta(days=5)
            return saturday, saturday + timedelta(days=1)
        return _period(today, g["period"].lower(), back)
    weekday = g["weekday"].lower()
    if weekday not in WEEKDAYS:
        return None
    back = (today.weekday() - WEEKDAYS.index(weekday)) % 7 or 7
    return _period(today, "day", back)


def _anchored(window: Window, today: date) -> Window:
    """A year-less window in the latest year that puts it on or before `today` (for "before June")."""
    if not window.yearless:
        return window
    start, end = (_in_year(d, today.year) for d in window.span)
    if start > today:
        start, end = (_in_year(d, today.year - 1) for d in window.span)
    return Window((start, end))


def _modified(window: Window, before: str, today: date) -> Window:
    """ "before X", "after X", "the week before X": the days beside X instead of X itself."""
    m = _MODIFIER.search(before[-24:])
    if m is None:
        return window
    start, end = _anchored(window, today).span
    reach = {"day": 1, "week": 7, "month": 31, "year": 366}.get((m.group("unit") or "").lower(), OPEN_SPAN_DAYS)
    side = m.group("side").lower()
    if side in ("before", "prior to"):
        return Window((start - timedelta(days=reach), start - timedelta(days=1)))
    if side == "until":  # X itself included
        return Window((end - timedelta(days=reach), end))
    if side == "since":
        return Window((start, start + timedelta(days=reach)))
    return Window((end + timedelta(days=1), end + timedelta(days=reach)))


@dataclass(frozen=True)
class TimeQuestion:
    """What a query asks of time: whether it asks "when", and the windows of days it names."""

    asks_when: bool
    windows: tuple[Window, ...]

    @property
    def matters(self) -> bool:
        return self.asks_when or bool(self.windows)

    @classmethod
    @reads_nothing_on_error(lambda cls, *_, **__: cls(False, ()))
    def of(cls, query: str, as_of: float | None = None) -> TimeQuestion:
        """What `query` asks of time, its relative dates counted from `as_of` (else now); never raises."""
        today = datetime.fromtimestamp(as_of, UTC).date() if as_of is not None else datetime.now(UTC).date()
        found: list[tuple[int, int, Window]] = []
        for m in _ABSOLUTE.finditer(query):
            span, yearless = _absolute(m)
            if span is not None:
                # "before June": the date's own start, after the word that made a month name a time
                start = min(m.start(name) for name, value in m.groupdict().items() if value)
                found.append((start, m.end(), Window(span, yearless)))
            if len(found) >= MAX_EXPRESSIONS:
                break
        for m in _RELATIVE.finditer(query):
            if len(found) >= MAX_EXPRESSIONS:
                break
            if not any(s < m.end() and m.start() < e for s, e, _ in found):
                with suppress(OverflowError, ValueError):  # "100 years ago" in year 50: no such day
                    span = _relative(m, today)
                    if span is not None:
                        found.append((m.start(), m.end(), Window(span)))
        windows = []
        for start, _, window in sorted(found, key=lambda f: f[0]):
            with suppress(OverflowError, ValueError):  # "before 0001-01-05": before the calendar
                windows.append(_modified(window, query[:start], today))
        return cls(_WHEN.search(query) is not None, tuple(windows))


def _occurred_only(text: str, occurred_at: float | None) -> tuple[list[Span], bool]:
    """What an item is dated by when its text could not be read: the day it happened."""
    return ([_day_of(occurred_at)] if occurred_at is not None else []), False


@reads_nothing_on_error(_occurred_only)
def item_dates(text: str, occurred_at: float | None) -> tuple[list[Span], bool]:
    """(the spans an item is dated by, whether its own text carries a date): the absolute dates in its first
    window ("the week of 1 May 2023" is that week), and the day it happened (`occurred_at`)."""
    spans: list[Span] = []
    head = text[:PASSAGE_WINDOW_CHARS]
    for m in _with_years(head):
        span, _ = _absolute(m)
        if span is None:
            continue
        if m.group("dd") and _WEEK_OF.search(head[max(0, m.start() - 12) : m.start()]) and span[0].year < 9999:
            span = (span[0], span[0] + timedelta(days=6))
        spans.append(span)
        if len(spans) >= MAX_ITEM_DATES:
            break
    dated = bool(spans)
    if occurred_at is not None:
        spans.append(_day_of(occurred_at))
    return spans, dated


def _day_of(moment: float) -> Span:
    day = datetime.fromtimestamp(moment, UTC).date()
    return day, day


def _with_years(head: str) -> Iterator[re.Match[str]]:
    """The absolute dates of `head` that name their year, found from its 4-digit numbers: a year-less date
    in an item ("in May") does not say which May, and reading the whole text costs ~0.1 ms an item."""
    done = 0  # where the last date found ends
    for year in _YEAR.finditer(head):
        if year.start() < done:
            continue
        for m in _ABSOLUTE.finditer(head, max(done, year.start() - YEAR_LOOKBACK), year.end() + 6):
            if m.start() <= year.start() < m.end():
                done = m.end()
                yield m
                break


def boost(question: TimeQuestion, span_sets: Iterable[tuple[list[Span], bool]]) -> list[float]:
    """Each item's score factor: 1 + IN_WINDOW_BOOST when one of its dates is in a window the question names,
    times 1 + DATED_BOOST when the question asks "when" and its text carries a date."""
    factors = []
    for spans, dated in span_sets:
        factor = 1.0
        if question.windows and any(w.holds(s) for w in question.windows for s in spans):
            factor *= 1 + IN_WINDOW_BOOST
        if question.asks_when and dated:
            factor *= 1 + DATED_BOOST
        factors.append(factor)
    return factors
