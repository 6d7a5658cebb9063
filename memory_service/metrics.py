"""Prometheus metrics, kept in a registry of each app's own and only ever scraped (nothing is pushed).

A registry per `Services` (never prometheus_client's global one) lets several apps live in one process,
as the tests run them. Hot paths only observe or increment; numbers that cost a query (queue depth, jobs
by status, the model's state) are read when `/metrics` is scraped, by `ServiceState`.

Labels are bounded: `team` comes from MEMORY_API_KEYS (the operator's list, or the one local team), so
it appears on counters only; histograms and gauges carry no team, since every label value multiplies
their series. Nothing a caller chooses freely (agent ids, limit names, tags, memory ids) is a label.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from .pipeline.job_history import JobHistory

__all__ = ["CONTENT_TYPE", "JOB_OUTCOMES", "Metrics", "ServiceState"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
JOB_OUTCOMES = ("done", "failed", "deferred", "retried", "forgotten")

ACK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
RECALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
EXTRACTION_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class Metrics:
    """The counters and histograms the request paths and the extraction worker move."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.remember_ack = Histogram(
            "memory_remember_ack_seconds",
            "Time to commit a saved text and its job, up to the 202 (any wait_s excluded)",
            buckets=ACK_BUCKETS,
            registry=registry,
        )
        self.recall = Histogram(
            "memory_recall_seconds", "Time to answer a recall query", buckets=RECALL_BUCKETS, registry=registry
        )
        self.extraction = Histogram(
            "memory_extraction_seconds",
            "Duration of one extraction attempt that called the model, by outcome",
            ["outcome"],
            buckets=EXTRACTION_BUCKETS,
            registry=registry,
        )
        self.jobs = Counter(
            "memory_jobs",
            "Extraction attempts by outcome (done, failed, deferred, retried, forgotten)",
            ["team", "outcome"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "memory_llm_prompt_tokens", "Prompt tokens llama-server evaluated (prompt_n)", registry=registry
        )
        self.cached_tokens = Counter(
            "memory_llm_cached_tokens",
            "Prompt tokens llama-server reused from its prompt cache (cache_n)",
            registry=registry,
        )
        self.generated_tokens = Counter(
            "memory_llm_generated_tokens", "Tokens llama-server generated (predicted_n)", registry=registry
        )
        self.loops = Counter(
            "memory_llm_loops",
            "Model replies stopped on the stream because they repeated themselves (then asked again smaller)",
            registry=registry,
        )
        self.facts_stored = Counter(
            "memory_facts_stored", "New facts stored by finished jobs", ["team"], registry=registry
        )
        self.facts_merged = Counter(
            "memory_facts_merged", "Extracted facts folded into an existing one", ["team"], registry=registry
        )
        self.facts_superseded = Counter(
            "memory_facts_superseded", "Facts retired by a changed value", ["team"], registry=registry
        )
        self.facts_rejected = Counter(
            "memory_facts_rejected",
            "Proposed facts that grounding rejected, by reason",
            ["team", "reason"],
            registry=registry,
        )
        self.consume = Counter(
            "memory_limit_consume",
            "Daily-limit consumes by result (allowed, denied)",
            ["team", "result"],
            registry=registry,
        )
        self.history = JobHistory(self.jobs)  # each team's last hour of jobs, for the console: read from `jobs`

    def llm_timings(self, timings: Mapping[str, Any]) -> None:
        """One completion's llama.cpp `timings`: its prompt, cached and generated token counts (and `loops`: 1
        when the client stopped it in a repetition loop)."""
        for counter, key in (
            (self.prompt_tokens, "prompt_n"),
            (self.cached_tokens, "cache_n"),
            (self.generated_tokens, "predicted_n"),
            (self.loops, "loops"),
        ):
            value = timings.get(key)
            if isinstance(value, (int, float)) and value > 0:
                counter.inc(value)

    def job(self, team: str, outcome: str, seconds: float | None = None) -> None:
        """An attempt's outcome; `seconds` when it called the model (a skipped small talk did not)."""
        self.jobs.labels(team, outcome).inc()
        if seconds is not None:
            self.extraction.labels(outcome).observe(seconds)

    def facts(self, team: str, *, stored: int, merged: int, superseded: int, rejected: list[str]) -> None:
        """What a finished job did to the team's facts; `rejected` holds one reason code per rejected fact."""
        for counter, count in (
            (self.facts_stored, stored),
            (self.facts_merged, merged),
            (self.facts_superseded, superseded),
        ):
            if count:
                counter.labels(team).inc(count)
        for reason in rejected:
            self.facts_rejected.labels(team, reason).inc()

    def watch(self, state: StateSource) -> None:
        """Report `state` at every scrape."""
        self.registry.register(ServiceState(state))

    def render(self) -> bytes:
        """The text exposition format. Blocking (the scrape-time numbers query SQLite): call it in a thread."""
        return generate_latest(self.registry)


class StateSource(Protocol):
    """What the scrape-time gauges read: job counts by status (and active facts), and the model server."""

    def job_counts(self) -> Mapping[str, int]: ...

    def model_servers(self) -> Mapping[str, bool]: ...

    def vector_indexes(self) -> int: ...


class ServiceState:
    """Gauges computed when scraped, so nothing on a hot path keeps them up to date."""

    def __init__(self, source: StateSource) -> None:
        self.source = source

    def describe(self) -> list[Metric]:
        return []  # unchecked names: collecting here would query the journal at registration

    def collect(self) -> Iterator[Metric]:
        counts = self.source.job_counts()
        depth = GaugeMetricFamily("memory_queue_depth", "Jobs queued or extracting")
        depth.add_metric([], counts.get("queued", 0) + counts.get("extracting", 0))
        yield depth
        jobs = GaugeMetricFamily("memory_jobs_by_status", "Saved texts by extraction status", labels=["status"])
        for status in ("queued", "extracting", "done", "failed"):
            jobs.add_metric([status], counts.get(status, 0))
        yield jobs
        active = GaugeMetricFamily("memory_facts_active", "Facts not superseded")
        active.add_metric([], counts.get("facts", 0))
        yield active
        up = GaugeMetricFamily("memory_model_up", "1 when the llama-server is reachable and ready", labels=["server"])
        for server, ready in self.source.model_servers().items():
            up.add_metric([server], 1.0 if ready else 0.0)
        yield up
        indexes = GaugeMetricFamily(
            "memory_vector_indexes_ready", "Teams' fact or passage vectors searched by the in-process clustered index"
        )
        indexes.add_metric([], self.source.vector_indexes())
        yield indexes
