"""`/metrics` in Prometheus' text format, `/v1/stats` as JSON, and JSON logs that carry the request id.

The service runs in this process (JSON logs, one access line per request) against the fault-injecting
fake llama-server, so each job outcome can be produced on demand. Every assertion is on a value that
moved between two scrapes, parsed with prometheus_client's own parser, not on a name being present.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import wait_status
from inprocess import InProcessService
from prometheus_client.parser import text_string_to_metric_families

from memory_service.extraction.grounding import REJECT_CODES, ground
from memory_service.metrics import Metrics
from tests.fakes.fake_llama_server import FakeLlamaServer

QUOTA_50 = "The outbound email quota is 50 per day."
QUOTA_70 = "The outbound email quota is 70 per day."
INVENTED = "Zorblax approved the quota."
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLlamaServer]:
    # a paced prompt gets the fake's prompt cache (the prefix shared with the last prompt): quick at 50k/s
    with FakeLlamaServer("ok", n_ctx=2048, tokens_per_s=5000.0, prompt_tokens_per_s=50000.0) as server:
        yield server


@pytest.fixture(scope="module")
def service(fake: FakeLlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    env = {
        "MEMORY_MAX_ATTEMPTS": "2",
        "MEMORY_RETRY_BASE_S": "0.2",
        "MEMORY_LOG_FORMAT": "json",
        "MEMORY_ACCESS_LOG": "1",
        "MEMORY_METRICS_TOKEN": SCRAPE_TOKEN,  # the operator's scrape: every team's series
    }
    svc = InProcessService(tmp_path_factory.mktemp("metrics") / "data", fake.url, env).start()
    yield svc
    svc.stop()


SCRAPE_TOKEN = "scrape-token"


@pytest.fixture
def client(service: InProcessService) -> Iterator[httpx.Client]:
    with service.client("key-a") as c:
        yield c


def scrape(client: httpx.Client) -> Samples:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 for one not exported yet (a labelled counter appears on its first increment)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def save(client: httpx.Client, text: str) -> str:
    response = client.post("/v1/remember", json={"text": text, "agent_id": "metrics"})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def extract(
    client: httpx.Client,
    fake: FakeLlamaServer,
    text: str,
    mode: str = "ok",
    facts: list[str] | None = None,
    **options: Any,
) -> dict[str, Any]:
    fake.set_mode(mode, facts=facts, **options)
    return wait_status(client, save(client, text), timeout=60)


def test_requests_move_their_histograms_and_counters(client: httpx.Client, service: InProcessService) -> None:
    before = scrape(client)
    save(client, "Request metrics: the Heron digest goes out on Fridays.")
    assert client.post("/v1/recall", json={"query": "Heron digest", "k": 3}).status_code == 200
    assert client.put("/v1/limits/outbound", json={"daily_limit": 1, "timezone": "UTC"}).status_code in (200, 201)
    assert client.post("/v1/limits/outbound/consume", json={"agent_id": "mailer"}).status_code == 200
    assert client.post("/v1/limits/outbound/consume", json={"agent_id": "mailer"}).status_code == 429
    with service.client("key-b") as other:
        assert other.put("/v1/limits/outbound", json={"daily_limit": 5, "timezone": "UTC"}).status_code == 201
        assert other.post("/v1/limits/outbound/consume", json={"agent_id": "mailer"}).status_code == 200
    after = scrape(client)

    assert moved(before, after, "memory_remember_ack_seconds_count") == 1
    assert moved(before, after, "memory_remember_ack_seconds_sum") > 0
    assert moved(before, after, "memory_remember_ack_seconds_bucket", le="+Inf") == 1
    assert moved(before, after, "memory_recall_seconds_count") == 1
    assert moved(before, after, "memory_recall_seconds_sum") > 0
    assert moved(before, after, "memory_limit_consume_total", team="team-a", result="allowed") == 1
    assert moved(before, after, "memory_limit_consume_total", team="team-a", result="denied") == 1
    assert moved(before, after, "memory_limit_consume_total", team="team-b", result="allowed") == 1
    assert moved(before, after, "memory_limit_consume_total", team="team-b", result="denied") == 0


def test_extraction_outcomes_tokens_and_facts(client: httpx.Client, fake: FakeLlamaServer) -> None:
    # let the save of the previous test settle, so the deltas below are this test's alone
    deadline = time.monotonic() + 60
    while value(scrape(client), "memory_queue_depth") and time.monotonic() < deadline:
        time.sleep(0.1)
    before = scrape(client)
    team = {"team": "team-a"}

    # a text the facts cover whole: nothing for the service to add in code (extraction/coverage.py)
    first = extract(client, fake, f"Done. {QUOTA_50}", facts=[QUOTA_50, INVENTED])
    assert first["status"] == "done" and [f["text"] for f in first["facts"]] == [QUOTA_50]
    assert extract(client, fake, f"Checked again: {QUOTA_50}", facts=[QUOTA_50])["status"] == "done"  # merged
    assert extract(client, fake, f"Update: {QUOTA_70}", facts=[QUOTA_70])["status"] == "done"  # supersedes 50
    retried = extract(client, fake, "The Shearwater backup runs at 02:00.", "fail_then_ok", fail_count=1)
    assert retried["status"] == "done" and retried["attempts"] == 2
    failed = extract(client, fake, "The Gull tracker is archived.", "malformed")
    assert failed["status"] == "failed" and failed["attempts"] == 2

    fake.set_mode("loading")
    waiting = save(client, "The Petrel dashboard moved to port 8443.")
    deadline = time.monotonic() + 30
    while "unreachable" not in (client.get(f"/v1/memories/{waiting}").json()["last_error"] or ""):
        assert time.monotonic() < deadline, "the job was never deferred"
        time.sleep(0.05)
    down = scrape(client)
    assert value(down, "memory_model_up", server=fake.url) == 0
    assert value(down, "memory_queue_depth") == 1
    fake.set_mode("ok", facts=None)
    assert wait_status(client, waiting, timeout=60)["status"] == "done"
    after = scrape(client)

    assert moved(before, after, "memory_jobs_total", outcome="done", **team) == 5
    assert moved(before, after, "memory_jobs_total", outcome="retried", **team) == 2
    assert moved(before, after, "memory_jobs_total", outcome="failed", **team) == 1
    assert moved(before, after, "memory_jobs_total", outcome="deferred", **team) >= 1
    assert moved(before, after, "memory_extraction_seconds_count", outcome="done") == 5
    assert moved(before, after, "memory_extraction_seconds_count", outcome="failed") == 1
    assert moved(before, after, "memory_extraction_seconds_sum", outcome="done") > 0
    assert moved(before, after, "memory_facts_stored_total", **team) == 4  # 50, 70, the backup, the port
    assert moved(before, after, "memory_facts_merged_total", **team) == 1
    assert moved(before, after, "memory_facts_superseded_total", **team) == 1
    assert moved(before, after, "memory_facts_rejected_total", reason="names", **team) == 1
    # every call after the first reuses the system prompt from llama-server's cache
    assert moved(before, after, "memory_llm_prompt_tokens_total") > 0
    assert moved(before, after, "memory_llm_cached_tokens_total") > 0
    assert moved(before, after, "memory_llm_generated_tokens_total") > 0
    assert moved(before, after, "memory_jobs_by_status", status="done") == 5
    assert moved(before, after, "memory_jobs_by_status", status="failed") == 1
    assert moved(before, after, "memory_facts_active") == 3  # 70 replaced 50
    assert value(after, "memory_queue_depth") == 0
    assert value(after, "memory_model_up", server=fake.url) == 1


def test_stats_is_the_json_summary(client: httpx.Client) -> None:
    body = client.get("/v1/stats").json()
    assert set(body) == {"jobs", "throughput", "model_ready", "consolidation"}
    assert body["model_ready"] is True and body["jobs"]["done"] >= 1
    # Consolidation is off by default: reported, never running.
    assert body["consolidation"]["enabled"] is False and body["consolidation"]["running"] is False


def test_json_logs_carry_the_request_id_it_answered_with(client: httpx.Client, service: InProcessService) -> None:
    response = client.get("/v1/stats", headers={"X-Request-ID": "metrics-test-0042"})
    assert response.headers["x-request-id"] == "metrics-test-0042"
    generated = client.get("/health").headers["x-request-id"]
    deadline = time.monotonic() + 10
    while True:
        lines = [json.loads(line) for line in service.log().splitlines() if line.startswith("{")]
        by_id = {line.get("request_id"): line for line in lines}
        if {"metrics-test-0042", generated} <= set(by_id) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    line = by_id["metrics-test-0042"]
    assert (line["logger"], line["method"], line["path"], line["status"]) == (
        "memory_service.access",
        "GET",
        "/v1/stats",
        200,
    )
    assert line["level"] == "INFO" and line["duration_ms"] >= 0 and line["ts"].endswith("+00:00")
    assert by_id[generated]["path"] == "/health"
    # the server's own lines are JSON too, without a request id
    assert any(line["logger"].startswith("uvicorn") and "request_id" not in line for line in lines)


def test_apps_in_one_process_keep_their_own_registries() -> None:
    first, second = Metrics(), Metrics()
    first.consume.labels("team-a", "allowed").inc()
    first.llm_timings({"prompt_n": 12, "cache_n": 30, "predicted_n": 7})
    mine, theirs = (
        {s.name: s.value for f in text_string_to_metric_families(m.render().decode()) for s in f.samples}
        for m in (first, second)
    )
    assert (
        mine["memory_llm_prompt_tokens_total"],
        mine["memory_llm_cached_tokens_total"],
        mine["memory_llm_generated_tokens_total"],
        mine["memory_limit_consume_total"],
    ) == (12, 30, 7, 1)
    assert theirs["memory_llm_prompt_tokens_total"] == 0 and "memory_limit_consume_total" not in theirs


def test_every_rejection_reason_is_a_bounded_code() -> None:
    source = "Sent the report to alice@example.com. The budget is 40 units."
    facts = [
        "Is the budget 40 units?",
        "alice@example.com",
        "great, thanks!",
        "The budget is 90 units.",
        "Zorblax approved the budget.",
        "The marketing department celebrated victories.",
    ]
    rejected = ground(facts, source).rejected
    assert [r.code for r in rejected] == ["question", "address", "small_talk", "numbers", "names", "coverage"]
    assert {r.code for r in rejected} <= set(REJECT_CODES)
