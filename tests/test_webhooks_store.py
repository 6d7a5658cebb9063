"""The webhook outbox's storage contract, on SQLite and PostgreSQL alike: an event's rows commit with the
event or not at all, go to its team's subscriptions only, are leased to one sender at a time, and an old
journal is upgraded to hold them."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from test_schema_upgrade import OLD_SQLITE_JOURNAL
from test_storage_contract import fact, save

from memory_service.storage.journal import FactPlan, Journal
from memory_service.storage.limits import LimitStore
from memory_service.storage.webhooks import FAILED, WebhookStore, enqueue


@pytest.fixture
def hooks(journal: Journal) -> WebhookStore:
    return WebhookStore(journal.db)


def _outbox(journal: Journal) -> list[tuple[str, str, str]]:
    with journal.reading() as conn:
        rows = conn.execute("SELECT subscription_id, team, event FROM webhook_outbox ORDER BY event").fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def test_an_event_writes_one_row_per_subscription_of_its_team_and_event(journal: Journal, hooks) -> None:
    extracted, _ = hooks.subscribe("a", "https://a.example/1", ["memory.extracted"])
    both, _ = hooks.subscribe("a", "https://a.example/2", ["memory.extracted", "memory.failed"])
    hooks.subscribe("b", "https://b.example/", ["memory.extracted", "memory.failed"])  # another team
    done, _ = save(journal, "Done soon")
    failing, _ = save(journal, "Fails for good")
    job = journal.claim_next("w", now=time.time())
    assert job is not None and job.id == done.id
    assert journal.complete(job, FactPlan(new=[fact("Done soon", "f-1")]), raw_reply=None, timings=None, report={})
    journal.fail_attempt(failing.id, error="bad", raw_reply=None, timings=None, report=None, retry_at=None, budget_s=9)
    assert sorted(_outbox(journal)) == sorted(
        [(extracted.id, "a", "memory.extracted"), (both.id, "a", "memory.extracted"), (both.id, "a", "memory.failed")]
    )
    claimed = {(d.subscription_id, d.event): d for d in hooks.claim(10, lease_s=30)}
    assert claimed[(both.id, "memory.extracted")].payload == {
        "memory_id": done.id,
        "agent_id": done.agent_id,
        "facts": 1,
        "fact_ids": ["f-1"],
    }
    failed = claimed[(both.id, "memory.failed")]
    assert failed.payload["memory_id"] == failing.id and failed.payload["error"] == "bad"
    # one event, one id for every subscription: what a receiver dedups on
    assert claimed[(both.id, "memory.extracted")].event_id == claimed[(extracted.id, "memory.extracted")].event_id


def test_a_retried_failure_sends_nothing_and_a_rolled_back_event_leaves_no_row(journal: Journal, hooks) -> None:
    hooks.subscribe("a", "https://a.example/", ["memory.failed", "memory.extracted"])
    memory, _ = save(journal, "Retry later")
    retry_at = time.time() + 60
    journal.fail_attempt(
        memory.id, error="busy", raw_reply=None, timings=None, report=None, retry_at=retry_at, budget_s=9
    )
    assert _outbox(journal) == []  # not failed for good: no event
    with pytest.raises(RuntimeError), journal.transaction() as conn:
        enqueue(conn, "a", "memory.extracted", {"memory_id": memory.id})
        raise RuntimeError("the event's own write failed")
    assert _outbox(journal) == []


def test_a_claimed_row_is_leased_then_delivered_retried_or_failed(journal: Journal, hooks) -> None:
    sub, _ = hooks.subscribe("a", "https://a.example/", ["memory.extracted"])
    now = time.time()
    with journal.transaction() as conn:
        for n in range(3):
            enqueue(conn, "a", "memory.extracted", {"n": n}, now)
    first = hooks.claim(10, lease_s=30, now=now)
    assert len(first) == 3 and hooks.claim(10, lease_s=30, now=now + 1) == []  # leased: no second sender
    retaken = hooks.claim(10, lease_s=30, now=now + 31)  # the sender died: its lease ran out
    assert sorted(d.event_id for d in retaken) == sorted(d.event_id for d in first)
    delivered, retried, given_up = retaken
    hooks.delivered(delivered, now=now + 32)
    hooks.attempt_failed(retried, "HTTP 500", retry_at=now + 40, now=now + 32)
    hooks.attempt_failed(given_up, "HTTP 500", retry_at=None, now=now + 32)
    assert hooks.due(now=now + 35) == ([], pytest.approx(5))
    again = hooks.claim(10, lease_s=30, now=now + 41)
    assert [d.event_id for d in again] == [retried.event_id] and again[0].attempts == 1
    status = hooks.status("a")
    assert (status["pending"], status["delivered"], status["failed"]) == (1, 1, 1)
    assert status["last_delivery_at"] == pytest.approx(now + 32)
    assert hooks.status("b")["pending"] == 0 and hooks.subscriptions("b") == []
    listed = hooks.subscriptions("a")[0]
    assert (listed.id, listed.delivered, listed.failed, listed.pending) == (sub.id, 1, 1, 1)
    with journal.reading() as conn:
        assert (
            conn.execute("SELECT status FROM webhook_outbox WHERE event_id = ?", (given_up.event_id,)).fetchone()[0]
            == FAILED
        )
    assert hooks.unsubscribe("a", sub.id) and _outbox(journal) == []  # its events go with it
    assert not hooks.unsubscribe("a", sub.id)


def test_an_exhausted_limit_is_recorded_with_its_consume_and_handed_on_once(journal: Journal, hooks, database) -> None:
    sub, _ = hooks.subscribe("a", "https://a.example/", ["limit.exhausted"])
    limits = LimitStore(database)
    limits.set_limit("a", "mails", 2, "UTC", "team")
    assert [limits.consume("a", "mails", "x").allowed for _ in range(3)] == [True, True, False]
    events = limits.limit_events()
    assert len(events) == 1 and events[0][1] == "a" and events[0][2]["name"] == "mails"
    hooks.hand_on(events, "limit.exhausted")
    hooks.hand_on(events, "limit.exhausted")  # a crash before the drop hands it on again: no second row
    assert _outbox(journal) == [(sub.id, "a", "limit.exhausted")]
    limits.drop_limit_events([events[0][0]])
    assert limits.limit_events() == []


def test_an_old_journal_is_upgraded_with_the_webhook_tables(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(OLD_SQLITE_JOURNAL)
    conn.close()
    journal = Journal(path)
    try:
        sub, secret = WebhookStore(journal.db).subscribe("a", "https://a.example/", ["memory.failed"])
        assert secret.startswith("whsec_") and WebhookStore(journal.db).subscriptions("a")[0].id == sub.id
    finally:
        journal.close()


def test_each_subscription_is_claimed_on_its_own_and_a_busy_one_is_left_out(journal: Journal, hooks) -> None:
    """A sender per subscription (pipeline/webhooks.py): `due` names the subscriptions with a row due, less those
    this process is sending already, and `claim` takes one subscription's rows only, so a stuck receiver's pile
    never fills another's batch."""
    stuck, _ = hooks.subscribe("a", "https://a.example/stuck", ["memory.extracted"])
    quiet, _ = hooks.subscribe("b", "https://b.example/", ["memory.extracted"])
    now = time.time()
    with journal.transaction() as conn:
        for n in range(20):
            enqueue(conn, "a", "memory.extracted", {"n": n}, now)
        enqueue(conn, "b", "memory.extracted", {"n": 0}, now + 3)
    assert hooks.due(now=now) == ([stuck.id], pytest.approx(3))
    assert hooks.due({stuck.id}, now=now) == ([], pytest.approx(3))  # a's sender is busy: b's row is next
    assert sorted(hooks.due(now=now + 3)[0]) == sorted([stuck.id, quiet.id])
    mine = hooks.claim(8, lease_s=30, now=now + 3, subscription_id=quiet.id)
    assert [(d.subscription_id, d.team) for d in mine] == [(quiet.id, "b")]
    theirs = hooks.claim(8, lease_s=30, now=now + 3, subscription_id=stuck.id)
    assert len(theirs) == 8 and {d.subscription_id for d in theirs} == {stuck.id}
    # a failed attempt shows the subscription failing, with why, to its own team only
    hooks.attempt_failed(theirs[0], "no whole answer within 5 s", retry_at=now + 60, now=now + 4)
    failing = hooks.status("a")["failing"]
    assert [(f["id"], f["last_error"], f["pending"]) for f in failing] == [(stuck.id, "no whole answer within 5 s", 20)]
    assert hooks.status("b")["failing"] == [] and [f["id"] for f in hooks.status()["failing"]] == [stuck.id]
    hooks.delivered(theirs[1], now=now + 5)  # a later delivery: no longer failing
    assert hooks.status("a")["failing"] == []
