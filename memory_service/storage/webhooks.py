"""Webhook subscriptions and their outbox, in the journal (tables in `schema.WEBHOOK_TABLES`).

An event is written as one outbox row per matching subscription by `enqueue`, called inside the
transaction of the event's own write (a job marked done or failed): the notice commits with the event or
not at all, and survives any restart. The delivery loop (pipeline/webhooks.py) claims due rows with a lease
(`next_attempt_at` moved ahead, so a process that dies mid-delivery hands the row back when it runs out),
and marks each delivered (the row goes; the subscription counts it), due again later, or failed for good.
Every row is keyed by team: a subscription only ever gets its own team's events.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from .database import Database
from .records import FactPlan, Memory

EVENTS = ("memory.extracted", "memory.failed", "limit.exhausted")
MAX_FAILING_SHOWN = 50  # subscriptions /ready lists as failing (the operator's view spans every team)
PENDING, FAILED = "pending", "failed"
MAX_SUBSCRIPTIONS = 10  # per team: each event costs one row and one POST per subscription
KEEP_FAILED_S = 7 * 86400.0  # rows given up on stay this long for the operator to see, then go


class TooManySubscriptions(ValueError):
    """The team has `MAX_SUBSCRIPTIONS` already."""


@dataclass(frozen=True)
class Subscription:
    id: str
    team: str
    url: str
    events: tuple[str, ...]
    created_at: float
    delivered: int = 0
    failed: int = 0
    last_delivery_at: float | None = None
    last_failure_at: float | None = None
    last_error: str | None = None
    pending: int = 0

    @property
    def failing(self) -> bool:
        """Its last attempt failed (an error answer, a timeout, a refused address): the receiver needs a look."""
        return self.last_failure_at is not None and (
            self.last_delivery_at is None or self.last_failure_at > self.last_delivery_at
        )

    @classmethod
    def from_row(cls, row: Any, pending: int = 0) -> Subscription:
        return cls(
            id=row["id"],
            team=row["team"],
            url=row["url"],
            events=tuple(json.loads(row["events"])),
            created_at=float(row["created_at"]),
            delivered=int(row["delivered"]),
            failed=int(row["failed"]),
            last_delivery_at=row["last_delivery_at"],
            last_failure_at=row["last_failure_at"],
            last_error=row["last_error"],
            pending=pending,
        )


@dataclass(frozen=True)
class Delivery:
    """One claimed outbox row with what it takes to send it."""

    event_id: str
    subscription_id: str
    team: str
    event: str
    payload: dict[str, Any]
    created_at: float
    attempts: int
    url: str
    secret: str


def enqueue(
    conn: Any, team: str, event: str, payload: dict[str, Any], now: float | None = None, event_id: str | None = None
) -> str:
    """One outbox row per subscription of `team` to `event`, on the caller's transaction; the event's id
    (`event_id` when given: an event handed on again keeps its id, and its rows are not doubled).

    With no subscription it writes nothing (one index probe), so an event costs a team without webhooks
    nothing more."""
    now = time.time() if now is None else now
    event_id = event_id or "evt_" + uuid.uuid4().hex
    conn.execute(
        "INSERT INTO webhook_outbox (event_id, subscription_id, team, event, payload, created_at, next_attempt_at) "
        "SELECT ?, id, team, ?, ?, ?, ? FROM webhook_subscriptions WHERE team = ? AND events LIKE ? "
        "ON CONFLICT DO NOTHING",
        (event_id, event, json.dumps(payload), now, now, team, f'%"{event}"%'),
    )
    return event_id


def notify_extracted(conn: Any, memory: Memory, plan: FactPlan, now: float) -> None:
    """`memory.extracted` for a job stored with `plan`: the facts it added and those it now also supports."""
    fact_ids = [f.id for f in plan.new] + [fact_id for fact_id, _ in plan.merged]
    payload = {"memory_id": memory.id, "agent_id": memory.agent_id, "facts": len(fact_ids), "fact_ids": fact_ids}
    enqueue(conn, memory.team, "memory.extracted", payload, now)


class WebhookStore:
    """Subscriptions (the admin routes) and the outbox (the delivery loop) on the journal's database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def subscribe(self, team: str, url: str, events: list[str], now: float | None = None) -> tuple[Subscription, str]:
        """A new subscription and its signing secret (stored to sign with; shown to the caller once)."""
        now = time.time() if now is None else now
        secret = "whsec_" + secrets.token_hex(32)
        sub_id = "wh_" + uuid.uuid4().hex[:20]
        wanted = [e for e in EVENTS if e in events]
        with self.db.transaction() as conn:
            if self.db.dialect == "postgresql":  # count and insert as one step across processes
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(?))", ("webhooks:" + team,))
            count = conn.execute("SELECT COUNT(*) FROM webhook_subscriptions WHERE team = ?", (team,)).fetchone()[0]
            if count >= MAX_SUBSCRIPTIONS:
                raise TooManySubscriptions(
                    f"this team has {count} webhook subscriptions, the most allowed ({MAX_SUBSCRIPTIONS}); "
                    "delete one first"
                )
            conn.execute(
                "INSERT INTO webhook_subscriptions (id, team, url, events, secret, created_at) VALUES (?,?,?,?,?,?)",
                (sub_id, team, url, json.dumps(wanted), secret, now),
            )
            row = conn.execute("SELECT * FROM webhook_subscriptions WHERE id = ?", (sub_id,)).fetchone()
        return Subscription.from_row(row), secret

    def subscriptions(self, team: str | None = None) -> list[Subscription]:
        """The team's subscriptions (every team's for None), oldest first, each with its pending count."""
        where, args = ("WHERE s.team = ?", (team,)) if team is not None else ("", ())
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT s.*, (SELECT COUNT(*) FROM webhook_outbox o WHERE o.subscription_id = s.id "
                f"AND o.status = '{PENDING}') AS pending FROM webhook_subscriptions s {where} "
                "ORDER BY s.created_at, s.id",
                args,
            ).fetchall()
        return [Subscription.from_row(r, int(r["pending"])) for r in rows]

    def unsubscribe(self, team: str, sub_id: str) -> bool:
        """Delete the team's subscription and its undelivered events; False if the team has none such."""
        with self.db.transaction() as conn:
            gone = conn.execute("DELETE FROM webhook_subscriptions WHERE id = ? AND team = ?", (sub_id, team)).rowcount
            if gone:
                conn.execute("DELETE FROM webhook_outbox WHERE subscription_id = ?", (sub_id,))
        return bool(gone)

    def hand_on(self, events: list[tuple[str, str, dict[str, Any], float]], event: str) -> None:
        """Write events recorded elsewhere (the limits store's `limit.exhausted`) to the outbox, in one commit."""
        with self.db.transaction() as conn:
            for event_id, team, payload, at in events:
                enqueue(conn, team, event, payload, at, event_id=event_id)

    def due(self, busy: Collection[str] = (), now: float | None = None) -> tuple[list[str], float | None]:
        """The subscriptions with a row due now, leaving out `busy` (those this process is sending already),
        and the seconds until a row of any other subscription comes due (None with none pending): the caller
        starts a sender for each of the first, so it waits for the second.

        One index probe per subscription (`webhook_outbox_subscription_due`), however many rows one of them
        has piled up: a receiver that never answers does not make the idle loop slower for the others."""
        now = time.time() if now is None else now
        with self.db.reading() as conn:  # the idle loop asks every second: no write lock while nothing is due
            rows = conn.execute(
                "SELECT s.id, (SELECT MIN(o.next_attempt_at) FROM webhook_outbox o WHERE o.subscription_id = s.id "
                "AND o.status = ?) AS next_at FROM webhook_subscriptions s",
                (PENDING,),
            ).fetchall()
        waiting = [(r[0], float(r[1])) for r in rows if r[1] is not None and r[0] not in busy]
        due = [sub_id for sub_id, at in waiting if at <= now]
        later = [at - now for _, at in waiting if at > now]
        return due, min(later, default=None)

    def claim(
        self, limit: int, lease_s: float, now: float | None = None, subscription_id: str | None = None
    ) -> list[Delivery]:
        """Up to `limit` due rows (of one subscription, when given), leased for `lease_s`: no other loop takes
        them until then."""
        now = time.time() if now is None else now
        lock = " FOR UPDATE OF o SKIP LOCKED" if self.db.dialect == "postgresql" else ""
        only, args = (" AND o.subscription_id = ?", (subscription_id,)) if subscription_id is not None else ("", ())
        with self.db.reading() as conn:  # the idle loop asks every second: no write lock while nothing is due
            due = conn.execute(
                f"SELECT 1 FROM webhook_outbox o WHERE o.status = ? AND o.next_attempt_at <= ?{only} LIMIT 1",
                (PENDING, now, *args),
            ).fetchone()
        if due is None:
            return []
        with self.db.transaction() as conn:
            rows = conn.execute(
                "SELECT o.*, s.url, s.secret FROM webhook_outbox o JOIN webhook_subscriptions s "
                f"ON s.id = o.subscription_id WHERE o.status = ? AND o.next_attempt_at <= ?{only} "
                f"ORDER BY o.next_attempt_at LIMIT ?{lock}",
                (PENDING, now, *args, limit),
            ).fetchall()
            conn.executemany(
                "UPDATE webhook_outbox SET next_attempt_at = ? WHERE event_id = ? AND subscription_id = ?",
                [(now + lease_s, r["event_id"], r["subscription_id"]) for r in rows],
            )
        return [
            Delivery(
                event_id=r["event_id"],
                subscription_id=r["subscription_id"],
                team=r["team"],
                event=r["event"],
                payload=json.loads(r["payload"]),
                created_at=float(r["created_at"]),
                attempts=int(r["attempts"]),
                url=r["url"],
                secret=r["secret"],
            )
            for r in rows
        ]

    def delivered(self, delivery: Delivery, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self.db.transaction() as conn:
            conn.execute(
                "DELETE FROM webhook_outbox WHERE event_id = ? AND subscription_id = ?",
                (delivery.event_id, delivery.subscription_id),
            )
            conn.execute(
                "UPDATE webhook_subscriptions SET delivered = delivered + 1, last_delivery_at = ? WHERE id = ?",
                (now, delivery.subscription_id),
            )

    def attempt_failed(self, delivery: Delivery, error: str, retry_at: float | None, now: float | None = None) -> None:
        """Record a failed attempt: due again at `retry_at`, or failed for good when it is None."""
        now = time.time() if now is None else now
        error = error[:500]
        with self.db.transaction() as conn:
            conn.execute(
                "UPDATE webhook_outbox SET attempts = attempts + 1, last_error = ?, status = ?, next_attempt_at = ? "
                "WHERE event_id = ? AND subscription_id = ?",
                (
                    error,
                    PENDING if retry_at is not None else FAILED,
                    retry_at if retry_at is not None else now,
                    delivery.event_id,
                    delivery.subscription_id,
                ),
            )
            given_up = 1 if retry_at is None else 0
            conn.execute(
                "UPDATE webhook_subscriptions SET failed = failed + ?, last_failure_at = ?, last_error = ? WHERE id = ?",
                (given_up, now, error, delivery.subscription_id),
            )

    def prune(self, now: float | None = None) -> int:
        """Drop the rows given up on more than `KEEP_FAILED_S` ago."""
        now = time.time() if now is None else now
        with self.db.transaction(durable=False) as conn:
            return conn.execute(
                "DELETE FROM webhook_outbox WHERE status = ? AND next_attempt_at < ?", (FAILED, now - KEEP_FAILED_S)
            ).rowcount

    def status(self, team: str | None = None) -> dict[str, Any]:
        """What /ready shows: outbox rows pending and failed, deliveries, the last one, and the subscriptions
        whose last attempt failed, with why (the team's, or all)."""
        where, args = (" AND team = ?", (team,)) if team is not None else ("", ())
        with self.db.reading() as conn:
            counts = dict(
                conn.execute(
                    f"SELECT status, COUNT(*) FROM webhook_outbox WHERE 1 = 1{where} GROUP BY status", args
                ).fetchall()
            )
            subs = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(delivered), 0), COALESCE(SUM(failed), 0), MAX(last_delivery_at), "
                f"MAX(last_failure_at) FROM webhook_subscriptions WHERE 1 = 1{where}",
                args,
            ).fetchone()
            failing = conn.execute(
                "SELECT id, last_error, last_failure_at, (SELECT COUNT(*) FROM webhook_outbox o "
                f"WHERE o.subscription_id = s.id AND o.status = '{PENDING}') AS pending FROM webhook_subscriptions s "
                f"WHERE last_failure_at > COALESCE(last_delivery_at, 0){where} ORDER BY last_failure_at DESC LIMIT ?",
                (*args, MAX_FAILING_SHOWN),
            ).fetchall()
        return {
            "subscriptions": int(subs[0]),
            "failing": [
                {"id": r[0], "last_error": r[1], "last_failure_at": r[2], "pending": int(r[3])} for r in failing
            ],
            "pending": int(counts.get(PENDING, 0)),
            "delivered": int(subs[1]),
            "failed": int(subs[2]),
            "last_delivery_at": subs[3],
            "last_failure_at": subs[4],
        }
