"""What the pages show, computed from the stores: the routes stay thin and the templates only lay it out."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from markupsafe import Markup

from ..config import Settings
from ..contract.models import MemoryOut
from ..services import Bucket, LimitView
from . import charts
from .highlight import MAX_MARKED, Segment, highlight

STATUSES = ("queued", "extracting", "done", "failed")
SPANS_LISTED = 20  # a fact's spans listed beside it as [start–end]; the rest are counted
PENDING = ("queued", "extracting")
WEEK_DAYS = 7  # the limits page draws each counter's last week, today included
SCORE_W = 90  # a search hit's score bar, in a table column
AGENT_WEEKS = 10  # of a per-agent limit, the busiest agents' weeks are drawn; the others show today's bar


class BadFilter(ValueError):
    """A filter the operator typed that cannot be used; shown on the page, nothing else fails."""


def parse_time(value: str, what: str) -> float | None:
    """'2024-05-01', '2024-05-01T10:30' (UTC when no offset is given) or a full ISO-8601 time, as epoch seconds."""
    value = value.strip()
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BadFilter(f"{what}: {value!r} is not a date or time (use YYYY-MM-DD or YYYY-MM-DDTHH:MM)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def when(value: float | datetime | str | None) -> str:
    """One way to show a moment everywhere: UTC, to the second."""
    if value is None or value == "":
        return "–"
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if isinstance(value, (int, float)):
        value = datetime.fromtimestamp(value, tz=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def local_time(iso: str) -> str:
    """A moment in the zone its ISO text carries (a limit's reset time), with that offset."""
    moment = datetime.fromisoformat(iso)
    return moment.strftime("%Y-%m-%d %H:%M") + " " + moment.strftime("%z")[:3] + ":" + moment.strftime("%z")[3:]


@dataclass
class FactRow:
    number: int
    text: str
    spans: list[list[int]]
    superseded_by: str | None
    replaced_by_text: str | None
    spans_more: int = 0  # spans beyond SPANS_LISTED, not listed


@dataclass
class MemoryPage:
    memory: MemoryOut
    facts: list[FactRow]
    history: list[FactRow]
    segments: list[Segment]
    unmarked: int = 0  # spans not marked in the text, beyond MAX_MARKED
    max_marked: int = MAX_MARKED
    timing_rows: list[tuple[str, Any]] = field(default_factory=list)
    attempt_rows: list[tuple[str, Any]] = field(default_factory=list)


TIMING_LABELS = {
    "prompt_n": "prompt tokens",
    "cache_n": "cached prompt tokens",
    "predicted_n": "predicted tokens",
    "prompt_ms": "prompt time (ms)",
    "predicted_ms": "generation time (ms)",
}


def memory_page(memory: MemoryOut, replaced_texts: dict[str, str]) -> MemoryPage:
    """Facts numbered in one sequence: active ones first, then the superseded history, all marked in the text."""
    active = [f for f in memory.facts if f.superseded_by is None]
    old = [f for f in memory.facts if f.superseded_by is not None]
    rows = [
        FactRow(
            n,
            f.text,
            f.spans[:SPANS_LISTED],
            f.superseded_by,
            replaced_texts.get(f.superseded_by or ""),
            max(0, len(f.spans) - SPANS_LISTED),
        )
        for n, f in enumerate(active + old, 1)
    ]
    marked = highlight(memory.text, [f.spans for f in active + old])
    timings = memory.timings or {}
    timing_rows = [(label, timings[key]) for key, label in TIMING_LABELS.items() if key in timings]
    attempt = timings.get("attempt") or {}
    attempt_rows = [
        (key.replace("_", " "), attempt[key]) for key in ("elapsed_s", "calls", "overrun_s", "server") if key in attempt
    ]
    return MemoryPage(
        memory=memory,
        facts=rows[: len(active)],
        history=rows[len(active) :],
        segments=marked.segments,
        unmarked=marked.omitted,
        timing_rows=timing_rows,
        attempt_rows=attempt_rows,
    )


@dataclass
class Speed:
    """Measured model speed against what the extraction budget needs."""

    prompt_tps: float | None
    generation_tps: float | None
    seconds_per_job: float | None
    source: str
    budget_s: float
    max_output_tokens: int
    needed_generation_tps: float
    fits: bool | None  # None until a generation speed is known


def speed(snapshot: dict[str, Any], settings: Settings) -> Speed:
    needed = settings.max_output_tokens / settings.extract_budget_s
    gen = snapshot.get("generation_tokens_per_s")
    return Speed(
        prompt_tps=snapshot.get("prompt_tokens_per_s"),
        generation_tps=gen,
        seconds_per_job=snapshot.get("seconds_per_job"),
        source=str(snapshot.get("source", "")),
        budget_s=settings.extract_budget_s,
        max_output_tokens=settings.max_output_tokens,
        needed_generation_tps=math.ceil(needed * 10) / 10,
        fits=None if gen is None else gen >= needed,
    )


Points = list[tuple[str, float | None]]


@dataclass
class AgentUse:
    agent_id: str
    used: int
    remaining: int
    week: Points | None  # None beyond the AGENT_WEEKS busiest


@dataclass
class LimitPicture:
    """A limit as the page draws it: today's bar (a team counter) and the week's columns, then its agents'."""

    view: LimitView
    week: Points
    agents: list[AgentUse] = field(default_factory=list)


def week_of(view: LimitView) -> Points:
    """A view's `history` (oldest first, today last) as columns: (day, used)."""
    return [(str(day["day"]), float(cast(int, day["used"]))) for day in view.history or []]


def limit_picture(view: LimitView, agent_view: Callable[[str], LimitView]) -> LimitPicture:
    """`view` (read with its week) and its agents' counters, the first AGENT_WEEKS (the busiest) with their
    week read through `agent_view`."""
    picture = LimitPicture(view, week_of(view))
    for n, agent in enumerate(view.agents or []):
        agent_id = str(agent["agent_id"])
        week = week_of(agent_view(agent_id)) if n < AGENT_WEEKS else None
        picture.agents.append(AgentUse(agent_id, cast(int, agent["used"]), cast(int, agent["remaining"]), week))
    return picture


def hour_of_jobs(buckets: list[Bucket]) -> tuple[Points, Points]:
    """The Jobs chart's two rows from the team's buckets: queue depth (as last measured in each five
    minutes) and jobs finished, each column named by its minutes in UTC."""
    names = [f"{_clock(b.start)}–{_clock(b.end)} UTC" for b in buckets]
    depth: Points = [(n, None if b.depth is None else float(b.depth)) for n, b in zip(names, buckets, strict=True)]
    finished: Points = [(n, float(b.finished)) for n, b in zip(names, buckets, strict=True)]
    return depth, finished


def _clock(moment: float) -> str:
    return datetime.fromtimestamp(moment, tz=UTC).strftime("%H:%M")


def progress(done: int, total: int, chunks: int) -> Markup:
    """An extracting text's progress bar: the characters its finished chunks cover, of the whole text."""
    says = f"extraction progress: {done:,} of {total:,} characters ({charts.percent(done, total)}), {chunks:,} chunk(s) done"
    return charts.bar(done, total, "extraction progress", says=says)


def score_bar(score: float, best: float) -> Markup:
    """A hit's score as a bar against the best hit's (recall's fused scores mean nothing on their own scale)."""
    says = f"score {score:.4f}, {charts.percent(score, best)} of the best hit's"
    return charts.bar(score, best, "score", says=says, width=SCORE_W)
