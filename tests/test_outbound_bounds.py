"""Issue 53: every outbound call has a total deadline and a bounded read, and a stuck peer delays only the work
that needs it. Each peer is a real server on loopback playing the fault: the fake llama-server's `fault` modes
(a peer that never answers, trickles a byte every half second, or never stops sending), a socket that accepts
and never speaks PostgreSQL, and a Chroma stand-in that trickles its answers.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from conftest import wait_status
from fakes.fake_llama_server import FakeLlamaServer
from fakes.fault_proxy import FaultProxy

from memory_service.config import Settings
from memory_service.extraction.errors import LlmTimeout, LlmUnavailable
from memory_service.llm.client import LlamaClient
from memory_service.storage.database import open_database, storage_unavailable
from memory_service.storage.vectors import VectorStore

GUARD_S = 20  # a call still running after this is unbounded: the test fails instead of hanging
MiB = 1 << 20


def bounded(coro: Any) -> Any:
    """Run `coro` with the test's own guard, so a call with no deadline fails the test rather than hanging it."""
    return asyncio.run(asyncio.wait_for(coro, GUARD_S))


async def _closing(client: LlamaClient, coro: Any) -> Any:
    try:
        return await coro
    finally:
        await client.aclose()


# --------------------------------------------------------------------------- llama-server, the client alone


@pytest.mark.parametrize("fault", ["silent", "trickle_headers", "trickle_body"])
def test_a_llama_call_ends_at_its_total_deadline(fault: str) -> None:
    """A /tokenize whose server never answers, or answers a byte every 0.5 s (each read well inside httpx's
    per-read timeout), ends at the call's 2 s total."""
    with FakeLlamaServer("ok") as fake:
        fake.set_mode("ok", fault=fault, fault_on=["/tokenize"], trickle_s=0.5)
        client = LlamaClient(fake.url)
        started = time.monotonic()
        with pytest.raises(LlmTimeout, match=r"did not answer /tokenize within 2\.0s"):
            bounded(_closing(client, client.count_tokens("hello there", timeout=2.0)))
        took = time.monotonic() - started
    assert took < 4, f"the 2 s /tokenize took {took:.1f}s"


def _peak_while(coro: Any) -> tuple[BaseException | None, int]:
    tracemalloc.start()
    try:
        try:
            bounded(coro)
            error = None
        except Exception as exc:  # the test looks at which
            error = exc
        return error, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_llama_reply_that_never_ends_is_cut_at_the_cap() -> None:
    """/props answering 48 MiB of body: refused at the 1 MiB cap, having held little more than that."""
    with FakeLlamaServer("ok") as fake:
        fake.set_mode("ok", fault="endless", fault_on=["/props"], endless_bytes=48 * MiB)
        client = LlamaClient(fake.url)
        client.max_reply_bytes = 1 * MiB  # as MEMORY_LLM_MAX_REPLY_BYTES=1048576 would
        error, peak = _peak_while(_closing(client, client.props()))
    assert isinstance(error, LlmUnavailable) and "MEMORY_LLM_MAX_REPLY_BYTES" in str(error), error
    assert peak < 8 * MiB, f"reading the reply held {peak / MiB:.0f} MiB"


def test_a_streamed_completion_that_never_ends_is_cut_at_the_cap() -> None:
    """A chat stream of 48 MiB of events that never finish (each within the job's deadline): refused at its
    cap (1 MiB here: the client's, as 64 output tokens need far less), memory bounded, well before the deadline."""
    with FakeLlamaServer("ok") as fake:
        fake.set_mode("ok", fault="endless", fault_on=["/v1/chat/completions"], endless_bytes=48 * MiB)
        client = LlamaClient(fake.url)
        client.max_reply_bytes = 1 * MiB
        messages = [{"role": "user", "content": "Ingrid manages the depot."}]
        call = client.complete_json(messages, schema={"type": "object"}, max_tokens=64, timeout_s=60)
        started = time.monotonic()
        error, peak = _peak_while(_closing(client, call))
        took = time.monotonic() - started
    assert isinstance(error, LlmUnavailable) and "kept streaming" in str(error), error
    assert peak < 8 * MiB, f"reading the stream held {peak / MiB:.0f} MiB"
    assert took < 10, f"the capped stream took {took:.1f}s"


# --------------------------------------------------------------------------- llama-server, through the service


def test_a_trickling_tokenizer_delays_only_extraction(inprocess_service) -> None:
    """The service's llama-server answers /tokenize a byte every 0.5 s. Extraction's attempt ends at its
    deadline (max(10 s, MEMORY_EXTRACT_BUDGET_S)) and is retried, not held for ever; meanwhile /health, a save
    and a recall are answered at once; once the server answers again the save is extracted: nothing lost."""
    with FakeLlamaServer("ok", tokens_per_s=5000) as fake:
        svc = inprocess_service(fake.url, env={"MEMORY_EXTRACT_BUDGET_S": "2"})
        fake.set_mode("ok", fault="trickle_body", fault_on=["/tokenize"], trickle_s=0.5)
        with svc.client() as client:
            memory_id = client.post(
                "/v1/remember", json={"text": "Ingrid Larsen manages the Bergen depot.", "agent_id": "a"}
            ).json()["id"]
            started, slowest, body = time.monotonic(), 0.0, {}
            while time.monotonic() - started < GUARD_S:
                for call in (
                    lambda: client.get("/health"),
                    lambda: client.post("/v1/recall", json={"query": "who manages the depot", "max_tokens": 64}),
                    lambda: client.post("/v1/remember", json={"text": "The depot opens at six.", "agent_id": "b"}),
                ):
                    t0 = time.monotonic()
                    assert call().status_code in (200, 201, 202)
                    slowest = max(slowest, time.monotonic() - t0)
                body = client.get(f"/v1/memories/{memory_id}").json()
                if body.get("attempts", 0) >= 1 and "/tokenize" in (body.get("last_error") or ""):
                    break
                time.sleep(0.5)
            took = time.monotonic() - started
            assert "/tokenize within 10.0s" in (body.get("last_error") or ""), body
            assert took < 16, f"the attempt ended {took:.1f}s after the save (deadline 10 s)"
            assert slowest < 2, f"other work waited {slowest:.1f}s behind the stuck tokenizer"
            fake.set_mode("ok", fault=None)
            assert wait_status(client, memory_id, timeout=60)["status"] == "done"


# --------------------------------------------------------------------------- the Chroma server


def _in_thread(call: Any, guard_s: float = GUARD_S) -> tuple[BaseException | None, float]:
    """`call()` in a thread (chromadb's client is blocking); (its error, seconds taken). Past `guard_s` the
    call is unbounded: the thread is left behind and the test fails."""
    box: list[BaseException | None] = []
    started = time.monotonic()

    def run() -> None:
        try:
            call()
            box.append(None)
        except BaseException as exc:  # the test looks at which
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(guard_s)
    assert box, f"the call was still running after {guard_s}s: no total deadline"
    return box[0], time.monotonic() - started


@pytest.fixture
def chroma_proxy(chroma_server) -> Iterator[FaultProxy]:
    proxy = FaultProxy(chroma_server.port)
    yield proxy
    proxy.close()


@pytest.mark.parametrize("fault", ["silent", "trickle"])
def test_a_chroma_call_ends_at_its_total_deadline(chroma_proxy, fault: str) -> None:
    """The server answers nothing, or a byte every 0.5 s (so no single read waits long): a count with a 2 s
    deadline fails as `ChromaServerFault` (a 503) after about 2 s, where before it waited 120 s per read."""
    store = VectorStore(url=chroma_proxy.url, call_timeout_s=2)
    team = f"bounds-{uuid.uuid4().hex[:8]}"
    try:
        assert store.count(team) == 0  # the collections exist: what follows is one call each
        chroma_proxy.mode = fault
        error, took = _in_thread(lambda: store.count(team))
    finally:
        chroma_proxy.mode = "pass"
    assert error is not None and "within 2.0s" in str(error), error
    assert storage_unavailable(error)  # a ChromaServerFault: the API's 503
    assert took < 5, f"the 2 s call took {took:.1f}s"


def test_a_chroma_answer_that_never_ends_is_cut_at_the_cap(chroma_proxy) -> None:
    store = VectorStore(url=chroma_proxy.url, call_timeout_s=30, max_reply_bytes=1 * MiB)
    team = f"bounds-{uuid.uuid4().hex[:8]}"
    assert store.count(team) == 0
    chroma_proxy.mode = "endless"
    tracemalloc.start()
    try:
        error, _ = _in_thread(lambda: store.count(team))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        chroma_proxy.mode = "pass"
    assert error is not None and "MEMORY_CHROMA_MAX_REPLY_BYTES" in str(error), error
    assert storage_unavailable(error)
    assert peak < 8 * MiB, f"reading the answer held {peak / MiB:.0f} MiB"


def test_a_stuck_chroma_server_delays_only_recall(chroma_proxy, inprocess_service) -> None:
    """A Chroma server that stops answering: ten recalls at once each end in a 503 within the 3 s deadline (or
    at once, when four calls already wait on the server), and meanwhile /health and saves are answered: the
    recalls never hold all of the blocking pool's threads (six on two cores)."""
    env = {"MEMORY_CHROMA_URL": chroma_proxy.url, "MEMORY_VECTOR_CALL_TIMEOUT_S": "3"}
    with FakeLlamaServer("ok", tokens_per_s=5000) as fake:
        svc = inprocess_service(fake.url, env=env)
        with svc.client() as client:
            saved = client.post("/v1/remember", json={"text": "Ingrid Larsen manages the depot.", "agent_id": "a"})
            assert wait_status(client, saved.json()["id"], timeout=60)["status"] == "done"
            assert client.post("/v1/recall", json={"query": "who manages the depot"}).status_code == 200
            chroma_proxy.mode = "silent"
            answers: list[int] = []

            def recall() -> None:
                with svc.client() as own:
                    answers.append(own.post("/v1/recall", json={"query": "who manages the depot"}).status_code)

            threads = [threading.Thread(target=recall, daemon=True) for _ in range(10)]
            started = time.monotonic()
            for thread in threads:
                thread.start()
            time.sleep(0.3)  # the recalls are in flight
            slowest = 0.0
            for i in range(3):
                t0 = time.monotonic()
                assert client.get("/health").status_code == 200
                assert (
                    client.post("/v1/remember", json={"text": f"Shift {i} starts at six.", "agent_id": "b"}).status_code
                    == 202
                )
                slowest = max(slowest, time.monotonic() - t0)
            for thread in threads:
                thread.join(max(0.0, started + GUARD_S - time.monotonic()))
            took = time.monotonic() - started
            chroma_proxy.close()  # ends any call still waiting, so the service stops at once
    assert answers == [503] * 10, answers
    assert took < 10, f"the recalls took {took:.1f}s against a 3 s deadline"
    assert slowest < 2, f"a save or /health waited {slowest:.1f}s behind the stuck Chroma server"


# --------------------------------------------------------------------------- PostgreSQL


def _pg_settings(url: str, **more: Any) -> Settings:
    return Settings(database_url=url, **more)


def test_a_postgres_statement_ends_at_statement_timeout(postgres_url) -> None:
    """The service's connections carry MEMORY_DATABASE_STATEMENT_TIMEOUT_S: PostgreSQL ends a longer statement
    (a lock wait alike) itself, and the error counts as storage unavailable (503, retried)."""
    db = open_database(_pg_settings(postgres_url, database_statement_timeout_s=1))
    assert db is not None
    try:
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError) as caught, db.reading() as conn:
            conn.execute("SELECT pg_sleep(8)")
        took = time.monotonic() - started
    finally:
        db.close()
    assert took < 4, f"the statement ran {took:.1f}s past a 1 s statement_timeout"
    assert storage_unavailable(caught.value)


def test_a_stopped_postgres_backend_is_cut_off_by_the_client(postgres_url) -> None:
    """The server process serving our connection is stopped (SIGSTOP): it answers nothing, not even its own
    statement_timeout, and the kernel still acknowledges every packet. The watchdog cuts the connection at the
    timeout plus 10 s; the error is a 503's and names the setting; the pool then serves a fresh connection."""
    db = open_database(_pg_settings(postgres_url, database_statement_timeout_s=1))
    assert db is not None
    pid = None
    try:
        with db.reading() as conn:
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            os.kill(pid, signal.SIGSTOP)

            def stuck() -> None:
                conn.execute("SELECT 1")

            try:
                error, took = _in_thread(stuck, guard_s=25)
            finally:  # before the connection goes back to the pool, which would wait on it too
                os.kill(pid, signal.SIGCONT)
                pid = None
        assert isinstance(error, psycopg.OperationalError), error
        assert "MEMORY_DATABASE_STATEMENT_TIMEOUT_S" in str(error) and storage_unavailable(error)
        assert 10 < took < 15, f"cut off after {took:.1f}s (1 s + 10 s grace)"
        with db.reading() as conn:
            assert conn.execute("SELECT 1").fetchone()[0] == 1
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        db.close()


def test_a_postgres_that_accepts_and_never_answers_is_refused_in_time() -> None:
    """A listener that accepts the connection and never speaks: start-up refuses it within the 5 s connect
    timeout, naming the URL (this held before issue 53 too: a regression guard)."""
    listener = socket.create_server(("127.0.0.1", 0))
    url = f"postgresql://memory@127.0.0.1:{listener.getsockname()[1]}/memory?sslmode=disable"
    try:
        started = time.monotonic()
        with pytest.raises(ValueError, match="unreachable or refused"):
            open_database(_pg_settings(url))
        took = time.monotonic() - started
    finally:
        listener.close()
    assert took < 8, f"refused after {took:.1f}s"
