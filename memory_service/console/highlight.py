"""A source text cut into segments, each knowing which facts' spans cover it, to mark them on the page."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    text: str
    facts: tuple[int, ...]  # 1-based numbers of the facts whose spans cover this text


def segments(text: str, spans_per_fact: Sequence[Sequence[Sequence[int]]]) -> list[Segment]:
    """Cut `text` at every span boundary; empty or out-of-range spans (a fact with no located source) are ignored."""
    spans = [
        [(max(0, s), min(len(text), e)) for s, e in fact_spans if min(len(text), e) > max(0, s)]
        for fact_spans in spans_per_fact
    ]
    cuts = {0, len(text)}
    for fact_spans in spans:
        for start, end in fact_spans:
            cuts.update((start, end))
    points = sorted(cuts)
    out: list[Segment] = []
    for lo, hi in zip(points, points[1:]):
        covering = tuple(n for n, fact_spans in enumerate(spans, 1) if any(s <= lo and hi <= e for s, e in fact_spans))
        if out and out[-1].facts == covering:
            out[-1] = Segment(out[-1].text + text[lo:hi], covering)
        else:
            out.append(Segment(text[lo:hi], covering))
    return out
