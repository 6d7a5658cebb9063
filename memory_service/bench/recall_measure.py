"""The recall benchmark's measurement over HTTP: each filter variant, idle and while the model is busy.

Queries run one at a time, unfiltered and with agent / tag / time / kind filters at
realistic shares (recall_data). The model-busy rows restart the service against a real
llama-server while another team's backlog of saves keeps extraction running.
"""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from ..client.service import service_client
from ..recall.vectors import UNFILTERED_EXACT_MAX_ROWS
from ..testbed.probes import scrape
from ..testbed.service_runner import ServiceRunner
from ..testbed.stats import latency_summary
from .recall_data import BIG_AGENT, FACTS_PER_MEMORY, SMALL_AGENT, TEAM, queries
from .texts import agent_text

DEAD_LLM_URL = "http://127.0.0.1:9"  # recall never touches the model: the idle rows start none
BUSY_TEAM = "bench-recall-busy-writer"  # the saves that keep the model busy: not the measured team
BUSY_SAVES = 80  # a backlog the model is still working through when the busy rows end (~3-4 s a job here)
PASSAGES_SETTLE_S = 5.0  # the backlog's passages are embedded first (80 short texts): then only extraction runs
INDEX_READY_TIMEOUT_S = 600

TIME_VARIANT = "time (newest 10% of rows)"
VARIANTS: dict[str, dict[str, Any]] = {
    "unfiltered": {},
    "agent 2% (scope=agent)": {"agent_id": SMALL_AGENT, "scope": "agent"},
    "agent 30% (scope=agent)": {"agent_id": BIG_AGENT, "scope": "agent"},
    "tag (1 tag, 10% of rows)": {"tags": ["project-4"]},
    TIME_VARIANT: {},  # `since` is set per level
    "agent 2% + tag": {"agent_id": SMALL_AGENT, "scope": "agent", "tags": ["project-0"]},
    "kinds=[fact] (83% of rows)": {"kinds": ["fact"]},
}


def variants_at(level: int, epoch: float) -> dict[str, dict[str, Any]]:
    """The variants with the time window of this level: facts are 30 s apart from `epoch` on."""
    since = datetime.fromtimestamp(epoch + 0.9 * level * 30.0, tz=UTC).isoformat()
    return {**VARIANTS, TIME_VARIANT: {"since": since}}


def indexes_for(level: int) -> int:
    """In-process vector indexes the service builds for a team of `level` facts (embedded Chroma only)."""
    return (level > UNFILTERED_EXACT_MAX_ROWS) + (level // FACTS_PER_MEMORY > UNFILTERED_EXACT_MAX_ROWS)


def service_embedder() -> tuple[Any, str]:
    """The embedder the service would use (MEMORY_EMBEDDER), one thread, as the service runs it."""
    from ..config import Settings
    from ..embedding.embedder import load_embedder

    settings = Settings.from_env()
    return load_embedder(settings.embedder, threads=1, cache_dir=settings.cache_dir), settings.embedder


def measure_http(
    service: ServiceRunner, key: str, texts: list[str], variants: dict[str, dict[str, Any]], indexes: int = 0
) -> dict[str, Any]:
    """Warm-up, the HTTP floor, then every variant; each query text once per variant.

    `indexes`: in-process vector indexes the team's size calls for; the warm-up's first recall starts
    building them, and the measurement waits until /metrics says they are ready (steady state). That
    series is no team's, so it is read with the service's metrics token (a team's key does not see it).
    """
    out: dict[str, Any] = {}
    with service.client(key, timeout=60) as client, service.operator() as operator:
        started = time.perf_counter()
        response = client.post("/v1/recall", json={"query": texts[0], "k": 10})
        response.raise_for_status()
        out["first recall after start_ms"] = round((time.perf_counter() - started) * 1000, 2)
        while indexes and _indexes_ready(operator) < indexes:
            if time.perf_counter() - started > INDEX_READY_TIMEOUT_S:
                raise RuntimeError("the in-process vector indexes were not ready after 600 s")
            time.sleep(0.2)
        out["index_ready_after_s"] = round(time.perf_counter() - started, 2)
        for text in texts[:20]:  # warm-up: the embedder's first calls and SQLite's page cache
            client.post("/v1/recall", json={"query": text, "k": 10})
        health = []
        for _ in range(len(texts)):
            t0 = time.perf_counter()
            client.get("/health")
            health.append(time.perf_counter() - t0)
        out["GET /health (HTTP floor)"] = latency_summary(health)
        for number, (name, extra) in enumerate(variants.items()):
            # texts of its own per variant: none is served the query vectors another one had embedded
            variant_texts = texts if number == 0 else queries(len(texts), seed=100 + number)
            out[name] = _measure_variant(client, variant_texts, extra)
    return out


def _measure_variant(client: httpx.Client, texts: list[str], extra: dict[str, Any]) -> dict[str, Any]:
    lat, returned = [], []
    for text in texts:
        t0 = time.perf_counter()
        response = client.post("/v1/recall", json={"query": text, "k": 10, **extra})
        lat.append(time.perf_counter() - t0)
        response.raise_for_status()
        returned.append(len(response.json()["items"]))
    return {**latency_summary(lat), "items_mean": round(sum(returned) / len(returned), 1)}


def _indexes_ready(operator: httpx.Client) -> int:
    """The ready in-process indexes, from /metrics read with the metrics token (a team key sees only its team's
    series, and this gauge has no team label)."""
    response = operator.get("/metrics")
    response.raise_for_status()
    return int(sum(value for _, value in scrape(response.text).get("memory_vector_indexes_ready", [])))


def _busy_jobs(service: ServiceRunner) -> dict[str, int]:
    """Jobs by status, every team's: /ready as the operator (the metrics token) sees it."""
    jobs = service.ready().get("jobs") or {}
    return {name: int(jobs.get(name) or 0) for name in ("queued", "extracting", "done", "failed")}


def measure_while_extracting(
    data_dir: Path, key: str, texts: list[str], variants: dict[str, dict[str, Any]], indexes: int, llm_url: str
) -> dict[str, Any]:
    """Every variant again with the model busy: another team's saves queued for extraction all along.

    The measured team's data does not change (the saves are the other team's); the service shares its
    core with the extraction worker and the embeddings of the backlog's passages and facts.
    """
    writer = secrets.token_urlsafe(12)
    service = ServiceRunner(data_dir, api_keys={key: TEAM, writer: BUSY_TEAM}, llm_url=llm_url).start()
    try:
        service.wait_model_ready()
        with service_client(service.url, writer, timeout=60) as client:
            _queue_backlog(service, client)
            before = _busy_jobs(service)
            measured = measure_http(service, key, texts, variants, indexes)
            after = _busy_jobs(service)
    finally:
        service.stop()
    measured["model_busy"] = {
        "extracting_before": before["extracting"],
        "queued_before": before["queued"],
        "extracting_after": after["extracting"],
        "queued_after": after["queued"],
        "jobs_finished_during": after["done"] + after["failed"] - before["done"] - before["failed"],
        "busy_throughout": before["extracting"] >= 1 and after["queued"] + after["extracting"] >= 1,
    }
    return measured


def _queue_backlog(service: ServiceRunner, client: httpx.Client) -> None:
    """The busy team's saves, then until extraction runs and their passages are embedded."""
    for i in range(BUSY_SAVES):
        client.post(
            "/v1/remember",
            json={"text": agent_text(i), "agent_id": f"writer-{i % 4}", "run_id": f"busy-{i % 8}"},
        ).raise_for_status()
    deadline = time.monotonic() + 120
    while _busy_jobs(service)["extracting"] < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(PASSAGES_SETTLE_S)
