"""The figures every benchmark reports: nearest-rank percentiles, latency summaries, and a goal's verdict."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no data."""
    data = sorted(values)
    if not data:
        return None
    rank = max(1, min(len(data), math.ceil(q / 100.0 * len(data))))
    return data[rank - 1]


def ms(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value * 1000.0, digits)


def latency_summary(seconds: list[float]) -> dict[str, Any]:
    """p50/p95/p99/max in milliseconds."""
    return {
        "n": len(seconds),
        "p50_ms": ms(percentile(seconds, 50)),
        "p95_ms": ms(percentile(seconds, 95)),
        "p99_ms": ms(percentile(seconds, 99)),
        "max_ms": ms(max(seconds) if seconds else None),
        "mean_ms": ms(statistics.fmean(seconds) if seconds else None),
    }


def goal(value: float | None, target: float, *, at_most: bool = True) -> dict[str, Any]:
    """A figure beside its goal, with a verdict: every number in the JSON is judged where it stands."""
    met = None if value is None else (value <= target if at_most else value >= target)
    return {"value": value, "goal": f"{'<=' if at_most else '>='} {target}", "met": met}
