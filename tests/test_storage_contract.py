"""One storage contract, two backends: every test here runs on SQLite and on a real PostgreSQL
(the `database` and `journal` fixtures of conftest).

The journal (texts, jobs, facts, keyword search), listing, forgetting and export behave the same
whichever database holds them; limits and the handled ledger are covered the same way in test_limits.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from memory_service.storage.catalog import ListFilter, export_records, facets, list_memories
from memory_service.storage.database import Database
from memory_service.storage.forget import mark_forgotten, pending, purge
from memory_service.storage.journal import DONE, EXTRACTING, FAILED, LOST, QUEUED, FactPlan, Journal, NewFact
from memory_service.storage.keys import KeyStore


def save(
    journal: Journal,
    text: str,
    *,
    team: str = "a",
    agent: str = "bot",
    key: str | None = None,
    tags: list[str] | None = None,
    run_id: str | None = None,
    now: float | None = None,
):
    return journal.insert(
        team=team,
        agent_id=agent,
        text=text,
        run_id=run_id,
        tags=tags or [],
        metadata={"n": 1},
        idempotency_key=key,
        budget_s=20.0,
        now=now,
    )


def fact(text: str, fact_id: str) -> NewFact:
    from memory_service.contract.text import normalize
    from memory_service.extraction.grounding import shape

    norm = normalize(text)
    return NewFact(id=fact_id, text=text, norm=norm, shape=shape(norm), spans=[(0, len(text))])


def test_insert_is_durable_and_idempotent_per_team(journal: Journal) -> None:
    first, created = save(journal, "Order 1187 shipped to Porto", key="k-1")
    again, created_again = save(journal, "a different text, same key", key="k-1")
    other_team, created_other = save(journal, "team b uses the same key", team="b", key="k-1")
    assert created and not created_again and created_other
    assert again.id == first.id and again.text == "Order 1187 shipped to Porto"
    assert other_team.id != first.id
    got = journal.get("a", first.id)
    assert got is not None and got.status == QUEUED and got.metadata == {"n": 1}
    assert journal.get("b", first.id) is None  # another team's id does not exist for it


def test_concurrent_saves_of_one_key_store_one_row(journal: Journal) -> None:
    ids: list[str] = []
    barrier = threading.Barrier(8)

    def one() -> None:
        barrier.wait()
        ids.append(save(journal, "the same retry", key="retry-7")[0].id)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1 and journal.counts()[QUEUED] == 1


def test_backlog_is_exact_when_short_and_recounted_each_second_when_long(journal: Journal) -> None:
    """The work ahead of a save, which every save asks for: it must not cost a scan of a long queue."""
    from memory_service.storage.jobs import EXACT_BACKLOG, LONG_BACKLOG_REFRESH_S

    texts = [f"Crate {n} of the Puffin order left bay {n % 7}." for n in range(EXACT_BACKLOG + 50)]
    saved = [save(journal, t, now=1000.0 + n)[0] for n, t in enumerate(texts[:3])]
    assert journal.backlog() == (3, sum(len(t) for t in texts[:3]))
    assert journal.backlog(saved[1].created_at) == (2, len(texts[0]) + len(texts[1]))
    for n, text in enumerate(texts[3:], start=3):
        save(journal, text, now=1000.0 + n)
    counted_at = 5000.0
    whole = (len(texts), sum(len(t) for t in texts))
    assert journal.backlog(now=counted_at) == whole  # long: counted in full
    late = [save(journal, f"Late crate {n} for the Puffin order.", now=counted_at + 0.1)[0] for n in range(5)]
    # a save within the second has the whole counted queue ahead of it, without a recount
    assert journal.backlog(late[-1].created_at, now=counted_at + 0.5) == whole
    # an earlier save is still counted exactly; after the second, the count is made again
    assert journal.backlog(saved[1].created_at, now=counted_at + 0.5) == (2, len(texts[0]) + len(texts[1]))
    fresh = journal.backlog(late[-1].created_at, now=counted_at + LONG_BACKLOG_REFRESH_S + 0.1)
    assert fresh == (whole[0] + 5, whole[1] + sum(len(m.text) for m in late))


def test_claim_leases_a_job_to_one_worker_and_an_expired_lease_is_taken_over(journal: Journal) -> None:
    memory, _ = save(journal, "Lease me")
    now = time.time()
    job = journal.claim_next("w1", lease_s=30, now=now)
    assert job is not None and job.id == memory.id and job.lease_owner == "w1"
    assert journal.claim_next("w2", lease_s=30, now=now + 1) is None  # held
    assert journal.renew(memory.id, "w1", 30, now=now + 10)
    assert not journal.renew(memory.id, "w2", 30, now=now + 10)
    # w1 stops renewing (its process died): after the lease another worker takes the job over
    taken = journal.claim_next("w2", lease_s=30, now=now + 41)
    assert taken is not None and taken.id == memory.id and taken.lease_owner == "w2"
    # the first holder wakes up late: its result and its failure are refused, the job stays w2's
    assert not journal.complete(
        job, FactPlan(new=[fact("Lease me", "f-late")]), raw_reply=None, timings=None, report={}
    )
    assert (
        journal.fail_attempt(
            memory.id, error="late", raw_reply=None, timings=None, report=None, retry_at=None, budget_s=20, owner="w1"
        )
        == LOST
    )
    assert journal.get("a", memory.id).status == EXTRACTING
    assert journal.complete(taken, FactPlan(new=[fact("Lease me", "f-1")]), raw_reply="r", timings=None, report={})
    assert journal.get("a", memory.id).status == DONE
    assert [f.id for f in journal.facts_of_memory("a", memory.id)] == ["f-1"]
    attempts = journal.attempts_of(memory.id)
    assert [(a[0], a[3]) for a in attempts] == [("w1", "lease expired"), ("w2", "done")]
    assert attempts[0][2] <= attempts[1][1]  # the first ended (its lease) before the second began


def test_many_workers_claiming_at_once_never_share_a_job(journal: Journal) -> None:
    for n in range(40):
        save(journal, f"job {n}")
    claimed: list[tuple[str, str]] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        while (job := journal.claim_next(name, lease_s=60)) is not None:
            with lock:
                claimed.append((job.id, name))

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(claimed) == 40 and len({job_id for job_id, _ in claimed}) == 40


def test_recover_requeues_only_the_named_holders_jobs(journal: Journal) -> None:
    a, _ = save(journal, "held by process one")
    b, _ = save(journal, "held by process two")
    journal.claim_next("host:1:x:0", lease_s=60)
    journal.claim_next("host:2:y:0", lease_s=60)
    assert journal.recover(owner="host:1:x") == 1
    statuses = {m: journal.get("a", m).status for m in (a.id, b.id)}
    assert sorted(statuses.values()) == [EXTRACTING, QUEUED]
    assert journal.recover() == 1  # everything (a single process starting up)
    assert journal.counts()[QUEUED] == 2


def test_failed_attempts_retry_then_fail(journal: Journal) -> None:
    memory, _ = save(journal, "Flaky")
    job = journal.claim_next("w", lease_s=60)
    assert (
        journal.fail_attempt(
            job.id,
            error="BadReply",
            raw_reply="x",
            timings=None,
            report=None,
            retry_at=time.time() - 1,
            budget_s=20,
            owner="w",
        )
        == QUEUED
    )
    job = journal.claim_next("w", lease_s=60)
    assert job is not None and job.attempts == 1
    assert (
        journal.fail_attempt(
            job.id, error="BadReply", raw_reply="y", timings=None, report=None, retry_at=None, budget_s=20, owner="w"
        )
        == FAILED
    )
    assert journal.retry("b", memory.id, budget_s=20) is False  # not team b's
    assert journal.retry("a", memory.id, budget_s=20) is True


def test_facts_merge_and_supersede(journal: Journal) -> None:
    first, _ = save(journal, "Ana lives in Porto")
    second, _ = save(journal, "Ana lives in Lisbon now")
    third, _ = save(journal, "Ana lives in Lisbon")
    job = journal.claim_next("w", 60)
    assert journal.complete(
        job, FactPlan(new=[fact("Ana lives in Porto", "f-porto")]), raw_reply=None, timings=None, report={}
    )
    job = journal.claim_next("w", 60)
    assert journal.complete(
        job,
        FactPlan(new=[fact("Ana lives in Lisbon", "f-lisbon")], superseded=[("f-porto", "f-lisbon")]),
        raw_reply=None,
        timings=None,
        report={},
    )
    job = journal.claim_next("w", 60)
    assert journal.complete(job, FactPlan(merged=[("f-lisbon", [(0, 19)])]), raw_reply=None, timings=None, report={})
    facts = journal.facts_by_ids("a", ["f-porto", "f-lisbon"])
    assert facts["f-porto"].superseded_by == "f-lisbon" and facts["f-lisbon"].superseded_by is None
    assert [f.id for f in journal.active_facts_by_norm("a", facts["f-lisbon"].norm)] == ["f-lisbon"]
    assert journal.facts_by_ids("b", ["f-lisbon"]) == {}
    shown = journal.fact_recall_rows("a", ["f-porto", "f-lisbon", "f-none"])  # recall's rows: active ones only
    assert (
        list(shown) == ["f-lisbon"]
        and shown["f-lisbon"][0] == second.id
        and shown["f-lisbon"][4] == "Ana lives in Lisbon"
        and isinstance(shown["f-lisbon"][2], float)
    )
    assert journal.fact_recall_rows("b", ["f-lisbon"]) == {}
    sources = journal.fact_sources(["f-lisbon"])["f-lisbon"]
    assert {s[0] for s in sources} == {second.id, third.id}
    assert journal.counts()["facts"] == 1


def test_keyword_search_finds_a_text_the_moment_it_is_saved_with_filters_inside(journal: Journal) -> None:
    for n in range(30):
        save(journal, f"routine status update number {n} about the weekly report", agent="busy")
    rare, _ = save(journal, "Invoice INV-88123 was paid by Helga", agent="quiet", tags=["billing"])
    save(journal, "Invoice INV-88123 was paid", team="b")
    hits = journal.keyword_search("a", "who paid INV-88123", kinds={"passage"}, limit=5)
    assert hits and hits[0].memory_id == rare.id
    # the hit carries what recall shows of it, read with the match
    assert (hits[0].text, hits[0].agent_id, hits[0].tags, hits[0].created_at) == (
        rare.text,
        "quiet",
        ("billing",),
        rare.created_at,
    )
    assert (
        all(h.memory_id != rare.id for h in journal.keyword_search("b", "INV-88123", kinds={"passage"}, limit=5))
        and len(journal.keyword_search("b", "INV-88123", kinds={"passage"}, limit=5)) == 1
    )
    assert [
        h.memory_id for h in journal.keyword_search("a", "invoice paid", kinds={"passage"}, limit=5, agent_id="quiet")
    ] == [rare.id]
    assert journal.keyword_search("a", "invoice paid", kinds={"passage"}, limit=5, agent_id="busy") == []
    assert [
        h.memory_id for h in journal.keyword_search("a", "invoice", kinds={"passage"}, limit=5, tags=("billing",))
    ] == [rare.id]
    assert journal.keyword_search("a", "invoice", kinds={"passage"}, limit=5, tags=("other",)) == []
    assert journal.keyword_search("a", "invoice", kinds={"passage"}, limit=5, since=time.time() + 60) == []
    weekly = journal.keyword_search("a", "weekly report", kinds={"passage"}, limit=7)
    assert len(weekly) == 7 and rare.id not in {h.memory_id for h in weekly}


def test_a_query_word_no_text_holds_does_not_hide_the_texts_that_hold_the_others(journal: Journal, monkeypatch) -> None:
    """SQLite bounds the keyword leg by the rarest words (here: past 3 rows a word is common); a word that
    no text holds is the rarest of all, and must not leave a query of common words with nothing."""
    monkeypatch.setattr("memory_service.storage.keyword.KEYWORD_RARE_ROWS", 3)
    deploys = {save(journal, f"the checkout deploy for Tyrell finished in {n + 4} minutes")[0].id for n in range(6)}
    save(journal, "the checkout page was slow")
    hits = journal.keyword_search("a", "How long did the checkout deploy take for Tyrell?", kinds={"passage"}, limit=10)
    assert {h.memory_id for h in hits[:6]} == deploys  # (PostgreSQL, which ORs every word, also finds the 7th)
    # the absent word's count (0) may be cached: a text that holds it, saved now, is found by it at once
    assert journal.keyword_search("a", "ZX-4411 checkout deploy", kinds={"passage"}, limit=10)
    fresh, _ = save(journal, "ticket ZX-4411 closed")
    assert fresh.id in {
        h.memory_id for h in journal.keyword_search("a", "ZX-4411 checkout deploy", kinds={"passage"}, limit=10)
    }


def test_list_forget_and_export(journal: Journal) -> None:
    ids = [
        save(journal, f"memo {n}", agent="x" if n % 2 else "y", tags=["t"] if n < 3 else [], now=1_000_000.0 + n)[0].id
        for n in range(7)
    ]
    save(journal, "team b memo", team="b")
    page, cursor = list_memories(journal, "a", ListFilter(), limit=4)
    rest, end = list_memories(journal, "a", ListFilter(), limit=4, after=cursor)
    assert [i.memory.id for i in page + rest] == ids[::-1] and end is None
    assert [i.memory.id for i in list_memories(journal, "a", ListFilter(tag="t"), limit=10)[0]] == ids[2::-1]
    assert facets(journal, "a").memories == 7 and facets(journal, "a").tags == [("t", 3)]
    job = journal.claim_next("w", 60)
    journal.complete(job, FactPlan(new=[fact("memo 0", "f-0")]), raw_reply=None, timings=None, report={})
    assert mark_forgotten(journal, "b", memory_ids=[ids[0]]) == []  # another team's id: nothing
    assert mark_forgotten(journal, "a", memory_ids=[ids[0]]) == [ids[0]]
    assert journal.get("a", ids[0]) is None and journal.existing_facts(["f-0"]) == set()
    assert journal.keyword_search("a", "memo", kinds={"passage", "fact"}, limit=20) and ids[0] not in {
        h.memory_id for h in journal.keyword_search("a", "memo", kinds={"passage", "fact"}, limit=20)
    }
    todo = pending(journal)
    assert todo.facts == {"a": ["f-0"]} and [m for m, _ in todo.memories["a"]] == [ids[0]]
    purge(journal, todo)
    assert not pending(journal)
    assert len(mark_forgotten(journal, "a", agent_id="x")) == 3
    exported = list(export_records(journal, "a"))
    assert [r["id"] for r in exported] == [ids[n] for n in (2, 4, 6)]
    assert all(r["metadata"] == {"n": 1} for r in exported)


def test_api_keys_work_across_store_instances(database: Database, tmp_path: Path) -> None:
    store = KeyStore(database)
    created = store.create("team-a", "write", agent_id="bot", label="ci")
    assert store.lookup(created.key).role == "write" and store.lookup(created.key + "x") is None
    other = KeyStore(database)  # another process's view of the same database
    assert other.lookup(created.key).team == "team-a"
    store.revoke(created.info.id, keyless=True)  # the only key: keyless mode is chosen
    deadline = time.monotonic() + 3
    while other.lookup(created.key) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert other.lookup(created.key) is None


@pytest.mark.process  # its own PostgreSQL cluster, stopped under a serve subprocess
def test_postgres_down_is_a_503_and_the_service_recovers_when_it_is_back(tmp_path: Path) -> None:
    """Never a 500 and nothing half-written: while PostgreSQL is down every route that needs it says so."""
    from memory_service.testbed.postgres import PostgresCluster
    from memory_service.testbed.service_runner import ServiceRunner

    cluster = PostgresCluster(tmp_path / "pg").start()
    service = None
    try:
        url = cluster.create_database()
        service = ServiceRunner(
            tmp_path / "data", api_keys={"ka": "team-a"}, llm_url="http://127.0.0.1:9", env={"MEMORY_DATABASE_URL": url}
        ).start()
        client = service.client("ka")
        saved = client.post("/v1/remember", json={"agent_id": "bot", "text": "Kept before the outage"})
        assert saved.status_code == 202, saved.text
        cluster.stop()
        for response in (
            client.post("/v1/remember", json={"agent_id": "bot", "text": "during the outage"}),
            client.post("/v1/recall", json={"query": "outage"}),
            client.get(f"/v1/memories/{saved.json()['id']}"),
        ):
            assert response.status_code == 503, response.text
            assert response.headers["Retry-After"] == "1" and "storage unavailable" in response.json()["detail"]
        cluster.start()
        deadline = time.monotonic() + 30
        while (
            got := client.get(f"/v1/memories/{saved.json()['id']}")
        ).status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert got.status_code == 200 and got.json()["text"] == "Kept before the outage"
        assert client.post("/v1/remember", json={"agent_id": "bot", "text": "after the outage"}).status_code == 202
    finally:
        if service is not None:
            service.stop()
        cluster.remove()


def test_a_job_whose_process_keeps_dying_ends_failed_not_in_a_loop(journal: Journal) -> None:
    memory, _ = save(journal, "the text that crashes its extractor")
    now = time.time()
    for n in range(3):  # each holder dies (never renews); the next one takes the job over
        job = journal.claim_next(f"w{n}", lease_s=10, now=now + 20 * n, max_attempts=3)
        assert job is not None and job.id == memory.id and job.attempts == n
    assert journal.claim_next("w3", lease_s=10, now=now + 60, max_attempts=3) is None
    failed = journal.get("a", memory.id)
    assert failed.status == FAILED and failed.attempts == 3 and "stopped 3 times" in failed.last_error
    assert [a[3] for a in journal.attempts_of(memory.id)] == ["lease expired"] * 3


def test_an_index_bookkeeping_write_skips_the_sync_and_the_next_save_syncs_again(journal: Journal) -> None:
    """`durable=False` (marking a text's vector written) commits without waiting for the disk; the saves
    around it, on the same write connection, still commit synced, even when that write failed."""
    first, _ = save(journal, "Invoice 88 paid")
    journal.mark_indexed([first.id])
    try:
        with journal.transaction(durable=False) as conn:
            conn.execute("UPDATE memories SET indexed = 1 WHERE id = ?", (first.id,))
            raise RuntimeError("the write fails half way")
    except RuntimeError:
        pass
    second, _ = save(journal, "Invoice 89 paid")
    assert [m.text for m in journal.unindexed(10)] == ["Invoice 89 paid"]  # the relaxed write is visible at once
    db = journal.db
    if db.dialect == "sqlite":
        assert db.writer().execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL again for the next save
    else:  # PostgreSQL: SET LOCAL ended with its transaction
        with db.reading() as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"
    assert journal.get("a", second.id) is not None
