"""A vector store that hangs, or whose disk is full, must not stall the service (issue 31).

The soak filled the data dir's disk; chromadb's upsert in the store's child process then hung, the parent
waited a flat 300 s for it, and a fact decision waited on it while holding the team's deciding lock, so that
team's forgets (and behind them its saves and lists) stalled for minutes. Here the real child process is
stopped with SIGSTOP (a hang that answers nothing) under a small MEMORY_VECTOR_CALL_TIMEOUT_S, while a real
fact decision needs the store and a forget of the same team comes in.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from conftest import wait_status

from memory_service.api.errors import classify
from memory_service.embedding.embedder import load_embedder
from memory_service.extraction.grounding import GroundedFact
from memory_service.pipeline.dedup import decide_facts, probe_facts
from memory_service.pipeline.passages import passage_ids
from memory_service.storage.chroma_process import ChromaCallError, ChromaProcess
from memory_service.storage.journal import Journal
from memory_service.storage.vectors import VectorStore
from tests.fakes.fake_llama_server import FakeLlamaServer

pytestmark = pytest.mark.process  # the real Chroma child process

TIMEOUT_S = 4.0
# a call that waits behind the hung one, then on a new child's start (importing chromadb on a busy machine)
BOUND_S = TIMEOUT_S * 2 + 20
ENV = {"MEMORY_CHROMA_PROCESS": "1", "MEMORY_VECTOR_CALL_TIMEOUT_S": str(TIMEOUT_S)}


@pytest.fixture
def fake_llama() -> Iterator[FakeLlamaServer]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        yield fake


def _timed(call: Any) -> tuple[Any, float]:
    started = time.monotonic()
    answer = call()
    return answer, time.monotonic() - started


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.2)


def test_a_hung_vector_store_holds_no_teams_lock_and_everything_converges_after(
    inprocess_service, fake_llama: FakeLlamaServer
) -> None:
    svc = inprocess_service(fake_llama.url, env=ENV)
    services = svc.services
    vectors = services.vectors
    with svc.client(timeout=BOUND_S + 30) as client:
        doomed = client.post("/v1/remember", json={"agent_id": "bot", "text": "The vault code is 4417."}).json()["id"]
        kept = client.post("/v1/remember", json={"agent_id": "bot", "text": "Lunch is served at noon."}).json()["id"]
        for memory_id in (doomed, kept):
            assert wait_status(client, memory_id, timeout=60)["status"] == "done"
        _wait_for(lambda: not services.journal.unindexed(10), 60, "the first saves' passages are indexed")

        pid = vectors.child_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # from here every call the child gets hangs, as chromadb's did
        try:
            asked = len(fake_llama.requests)
            saved, took = _timed(
                lambda: client.post(
                    "/v1/remember", json={"agent_id": "bot", "text": "The heron archive moved to building 7."}
                )
            )
            assert saved.status_code == 202 and took < TIMEOUT_S, (saved.status_code, took)  # no vector call
            fresh = saved.json()["id"]
            # the model answered the new save's job: its fact decision needs the (hung) store now
            _wait_for(lambda: len(fake_llama.requests) > asked, 30, "the new save's job reached the model")
            time.sleep(0.3)
            # the team's deciding lock is free although the decision's vector read hangs (it was held, so
            # forgets and the other decisions of the team queued behind the hung store)
            started = time.monotonic()
            with services.journal.deciding("team-a"):
                waited = time.monotonic() - started
            assert waited < TIMEOUT_S / 2, waited
            results: dict[str, tuple[int, float, dict[str, str]]] = {}

            def ask(name: str, method: str, path: str, body: dict | None = None) -> None:
                answer, took = _timed(lambda: client.request(method, path, json=body))
                results[name] = (answer.status_code, took, dict(answer.headers))

            calls = {
                "forget": ("DELETE", f"/v1/memories/{doomed}", None),
                "list": ("GET", "/v1/memories?agent_id=bot", None),
                "get": ("GET", f"/v1/memories/{kept}", None),
                "recall": ("POST", "/v1/recall", {"query": "where did the heron archive move", "k": 5}),
            }
            threads = [threading.Thread(target=ask, args=(name, *call)) for name, call in calls.items()]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(BOUND_S + 30)
            assert set(results) == set(calls), f"stalled: {set(calls) - set(results)}"
            for name, (status, took, headers) in results.items():
                assert took < BOUND_S, (name, status, took)
                assert status < 500 or (status == 503 and "retry-after" in headers), (name, status)
            assert results["list"][0] == 200 and results["get"][0] == 200
            assert results["forget"][0] in (204, 503)
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass  # killed and replaced already, as it should be

        # converged: the forget took (retried once if it answered 503), the new save has its vectors
        if results["forget"][0] == 503:
            assert client.delete(f"/v1/memories/{doomed}").status_code in (204, 404)
        assert client.get(f"/v1/memories/{doomed}").status_code == 404
        settled = wait_status(client, fresh, timeout=60)
        # decided without the near-duplicate check the hung store could not give: no attempt lost to it
        assert (settled["status"], settled["attempts"], settled["last_error"]) == ("done", 1, None), settled
        _wait_for(lambda: not services.journal.unindexed(10), 60, "the new save's passage is indexed")
        _wait_for(lambda: not services.journal.unindexed_facts(10), 60, "the new save's facts are indexed")
        heron = "The heron archive moved to building 7."
        assert vectors.embeddings("team-a", "passage", passage_ids(fresh, heron))
        _wait_for(
            lambda: not vectors.embeddings("team-a", "passage", passage_ids(doomed, "The vault code is 4417.")),
            60,
            "the forgotten memory's passage vector is removed",
        )
        hits = client.post("/v1/recall", json={"query": "vault code", "k": 10}).json()
        assert doomed not in str(hits)
        assert vectors.child_pid not in (None, pid)  # the hung child was replaced


def test_a_decision_whose_vector_read_fails_is_made_on_the_journal_without_losing_the_attempt(
    journal: Journal, tmp_path
) -> None:
    """The store stays hung (or its disk full) for the whole read: the fact is still decided and stored."""
    vectors = VectorStore(tmp_path / "chroma", process=True, call_timeout_s=1.0)
    try:
        vectors.count("a")  # the child is up
        text = "The Q3 marketing budget is 500 euros"
        journal.insert(
            team="a", agent_id="bot", text=text, run_id=None, tags=[], metadata={}, idempotency_key=None, budget_s=20
        )
        job = journal.claim_next("w", 60)
        assert job is not None
        facts = [GroundedFact(text, [(0, len(text))])]
        pid = vectors.child_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        embedder = load_embedder("onnx")
        probes, took = _timed(
            lambda: probe_facts(job, facts, journal=journal, embedder=embedder, vectors=vectors, near_duplicate=0.92)
        )
        assert took < 1.0 + 15, took  # the timeout, then the kill
        with journal.deciding("a"):
            plan, items = decide_facts(
                job, facts, journal=journal, embedder=embedder, probes=probes, near_duplicate=0.92
            )
            assert journal.complete(job, plan, raw_reply=None, timings=None, report={})
        assert [f.text for f in plan.new] == [text] and len(items) == 1
    finally:
        vectors.close()


def test_a_5000_row_call_gets_ten_times_what_it_takes_here(tmp_path) -> None:
    """Slow machines are users too: the largest legitimate calls must never be taken for a hang."""
    store = ChromaProcess(tmp_path / "chroma")  # the default base, as the service runs
    try:
        coll = store.get_or_create_collection("measure_rows")
        ids = [f"p:{i}" for i in range(5000)]
        embeddings = np.random.default_rng(0).standard_normal((5000, 384)).astype(np.float32)
        upsert = {"ids": ids, "embeddings": embeddings, "documents": ["word " * 60] * 5000}
        _, wrote = _timed(lambda: coll.upsert(**upsert))
        _, read = _timed(lambda: coll.get(ids=ids, include=["embeddings"]))
        assert store.timeout_for("upsert", upsert) >= 10 * wrote, wrote
        # the get by its row allowance alone
        assert store.timeout_for("get", {"ids": ids}) - store.call_timeout_s >= 10 * read, read
        assert store.timeout_for("count", {}) == store.call_timeout_s  # a small call: the base alone
    finally:
        store.close()


def test_the_vector_stores_full_disk_is_a_503_with_retry_after_not_a_500() -> None:
    """What the soak's DELETE answered 500 for: chromadb's SQLite reporting the full disk, through the child."""
    for words in ("InternalError: database or disk is full", "InternalError: disk I/O error"):
        problem = classify(ChromaCallError(words))
        assert problem.status == 503 and problem.headers == {"Retry-After": "1"}, words
    # any other Chroma error stays what it is: a bug, not "try again"
    assert classify(ChromaCallError("InvalidArgumentError: Expected a name")).status == 500
