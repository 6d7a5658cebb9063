"""Nothing one team does shows in another's answers (issue 40): /ready's counts, remember's queue depth and
estimate, and the query-embedding cache.

In process, no model and no workers: the real app and stores (SQLite, Chroma, the MiniLM embedder) through
TestClient, so every save stays queued and the counts are exact. The cache is observed by its own hit and
miss counters, never by timing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from memory_service.app import create_app
from memory_service.config import Settings
from memory_service.llm.runtime.server import free_port
from memory_service.services import Services

TOKEN = "operator-scrape-token"
KEYS = {"key-a": "team-a", "key-b": "team-b"}
COUNT_FIELDS = ("queue_depth", "jobs", "throughput")


def _open(data_dir: Path, **settings: object) -> Services:
    fields: dict = {"data_dir": data_dir, "llm_url": f"http://127.0.0.1:{free_port()}", "chroma_process": False}
    # a known model speed, so remember answers an estimate whose inputs the test can check
    return Services.open(Settings(**{**fields, **settings}), speed_prior=(200.0, 20.0))


@pytest.fixture(scope="module")
def keyed(tmp_path_factory) -> Iterator[Services]:
    """Two teams and the operator's metrics token; team B has a backlog of 8 saves, team A has 1."""
    services = _open(tmp_path_factory.mktemp("cross") / "data", api_keys=KEYS, metrics_token=TOKEN)
    b = _client(services, "key-b")
    for i in range(8):
        assert (
            b.post(
                "/v1/remember", json={"text": f"team b backlog {i}: the zanzibar ledger", "agent_id": "b"}
            ).status_code
            == 202
        )
    yield services
    services.close()


def _client(services: Services, key: str | None) -> TestClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    app = create_app(services.settings, services=services)
    return TestClient(app, headers=headers, base_url="http://127.0.0.1:8700")  # keyless mode answers loopback only


def test_remember_counts_only_the_teams_own_jobs_ahead(keyed: Services) -> None:
    """Team A's first save has 1 job ahead (itself) and an estimate for that one job, whatever B queued."""
    text = "team a saves one short text"
    body = _client(keyed, "key-a").post("/v1/remember", json={"text": text, "agent_id": "a"}).json()
    assert body["queue_depth"] == 1  # main: 9, team B's 8 queued jobs counted in
    expected, basis = keyed.estimate(1, len(text))
    assert expected is not None and body["estimated_extraction_s"] == expected and body["estimate_basis"] == basis
    # a second save of A's: its own two jobs, still none of B's
    again = _client(keyed, "key-a").post("/v1/remember", json={"text": text + " again", "agent_id": "a"}).json()
    assert again["queue_depth"] == 2


def test_ready_without_a_key_says_ready_or_not_and_why_with_no_counts(keyed: Services) -> None:
    for key in (None, "not-a-key"):  # no key, or an unknown one: /ready still answers a probe, without counts
        response = _client(keyed, key).get("/ready")
        assert response.status_code == 503  # no model server here: not ready, and the body says why
        body = response.json()
        assert body["status"] == "unavailable" and body["model_server"]["reachable"] is False
        assert body["model_server"]["error"]
        assert not set(COUNT_FIELDS) & set(body), body  # main: every team's jobs and the queue depth
        assert all("throughput" not in server for server in body["model_servers"])


def test_ready_with_a_team_key_counts_that_team_only(keyed: Services) -> None:
    b = _client(keyed, "key-b").get("/ready").json()
    assert b["queue_depth"] == 8 and b["jobs"]["queued"] == 8  # B's own backlog, none of A's saves
    a = _client(keyed, "key-a").get("/ready").json()
    assert a["jobs"]["queued"] == a["queue_depth"] == keyed.status_counts("team-a")["queued"]
    assert a["queue_depth"] < 8


def test_ready_shows_a_pinned_key_only_what_stats_would(keyed: Services) -> None:
    """A key pinned to an agent gets a 403 from /v1/stats (the counts are the team's): /ready shows it none of
    them either, nor the webhooks' team-wide counts, and still says ready or not and why (issue 53)."""
    pinned = keyed.keys.create("team-b", "admin", agent_id="b").key
    assert _client(keyed, pinned).get("/v1/stats").status_code == 403
    response = _client(keyed, pinned).get("/ready")
    body = response.json()
    assert response.status_code == 503 and body["status"] == "unavailable" and body["model_server"]["error"]
    assert not {*COUNT_FIELDS, "webhooks"} & set(body), body  # before: B's 8 queued jobs, its webhooks
    assert all("throughput" not in server for server in body["model_servers"])


def test_ready_with_the_metrics_token_counts_every_team(keyed: Services) -> None:
    body = _client(keyed, TOKEN).get("/ready").json()
    everyone = keyed.job_counts()
    assert body["jobs"] == everyone and body["queue_depth"] == everyone["queued"] + everyone["extracting"]
    assert body["queue_depth"] >= 9 and "throughput" in body


def test_keyless_loopback_ready_keeps_its_counts(tmp_path: Path) -> None:
    """One local team: its counts are nobody else's, so /ready shows them without a key."""
    services = _open(tmp_path / "data")
    try:
        client = _client(services, None)
        assert client.post("/v1/remember", json={"text": "a local save", "agent_id": "me"}).status_code == 202
        body = client.get("/ready").json()
        assert body["queue_depth"] == 1 and body["jobs"]["queued"] == 1
    finally:
        services.close()


def test_a_query_another_team_asked_is_embedded_again(keyed: Services) -> None:
    """The query-embedding cache is keyed by team: B asking a text does not make A's same text a hit
    (on main the key was the text alone, and A's recall was 7 ms instead of 200 ms: B had asked it)."""
    cache = keyed.query_embeddings
    query = {"query": "what did the zanzibar ledger say about the harbour fees", "k": 5}
    assert _client(keyed, "key-b").post("/v1/recall", json=query).status_code == 200
    hits, misses = cache.hits, cache.misses
    assert _client(keyed, "key-a").post("/v1/recall", json=query).status_code == 200
    assert (cache.hits, cache.misses) == (hits, misses + 1)  # A's first ask: embedded for A
    assert _client(keyed, "key-a").post("/v1/recall", json=query).status_code == 200
    assert (cache.hits, cache.misses) == (hits + 1, misses + 1)  # A's repeat: A's own cached vector
