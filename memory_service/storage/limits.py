"""Daily-limit counters and the handled-item ledger, in SQLite or PostgreSQL.

Agents ask two questions before acting: "may I do this once more today?"
(`consume`) and "have I already dealt with this item?" (`mark_handled`). Both
must be answered atomically, so each answer is one write transaction whose
writes are `INSERT ... ON CONFLICT DO UPDATE ... RETURNING` upserts: the same
statements run on SQLite (under its database lock) and on PostgreSQL (under
the row lock of the upsert, so several API processes count as one).

Durability on SQLite: WAL with `synchronous=NORMAL` (the default here). A committed
consume survives a crash of the service process; only an OS crash or power
loss can lose the last few commits (the database stays consistent; it just
reopens at an earlier commit). `synchronous=FULL` adds an fsync per commit,
held under the writer lock, which caps consume throughput at the disk's fsync
rate (measured on a 2-core VM: ~40 us per consume with NORMAL, ~290 us
with FULL; over HTTP FULL was ~15% slower and would be far slower on a disk
with millisecond fsyncs). Pass `synchronous="FULL"` when losing the last
moments of counts on power loss is not acceptable.

Every row is keyed by team first: a team can never read or change another
team's rows, whatever names it uses.
"""

from __future__ import annotations

import json
import math
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo

from ..contract.limit_rules import (
    MAX_DAILY_LIMIT,
    MAX_HISTORY_DAYS,
    MAX_IDEMPOTENCY_KEY_LEN,
    IdempotencyConflict,
    InvalidInput,
    check_agent_id,
    check_int,
    check_name,
    check_text,
    check_timezone,
)
from .database import Conn, Database, SqliteDatabase, StorageClosed
from .gate import RESERVATION_RETENTION, Gate
from .handled import HandledLedger
from .limit_days import local_day, next_midnight, to_us, utc_now
from .limit_schema import CONSUME, POSTGRES_SCHEMA, SCHEMA, UPSERT_LIMIT, upgrade
from .limit_views import TEAM_SCOPE, ConsumeResult, LimitView, ViewQuery, not_found, read_view

__all__ = ["LimitStore", "Per"]

# Idempotency answers are only replayed on the same local day; keep them a bit
# longer than any day can last, then purge.
IDEMPOTENCY_RETENTION = timedelta(days=3)
PURGE_EVERY = timedelta(hours=1)

Per = Literal["team", "agent"]


class LimitStore(HandledLedger, Gate):
    """Limits and the handled ledger on a `Database` (SQLite file or PostgreSQL); safe to share between threads.

    Every check-and-count is one statement inside one transaction, so it stays atomic with several
    threads (SQLite: one writer at a time) or several processes (PostgreSQL: the row lock of the upsert).
    """

    def __init__(
        self,
        store: Path | str | Database,
        now: Callable[[], datetime] | None = None,
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
    ) -> None:
        """Open (or create) the tables in `store`: a SQLite path, or a shared `Database` (not closed here).

        `now` is the clock, returning an aware datetime (tests inject one to
        cross midnights and DST changes); `synchronous` is explained in the
        module docstring.
        """
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError("synchronous must be NORMAL or FULL")
        self._now_fn = now or utc_now
        self._purge_lock = threading.Lock()
        self._zones: dict[str, ZoneInfo] = {}
        self._last_purge_us = 0
        self._owns = not isinstance(store, Database)
        self.db: Database = (
            store if isinstance(store, Database) else SqliteDatabase(Path(store), synchronous=synchronous)
        )
        self.db.create_schema(SCHEMA, POSTGRES_SCHEMA)
        upgrade(self.db)
        self._closed = False

    # ------------------------------------------------------------ plumbing

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._owns:
                self.db.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosed("limit store is closed")

    def _now(self) -> datetime:
        moment = self._now_fn()
        if moment.tzinfo is None:
            raise ValueError("the clock must return an aware datetime")
        return moment.astimezone(UTC)

    def _zone(self, name: str) -> ZoneInfo:
        zone = self._zones.get(name)
        if zone is None:
            zone = self._zones[name] = check_timezone(name)
        return zone

    def _write(self) -> Any:
        self._check_open()
        return self.db.transaction()

    def _read(self) -> Any:
        self._check_open()
        return self.db.reading()

    # ------------------------------------------------------------ limits

    def set_limit(self, team: str, name: str, daily_limit: int, tz: str, per: Per) -> tuple[LimitView, bool]:
        """Create or change a limit; returns (view, created).

        Counters are kept: lowering the limit below today's usage denies
        further consumes until the reset. Changing `timezone` or `per` starts
        counting in new day/agent buckets.
        """
        check_name(name)
        check_int(daily_limit, "daily_limit", 0, MAX_DAILY_LIMIT)
        self._zone(tz)
        if per not in ("team", "agent"):
            raise InvalidInput("per must be 'team' or 'agent'")
        now_us = to_us(self._now())
        with self._write() as db:
            existed = db.execute("SELECT 1 FROM limit_defs WHERE team = ? AND name = ?", (team, name)).fetchone()
            db.execute(UPSERT_LIMIT, (team, name, daily_limit, tz, per, now_us, now_us))
            view = self._view(db, ViewQuery(team, name, None, None))
        return view, existed is None

    def get_limit(self, team: str, name: str, agent_id: str | None = None, days: int | None = None) -> LimitView:
        check_name(name)
        if agent_id is not None:
            check_agent_id(agent_id)
        if days is not None:
            check_int(days, "days", 1, MAX_HISTORY_DAYS)
        with self._read() as db:
            return self._view(db, ViewQuery(team, name, agent_id, days))

    def list_limits(self, team: str, agent_id: str | None = None) -> list[LimitView]:
        if agent_id is not None:
            check_agent_id(agent_id)
        with self._read() as db:
            names = [r[0] for r in db.execute("SELECT name FROM limit_defs WHERE team = ? ORDER BY name", (team,))]
            return [self._view(db, ViewQuery(team, n, agent_id, None, with_agents=False)) for n in names]

    def delete_limit(self, team: str, name: str) -> None:
        """Remove a limit with its counters and idempotency records."""
        check_name(name)
        with self._write() as db:
            if db.execute("DELETE FROM limit_defs WHERE team = ? AND name = ?", (team, name)).rowcount == 0:
                raise not_found(name)
            db.execute("DELETE FROM limit_usage WHERE team = ? AND name = ?", (team, name))
            db.execute("DELETE FROM limit_idempotency WHERE team = ? AND name = ?", (team, name))

    def _view(self, db: Conn, query: ViewQuery) -> LimitView:
        row = db.execute(
            "SELECT daily_limit, timezone, per, created_us, updated_us FROM limit_defs WHERE team = ? AND name = ?",
            (query.team, query.name),
        ).fetchone()
        if row is None:
            raise not_found(query.name)
        zone = self._zone(row[1])
        return read_view(db, query, tuple(row), local_day(self._now(), zone), zone)

    # ------------------------------------------------------------ consume

    def consume(
        self, team: str, name: str, agent_id: str, amount: int = 1, idempotency_key: str | None = None
    ) -> ConsumeResult:
        """Check and count in one transaction; a denial changes nothing.

        With an idempotency key, the first allowed answer of the local day is
        recorded and replayed for repeats (counted once). Denials are not
        recorded, so a denied request may be retried with the same key.
        """
        check_name(name)
        check_agent_id(agent_id)
        check_int(amount, "amount", 1, MAX_DAILY_LIMIT)
        if idempotency_key is not None:
            check_text(idempotency_key, "idempotency_key", MAX_IDEMPOTENCY_KEY_LEN)
        now = self._now()
        self._maybe_purge(now)
        with self._write() as db:
            if idempotency_key is not None and self.db.dialect == "postgresql":
                # two processes replaying one key at once: the second waits, then finds the first's answer
                db.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", (f"{team}\x1f{name}\x1f{idempotency_key}",)
                )
            today = self._today(db, team, name, now)
            if idempotency_key is not None:
                replay = _replay(db, (team, name, today.day, idempotency_key), agent_id, amount)
                if replay is not None:
                    return ConsumeResult(**replay, retry_after_s=today.retry_after_s, replayed=True)
            result, _ = self._count(db, today, agent_id, amount, now)
            if idempotency_key is not None and result.allowed:
                db.execute(
                    "INSERT INTO limit_idempotency (team, name, day, idem_key, agent_id, amount, response,"
                    " created_us) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (team, name, today.day, idempotency_key, agent_id, amount, json.dumps(result.body()), to_us(now)),
                )
            return result

    def _today(self, db: Conn, team: str, name: str, now: datetime) -> Today:
        """The limit's definition and its local day at `now`; LimitNotFound if the team has no such limit."""
        row = db.execute(
            "SELECT daily_limit, timezone, per FROM limit_defs WHERE team = ? AND name = ?", (team, name)
        ).fetchone()
        if row is None:
            raise not_found(name)
        daily_limit, tz, per = row
        zone = self._zone(tz)
        today = local_day(now, zone)
        resets = next_midnight(today, zone)
        retry_after = max(1, math.ceil((resets - now).total_seconds()))
        return Today(team, name, daily_limit, per, today.isoformat(), resets.isoformat(), retry_after)

    def _count(
        self, db: Conn, today: Today, agent_id: str | None, amount: int, now: datetime
    ) -> tuple[ConsumeResult, str]:
        """Add `amount` to today's counter inside the caller's transaction if it stays within the limit; also
        the counter's agent column (a release refunds that row). A denial changes nothing. `agent_id` may be
        None only for a per-team limit (the gate's call with no agent)."""
        team, name, daily_limit, day = today.team, today.name, today.daily_limit, today.day
        if today.per == "agent" and agent_id is None:
            raise InvalidInput(f"the limit {name!r} counts per agent: give the agent_id whose counter to use")
        scope = agent_id if today.per == "agent" and agent_id is not None else TEAM_SCOPE
        hit = None
        if amount <= daily_limit:
            hit = db.execute(CONSUME, (team, name, day, scope, amount, daily_limit)).fetchone()
        if hit is None:  # denied: the upsert changed nothing
            used = _used(db, team, name, day, scope)
            denied = ConsumeResult(
                False, used, daily_limit, max(0, daily_limit - used), today.resets_at, today.retry_after_s
            )
            return denied, scope
        used = hit[0]
        result = ConsumeResult(True, used, daily_limit, daily_limit - used, today.resets_at, today.retry_after_s)
        if used == daily_limit:  # this consume used the last of the day: `limit.exhausted`, in this transaction
            payload = {"name": name, "per": today.per, "agent_id": agent_id, "day": day, "limit": daily_limit}
            db.execute(
                "INSERT INTO limit_events (event_id, team, payload, created_us) VALUES (?, ?, ?, ?)",
                (
                    "evt_" + uuid.uuid4().hex,
                    team,
                    json.dumps(payload | {"resets_at": today.resets_at}),
                    to_us(now),
                ),
            )
        return result, scope

    def limit_events(self, limit: int = 100) -> list[tuple[str, str, dict[str, Any], float]]:
        """(event id, team, payload, Unix time) of the oldest `limit.exhausted` events not yet handed on."""
        with self._read() as db:
            rows = db.execute(
                "SELECT event_id, team, payload, created_us FROM limit_events ORDER BY created_us LIMIT ?", (limit,)
            ).fetchall()
        return [(r[0], r[1], json.loads(r[2]), r[3] / 1e6) for r in rows]

    def drop_limit_events(self, event_ids: list[str]) -> None:
        """Forget events handed on to the webhook outbox (a crash before this hands them on again: same ids)."""
        with self._write() as db:
            db.executemany("DELETE FROM limit_events WHERE event_id = ?", [(e,) for e in event_ids])

    # ------------------------------------------------------------ housekeeping

    def _maybe_purge(self, now: datetime) -> None:
        """Drop stale idempotency records, expired handled keys and long-expired reservations, hourly (per process: harmless twice)."""
        now_us = to_us(now)
        with self._purge_lock:
            if now_us - self._last_purge_us < PURGE_EVERY // timedelta(microseconds=1):
                return
            self._last_purge_us = now_us
        with self._write() as db:
            db.execute("DELETE FROM limit_idempotency WHERE created_us < ?", (to_us(now - IDEMPOTENCY_RETENTION),))
            db.execute("DELETE FROM handled WHERE expires_us IS NOT NULL AND expires_us <= ?", (now_us,))
            db.execute("DELETE FROM gate_reservations WHERE expires_us <= ?", (to_us(now - RESERVATION_RETENTION),))


@dataclass(frozen=True)
class Today:
    """A limit's definition and its local day at one moment: what a count needs, read once per transaction."""

    team: str
    name: str
    daily_limit: int
    per: str
    day: str  # the local date, YYYY-MM-DD: the counter's bucket
    resets_at: str
    retry_after_s: int


def _replay(db: Conn, where: tuple[str, str, str, str], agent_id: str, amount: int) -> dict[str, Any] | None:
    """Today's recorded answer for this idempotency key (team, name, day, key), or None; a different
    request under the same key is a conflict."""
    seen = db.execute(
        "SELECT agent_id, amount, response FROM limit_idempotency"
        " WHERE team = ? AND name = ? AND day = ? AND idem_key = ?",
        where,
    ).fetchone()
    if seen is None:
        return None
    if (seen[0], seen[1]) != (agent_id, amount):
        raise IdempotencyConflict(
            f"idempotency_key was already used today with agent_id={seen[0]!r} "
            f"amount={seen[1]}; use a new key for a different request"
        )
    answer: dict[str, Any] = json.loads(seen[2])
    return answer


def _used(db: Conn, team: str, name: str, day: str, scope: str) -> int:
    row = db.execute(
        "SELECT used FROM limit_usage WHERE team = ? AND name = ? AND day = ? AND agent_id = ?",
        (team, name, day, scope),
    ).fetchone()
    return row[0] if row else 0
