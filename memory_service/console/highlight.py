"""A source text cut into segments, each knowing which facts' spans cover it, to mark them on the page.

One sweep over the sorted span boundaries, so a memory with thousands of spans costs a sort, not a
comparison of every cut with every span; and at most `MAX_MARKED` spans are marked (the first ones in the
text), so one memory cannot make the page, or the thread rendering it, arbitrarily slow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_MARKED = 200  # spans marked in the text; the page says how many more there were


@dataclass(frozen=True)
class Segment:
    text: str
    facts: tuple[int, ...]  # 1-based numbers of the facts whose spans cover this text


@dataclass(frozen=True)
class Highlight:
    segments: list[Segment]
    omitted: int  # spans left unmarked beyond MAX_MARKED


def _merged(spans: Sequence[Sequence[int]], size: int) -> list[tuple[int, int]]:
    """One fact's spans clipped to the text, empty ones dropped, overlapping or touching ones joined."""
    clipped = sorted((max(0, s), min(size, e)) for s, e, *_ in spans if min(size, e) > max(0, s))
    out: list[tuple[int, int]] = []
    for start, end in clipped:
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def highlight(text: str, spans_per_fact: Sequence[Sequence[Sequence[int]]], limit: int = MAX_MARKED) -> Highlight:
    """Cut `text` at every marked span boundary; empty or out-of-range spans (a fact with no located source)
    are ignored, and only the `limit` spans that start first are marked."""
    spans = [(s, e, n) for n, fact in enumerate(spans_per_fact, 1) for s, e in _merged(fact, len(text))]
    spans.sort()
    omitted = max(0, len(spans) - limit)
    events: list[tuple[int, int, int]] = []  # (position, -1 closes / +1 opens, fact)
    for start, end, fact in spans[:limit]:
        events += ((start, 1, fact), (end, -1, fact))
    events.sort()
    events.append((len(text), 0, 0))  # the end of the text closes the last segment
    out: list[Segment] = []
    active: set[int] = set()  # a fact's merged spans never overlap: each is open at most once
    covering: tuple[int, ...] = ()
    lo = 0
    for i, (position, step, fact) in enumerate(events):
        if position > lo:  # the text before this boundary, marked by what was open
            if out and out[-1].facts == covering:
                out[-1] = Segment(out[-1].text + text[lo:position], covering)
            else:
                out.append(Segment(text[lo:position], covering))
            lo = position
        if step:
            (active.add if step > 0 else active.discard)(fact)
        if i + 1 < len(events) and events[i + 1][0] != position:
            covering = tuple(sorted(active))  # once per boundary, not per event
    return Highlight(out, omitted)


def segments(text: str, spans_per_fact: Sequence[Sequence[Sequence[int]]]) -> list[Segment]:
    """The segments of `highlight`, for callers that need no count of what was left unmarked."""
    return highlight(text, spans_per_fact).segments
