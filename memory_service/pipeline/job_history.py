"""The last hour of each team's queue depth and finished jobs, kept in memory for the console's Jobs chart.

The journal records when a job was saved and when it finished, but no index answers "how deep was team A's
queue at 10:35" without reading every row of the team; so a sampler (a task `Services.start` runs) reads
every team's pending count (one grouped query on the pending rows' partial index) and the `memory_jobs`
counter every SAMPLE_S, into a ring that holds WINDOW_S. The ring is bounded: WINDOW_S / SAMPLE_S samples,
each holding only the teams with jobs pending or finished. It lives in this process: it starts empty at
each start (the hour before shows as not measured), and on a shared database it counts the jobs this
process's workers finished (the queue depth is every process's, read from the database).

A team's buckets are read from its own entries only: no other team's numbers enter its picture.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from prometheus_client import Counter

from ..storage import catalog
from ..storage.database import storage_unavailable
from ..storage.journal import Journal

log = logging.getLogger("memory_service")

SAMPLE_S = 15.0
WINDOW_S = 3600.0
BUCKETS = 12  # of five minutes each
FINISHED = ("done", "failed")  # outcomes that end a job (retried and deferred ones come back)


@dataclass(frozen=True)
class Sample:
    at: float
    depth: dict[str, int]  # teams with jobs queued or extracting then
    finished: dict[str, int]  # teams' jobs finished since the sample before


@dataclass(frozen=True)
class Bucket:
    start: float
    end: float
    depth: int | None  # the last depth measured in it; None: nothing measured (the service was not running)
    finished: int


def finished_totals(jobs: Counter) -> dict[str, int]:
    """Jobs each team has finished since this process started, from the `memory_jobs` counter."""
    totals: dict[str, int] = {}
    for family in jobs.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("outcome") in FINISHED:
                team = sample.labels["team"]
                totals[team] = totals.get(team, 0) + int(sample.value)
    return totals


class JobHistory:
    """A ring of samples; `sample` appends one (blocking), `buckets` reads one team's hour. `Metrics` owns it
    (it counts from the `memory_jobs` counter) and `Services.start` runs its sampler."""

    def __init__(self, jobs: Counter, *, sample_s: float = SAMPLE_S, window_s: float = WINDOW_S) -> None:
        self._jobs = jobs
        self.sample_s, self.window_s = sample_s, window_s
        self._samples: deque[Sample] = deque(maxlen=int(window_s / sample_s) + 1)
        self._last_totals: dict[str, int] = {}
        self._lock = threading.Lock()  # sampled on a worker thread, read by the console's threads

    def sample(self, journal: Journal) -> None:
        """Measure every team's queue and what finished since the last sample (blocking: reads the journal)."""
        self.record(catalog.pending_by_team(journal))

    def record(self, pending: dict[str, int], now: float | None = None) -> None:
        """One sample: `pending` jobs by team now, and the jobs the counter says finished since the last one."""
        totals = finished_totals(self._jobs)
        with self._lock:
            last = self._last_totals
            finished = {team: n - last.get(team, 0) for team, n in totals.items() if n > last.get(team, 0)}
            depth = {team: n for team, n in pending.items() if n}
            self._samples.append(Sample(time.time() if now is None else now, depth, finished))
            self._last_totals = totals

    def buckets(self, team: str, depth_now: int, now: float | None = None) -> list[Bucket]:
        """`team`'s last hour in BUCKETS buckets, oldest first; the last one ends now and holds `depth_now`
        (the page's own count) and the jobs finished since the last sample."""
        now = time.time() if now is None else now
        width = self.window_s / BUCKETS
        start = now - self.window_s
        depths: list[int | None] = [None] * BUCKETS
        finished = [0] * BUCKETS
        totals = finished_totals(self._jobs)
        with self._lock:
            for sample in self._samples:
                if start < sample.at <= now:
                    i = min(BUCKETS - 1, int((sample.at - start) // width))
                    depths[i] = sample.depth.get(team, 0)  # samples are in time order: the last one wins
                    finished[i] += sample.finished.get(team, 0)
            finished[-1] += max(0, totals.get(team, 0) - self._last_totals.get(team, 0))
        depths[-1] = depth_now
        return [Bucket(start + i * width, start + (i + 1) * width, depths[i], finished[i]) for i in range(BUCKETS)]

    async def run(self, journal: Journal) -> None:
        """Sample now and every `sample_s` until cancelled; a busy or unreachable database skips a sample."""
        while True:
            try:
                await asyncio.to_thread(self.sample, journal)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not storage_unavailable(exc):
                    log.exception("job history: unexpected error")
            await asyncio.sleep(self.sample_s)
