"""Three API processes, one deployment: a real PostgreSQL, a real Chroma server, a real llama-server, HTTP.

Each process is `memory-service serve` in its own process group with its own data dir; they share
MEMORY_DATABASE_URL, MEMORY_CHROMA_URL, the model server and a short job lease (4 s), so a job held
by a process that dies is taken over quickly. Team names are unique per test: the Chroma server is
shared by the whole session.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest
from limits_helpers import concurrently

from memory_service.bench.texts import AGENT_TEXTS
from memory_service.testbed.group import ServiceGroup, shared_env

pytestmark = pytest.mark.process  # several serve processes on shared stores

LEASE_S = 4.0
PROCESSES = 3


def deployment(tmp: Path, database_url: str, chroma_url: str, llm_url: str, keys: dict[str, str]) -> ServiceGroup:
    env = {**shared_env(database_url, chroma_url, LEASE_S), "MEMORY_LOG_LEVEL": "INFO", "MEMORY_RETRY_BASE_S": "0.2"}
    return ServiceGroup(tmp, PROCESSES, api_keys=keys, llm_url=llm_url, env=env, model="tiny")


class Teams:
    """Two teams with names of their own (the session's Chroma server outlives every test)."""

    def __init__(self) -> None:
        run = uuid.uuid4().hex[:8]
        self.a, self.b = f"team-a-{run}", f"team-b-{run}"
        self.keys = {f"ka-{run}": self.a, f"kb-{run}": self.b}
        self.key_a, self.key_b = list(self.keys)


@pytest.fixture(scope="module")
def teams() -> Teams:
    return Teams()


@pytest.fixture(scope="module")
def trio(pg_cluster, chroma_server, tiny_llama, teams, tmp_path_factory) -> Iterator[ServiceGroup]:
    """Three processes on one fresh database, for the tests that kill none of them."""
    url = pg_cluster.create_database()
    with deployment(tmp_path_factory.mktemp("trio"), url, chroma_server.url, tiny_llama.url, teams.keys) as group:
        yield group


# ---------------------------------------------------------------- limits


def test_64_consumers_over_three_processes_get_exactly_the_limit(trio: ServiceGroup, teams: Teams) -> None:
    with trio[0].client(teams.key_a) as admin:
        assert (
            admin.put("/v1/limits/api-calls", json={"daily_limit": 50, "timezone": "UTC", "per": "team"}).status_code
            == 201
        )
    clients = [trio[n % PROCESSES].client(teams.key_a) for n in range(64)]
    try:
        responses = concurrently(
            [
                lambda c=c, n=n: c.post("/v1/limits/api-calls/consume", json={"agent_id": f"ag-{n}"})
                for n, c in enumerate(clients)
            ]
        )
    finally:
        for c in clients:
            c.close()
    ok = [r for r in responses if r.status_code == 200]
    denied = [r for r in responses if r.status_code == 429]
    assert (len(ok), len(denied)) == (50, 14), [r.text for r in responses if r.status_code not in (200, 429)]
    assert sorted(r.json()["used"] for r in ok) == list(range(1, 51))  # every increment distinct
    assert all(r.json()["used"] == 50 and not r.json()["allowed"] for r in denied)
    allowed_by_process = {p: sum(r.status_code == 200 for r in responses[p::PROCESSES]) for p in range(PROCESSES)}
    assert all(allowed_by_process.values()), allowed_by_process  # each process granted some
    for svc in trio.runners:  # every process reads the same counter
        with svc.client(teams.key_a) as c:
            assert c.get("/v1/limits/api-calls").json()["used"] == 50


def test_a_retry_through_another_process_counts_once(trio: ServiceGroup, teams: Teams) -> None:
    """30 idempotency keys, each sent to all three processes at once; the limit lets 20 of them through."""
    with trio[0].client(teams.key_a) as admin:
        admin.put("/v1/limits/emails", json={"daily_limit": 20, "timezone": "UTC", "per": "team"}).raise_for_status()
    clients = [trio[n % PROCESSES].client(teams.key_a) for n in range(90)]
    try:
        responses = concurrently(
            [
                lambda c=c, n=n: c.post(
                    "/v1/limits/emails/consume", json={"agent_id": "mailer", "idempotency_key": f"msg-{n // 3}"}
                )
                for n, c in enumerate(clients)
            ]
        )
    finally:
        for c in clients:
            c.close()
    by_key = [responses[k * 3 : (k + 1) * 3] for k in range(30)]  # the 3 sends of a key went to processes 0, 1, 2
    allowed = [k for k, rs in enumerate(by_key) if all(r.status_code == 200 for r in rs)]
    denied = [k for k, rs in enumerate(by_key) if all(r.status_code == 429 for r in rs)]
    assert (len(allowed), len(denied)) == (20, 10), [[r.status_code for r in rs] for rs in by_key]
    for k in allowed:  # one counted, the two others replay its answer byte for byte, whichever process they hit
        assert len({r.text for r in by_key[k]}) == 1
        assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in by_key[k]) == 2
    assert sorted(by_key[k][0].json()["used"] for k in allowed) == list(range(1, 21))
    with trio[2].client(teams.key_a) as c:
        assert c.get("/v1/limits/emails").json()["used"] == 20
        # later retries, through any process, still replay and count nothing
        again = c.post("/v1/limits/emails/consume", json={"agent_id": "mailer", "idempotency_key": f"msg-{allowed[0]}"})
        assert again.status_code == 200 and again.text == by_key[allowed[0]][0].text
        assert c.get("/v1/limits/emails").json()["used"] == 20


# ---------------------------------------------------------------- team isolation


def test_team_isolation_holds_across_processes(trio: ServiceGroup, teams: Teams) -> None:
    marker = "qx" + uuid.uuid4().hex[:10]
    text = f"The Tromso warehouse alarm code was changed by Ingrid Dahl on 3 March, reference {marker}."
    with trio[0].client(teams.key_a) as a:
        saved = a.post("/v1/remember", json={"text": text, "agent_id": "ops"})
        assert saved.status_code == 202, saved.text
        memory_id = saved.json()["id"]
        a.put("/v1/limits/a-only", json={"daily_limit": 5, "timezone": "UTC", "per": "team"}).raise_for_status()
    with trio[1].client(teams.key_a) as a:  # extracted by whichever process took the job; read through another
        deadline = time.monotonic() + 180
        while a.get(f"/v1/memories/{memory_id}").json()["status"] not in ("done", "failed"):
            assert time.monotonic() < deadline, "the memory was never extracted"
            time.sleep(0.3)
    for svc in trio.runners:
        with svc.client(teams.key_b) as b:
            assert b.get(f"/v1/memories/{memory_id}").status_code == 404
            assert memory_id not in {m["id"] for m in b.get("/v1/memories").json()["items"]}
            for query in (marker, "who changed the warehouse alarm code"):
                items = b.post("/v1/recall", json={"query": query, "k": 100}).json()["items"]
                assert all(i["memory_id"] != memory_id and marker not in i["text"] for i in items), items
            assert b.delete(f"/v1/memories/{memory_id}").status_code == 404
            assert b.post("/v1/limits/a-only/consume", json={"agent_id": "x"}).status_code == 404
            assert b.get("/v1/limits/a-only").status_code == 404
    with trio[2].client(teams.key_a) as a:  # team A still has everything, found through a third process
        assert a.get(f"/v1/memories/{memory_id}").status_code == 200
        items = a.post("/v1/recall", json={"query": marker, "k": 10}).json()["items"]
        assert memory_id in {i["memory_id"] for i in items}, items
        assert a.get("/v1/limits/a-only").json()["used"] == 0
    # team B's limit of the same name is its own counter
    with trio[1].client(teams.key_b) as b:
        b.put("/v1/limits/a-only", json={"daily_limit": 1, "timezone": "UTC", "per": "team"}).raise_for_status()
        assert b.post("/v1/limits/a-only/consume", json={"agent_id": "x"}).status_code == 200
    with trio[0].client(teams.key_a) as a:
        assert a.get("/v1/limits/a-only").json()["used"] == 0


# ---------------------------------------------------------------- the job queue, with a process killed


SAVES = 300
REAL_EVERY = 12  # one save in 12 is a text the model extracts; the rest are small talk the gate skips
SMALL_TALK = (
    "Thanks, talk soon!",
    "Ok, sounds good.",
    "Great, thank you!",
    "Good morning!",
    "Cheers, bye.",
    "Sure, no problem.",
    "Hello there, hope you are well.",
)


def save_body(i: int, run: str) -> tuple[dict, str | None]:
    """The i-th save: a tag of its own always; a marker word in the text when the model extracts it."""
    tag = f"s{i}-{run}"
    if i % REAL_EVERY:
        return {"text": SMALL_TALK[i % len(SMALL_TALK)], "agent_id": f"ag-{i % 5}", "tags": [tag]}, None
    marker = f"zq{run}{i}"
    return {
        "text": f"{AGENT_TEXTS[i % len(AGENT_TEXTS)]} Ticket {marker}.",
        "agent_id": f"ag-{i % 5}",
        "tags": [tag],
    }, marker


def holding_model_job(database_url: str, pid: int, run: str) -> bool:
    """Whether the process `pid` holds a job the model extracts (seconds long, unlike small talk, which a
    worker holds for milliseconds: a kill aimed at one of those would often land after it finished)."""
    with psycopg.connect(database_url) as conn:
        return (
            conn.execute(
                "SELECT count(*) FROM memories WHERE status = 'extracting' AND lease_owner LIKE %s AND text LIKE %s",
                (f"%:{pid}:%", f"% Ticket zq{run}%"),
            ).fetchone()[0]
            > 0
        )


def test_a_killed_process_loses_no_acknowledged_save(postgres_url, chroma_server, tiny_llama, tmp_path) -> None:
    """300 concurrent saves over three processes; one is SIGKILLed half-way and never restarted.

    Every acknowledged save reaches done or failed and its passage is recallable through a survivor;
    the attempt records show no job was ever held by two workers at once, and one `done` per done job.

    Runtime: the tiny model takes ~4 s per extraction on 2 cores, so 300 real extractions would take
    ~20 min. One save in 12 is a real text (25 extractions: the killed process holds one of those when
    it dies); the rest are small talk, which the gate finishes without a model call but which still
    go through the same queue, leases and attempt records. The test is about the job queue across
    processes, not about extraction.
    """
    teams = Teams()
    run = uuid.uuid4().hex[:6]
    group = deployment(tmp_path, postgres_url, chroma_server.url, tiny_llama.url, teams.keys)
    with group:
        for svc in group.runners:
            svc.wait_model_ready(120)
        victim = group[1]
        clients = [svc.client(teams.key_a, timeout=30) for svc in group.runners]
        acked: dict[str, int] = {}  # memory id -> save number
        answered = threading.Semaphore(0)
        lock = threading.Lock()
        killed_after: list[int] = []
        killed_holding: list[bool] = []

        def save(i: int) -> None:
            body, _ = save_body(i, run)
            try:
                response = clients[i % PROCESSES].post("/v1/remember", json=body)
            except httpx.HTTPError:  # the killed process: no answer, so nothing was promised
                response = None
            if response is not None and 200 <= response.status_code < 300:
                with lock:
                    acked[response.json()["id"]] = i
            answered.release()

        def killer() -> None:
            for _ in range(SAVES // 2):
                answered.acquire()
            deadline = time.monotonic() + 150  # kill it while it holds a job, so the takeover is exercised
            while not (held := holding_model_job(postgres_url, victim.pid, run)) and time.monotonic() < deadline:
                time.sleep(0.02)
            with lock:
                killed_after.append(len(acked))
            killed_holding.append(held)
            group.kill(1)

        try:
            kill_thread = threading.Thread(target=killer)
            kill_thread.start()
            started = time.monotonic()
            with ThreadPoolExecutor(48) as pool:
                list(pool.map(save, range(SAVES)))
            kill_thread.join(180)
            print(f"\n{len(acked)} acked in {time.monotonic() - started:.1f}s; killed after {killed_after} acks")
        finally:
            for c in clients:
                c.close()
        assert victim.proc is not None and victim.proc.poll() is not None, "the victim was not killed"
        assert killed_holding == [True], "the victim never held a model job within 150 s: no takeover to test"
        by_process = [sum(1 for i in acked.values() if i % PROCESSES == p) for p in range(PROCESSES)]
        assert all(by_process), by_process  # the victim acknowledged saves before it died
        assert len(acked) >= SAVES * 2 // 3 - 5, by_process

        wait_settled(postgres_url, list(acked), timeout_s=300)
        print(f"settled {time.monotonic() - started:.1f}s after the first save")
        survivors = [group[0], group[2]]
        check_recallable(survivors, teams.key_a, acked, run)
        check_attempts(postgres_url, victim.pid)
        print(f"checked {time.monotonic() - started:.1f}s after the first save")


def wait_settled(database_url: str, ids: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with psycopg.connect(database_url) as conn:
            rows = conn.execute(
                "SELECT status, count(*) FROM memories WHERE id = ANY(%s) GROUP BY status", (ids,)
            ).fetchall()
        counts = dict(rows)
        if sum(counts.get(s, 0) for s in ("done", "failed")) == len(ids):
            return
        assert time.monotonic() < deadline, f"not settled after {timeout_s:.0f}s: {counts}"
        time.sleep(1.0)


def check_recallable(survivors: list, key: str, acked: dict[str, int], run: str) -> None:
    """Through a survivor each: GET answers done/failed, and recall finds the passage (by tag; by marker too)."""

    def one(item: tuple[str, int]) -> str | None:
        memory_id, i = item
        body, marker = save_body(i, run)
        with survivors[i % 2].client(key) as c:
            status = c.get(f"/v1/memories/{memory_id}").json()["status"]
            if status not in ("done", "failed"):
                return f"{memory_id}: {status}"
            found = c.post("/v1/recall", json={"query": body["text"], "tags": body["tags"], "kinds": ["passage"]})
            if memory_id not in {x["memory_id"] for x in found.json()["items"]}:
                return f"{memory_id} (save {i}): not recalled by its tag: {found.text[:300]}"
            if marker:
                found = c.post("/v1/recall", json={"query": marker, "k": 10})
                if memory_id not in {x["memory_id"] for x in found.json()["items"]}:
                    return f"{memory_id} (save {i}): not recalled by its marker {marker}: {found.text[:300]}"
        return None

    with ThreadPoolExecutor(8) as pool:
        problems = [p for p in pool.map(one, acked.items()) if p]
    assert not problems, problems[:10]


def check_attempts(database_url: str, victim_pid: int) -> None:
    """Per job: attempts in start order never overlap; exactly one `done` per done job."""
    with psycopg.connect(database_url) as conn:
        status = dict(conn.execute("SELECT id, status FROM memories").fetchall())
        rows = conn.execute(
            "SELECT memory_id, worker, started_at, ended_at, outcome FROM job_attempts ORDER BY memory_id, started_at"
        ).fetchall()
    attempts: dict[str, list[tuple]] = {}
    for memory_id, *attempt in rows:
        attempts.setdefault(memory_id, []).append(tuple(attempt))
    assert set(attempts) == {m for m, s in status.items() if s in ("done", "failed")}
    for memory_id, tries in attempts.items():
        for before, after in zip(tries, tries[1:]):
            assert before[2] is not None and after[1] >= before[2], (memory_id, tries)  # one holder at a time
        assert all(t[2] is not None for t in tries), (memory_id, tries)  # every attempt ended
        if status[memory_id] == "done":
            assert [t[3] for t in tries].count("done") == 1, (memory_id, tries)
            assert tries[-1][3] == "done", (memory_id, tries)
    taken_over = [
        (m, t) for m, tries in attempts.items() for t in tries if f":{victim_pid}:" in t[0] and t[3] == "lease expired"
    ]
    assert taken_over, "the job the killed process held was not taken over"
    for memory_id, _ in taken_over:  # finished by a survivor
        assert f":{victim_pid}:" not in attempts[memory_id][-1][0]
    print(
        f"{len(rows)} attempts over {len(attempts)} jobs; taken over from the killed process: "
        f"{[m for m, _ in taken_over]}"
    )
