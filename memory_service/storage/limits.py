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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo

from memory_service.contract.limit_rules import (
    MAX_AGENTS_SHOWN,
    MAX_DAILY_LIMIT,
    MAX_HANDLED_KEY_LEN,
    MAX_HISTORY_DAYS,
    MAX_IDEMPOTENCY_KEY_LEN,
    MAX_TTL_DAYS,
    IdempotencyConflict,
    InvalidInput,
    LimitNotFound,
    check_agent_id,
    check_int,
    check_name,
    check_text,
    check_timezone,
)
from memory_service.contract.limits import HandledRecord
from memory_service.storage.database import Conn, Database, SqliteDatabase, StorageClosed

# Idempotency answers are only replayed on the same local day; keep them a bit
# longer than any day can last, then purge.
IDEMPOTENCY_RETENTION = timedelta(days=3)
PURGE_EVERY = timedelta(hours=1)

Per = Literal["team", "agent"]
TEAM_SCOPE = ""  # agent_id column value for team-wide rows; real agent ids are never empty

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class ConsumeResult:
    allowed: bool
    used: int
    limit: int
    remaining: int
    resets_at: str
    retry_after_s: int = field(default=0, compare=False)  # seconds until resets_at (Retry-After)
    replayed: bool = field(default=False, compare=False)  # answer came from the idempotency record

    def body(self) -> dict[str, object]:
        """The JSON answer (on the hot path: no dataclasses.asdict deep copy)."""
        return {
            "allowed": self.allowed,
            "used": self.used,
            "limit": self.limit,
            "remaining": self.remaining,
            "resets_at": self.resets_at,
        }


@dataclass(frozen=True)
class LimitView:
    """A limit definition with today's usage (and history when asked)."""

    name: str
    daily_limit: int
    timezone: str
    per: str
    created_at: str
    updated_at: str
    day: str  # today's local date, YYYY-MM-DD
    resets_at: str
    agent_id: str | None  # whose counter `used` is; None = team counter or all agents
    used: int  # per=agent without agent_id: sum over all agents
    remaining: int | None  # None when `used` sums several agents' counters
    agents: list[dict[str, object]] | None = None  # per=agent without agent_id, busiest first
    history: list[dict[str, object]] | None = None  # oldest first, today last


# ---------------------------------------------------------------- time


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _to_us(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1)


def _iso(us: int) -> str:
    return (_EPOCH + timedelta(microseconds=us)).isoformat()


def local_day(moment: datetime, zone: ZoneInfo) -> date:
    return moment.astimezone(zone).date()


def next_midnight(day: date, zone: ZoneInfo) -> datetime:
    """First instant of the day after `day`, in `zone`, with its real offset.

    fold=0 maps a midnight skipped by DST to the transition instant (the new
    day's first moment) and a repeated midnight to its first occurrence.
    """
    wall = datetime.combine(day + timedelta(days=1), time(0), tzinfo=zone)
    return wall.astimezone(UTC).astimezone(zone)


# ---------------------------------------------------------------- SQL

_SCHEMA = """
CREATE TABLE IF NOT EXISTS limit_defs (
    team TEXT NOT NULL, name TEXT NOT NULL,
    daily_limit INTEGER NOT NULL, timezone TEXT NOT NULL, per TEXT NOT NULL,
    created_us INTEGER NOT NULL, updated_us INTEGER NOT NULL,
    PRIMARY KEY (team, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS limit_usage (
    team TEXT NOT NULL, name TEXT NOT NULL, day TEXT NOT NULL, agent_id TEXT NOT NULL,
    used INTEGER NOT NULL,
    PRIMARY KEY (team, name, day, agent_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS limit_idempotency (
    team TEXT NOT NULL, name TEXT NOT NULL, day TEXT NOT NULL, idem_key TEXT NOT NULL,
    agent_id TEXT NOT NULL, amount INTEGER NOT NULL, response TEXT NOT NULL, created_us INTEGER NOT NULL,
    PRIMARY KEY (team, name, day, idem_key)
);
CREATE INDEX IF NOT EXISTS limit_idempotency_created ON limit_idempotency (created_us);
CREATE TABLE IF NOT EXISTS handled (
    team TEXT NOT NULL, agent_id TEXT NOT NULL, key TEXT NOT NULL,
    first_seen_us INTEGER NOT NULL, last_seen_us INTEGER NOT NULL,
    seen_count INTEGER NOT NULL, expires_us INTEGER,
    PRIMARY KEY (team, agent_id, key)
);
CREATE INDEX IF NOT EXISTS handled_expires ON handled (expires_us) WHERE expires_us IS NOT NULL;
"""

# PostgreSQL: the same tables; microsecond clocks need 64-bit integers, and every table has a primary key.
_POSTGRES_SCHEMA = _SCHEMA.replace(" WITHOUT ROWID", "").replace("INTEGER", "BIGINT")

# Adds `amount` only while the day's total stays within the limit; no row back = denied.
_CONSUME = """
INSERT INTO limit_usage (team, name, day, agent_id, used) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (team, name, day, agent_id) DO UPDATE SET used = limit_usage.used + excluded.used
WHERE limit_usage.used + excluded.used <= ?
RETURNING used
"""

# Set-if-absent; an expired row starts over as if it had never been seen.
_MARK_HANDLED = """
INSERT INTO handled (team, agent_id, key, first_seen_us, last_seen_us, seen_count, expires_us)
VALUES (?, ?, ?, ?, ?, 1, ?)
ON CONFLICT (team, agent_id, key) DO UPDATE SET
    first_seen_us = CASE WHEN handled.expires_us <= excluded.last_seen_us
                         THEN excluded.first_seen_us ELSE handled.first_seen_us END,
    seen_count    = CASE WHEN handled.expires_us <= excluded.last_seen_us
                         THEN 1 ELSE handled.seen_count + 1 END,
    expires_us    = CASE WHEN handled.expires_us <= excluded.last_seen_us
                         THEN excluded.expires_us ELSE handled.expires_us END,
    last_seen_us  = excluded.last_seen_us
RETURNING first_seen_us, last_seen_us, seen_count, expires_us
"""


class LimitStore:
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
        self._now_fn = now or _utc_now
        self._purge_lock = threading.Lock()
        self._zones: dict[str, ZoneInfo] = {}
        self._last_purge_us = 0
        self._owns = not isinstance(store, Database)
        self.db: Database = (
            store if isinstance(store, Database) else SqliteDatabase(Path(store), synchronous=synchronous)
        )
        self.db.create_schema(_SCHEMA, _POSTGRES_SCHEMA)
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
        now_us = _to_us(self._now())
        with self._write() as db:
            existed = db.execute("SELECT 1 FROM limit_defs WHERE team = ? AND name = ?", (team, name)).fetchone()
            db.execute(
                """
                INSERT INTO limit_defs (team, name, daily_limit, timezone, per, created_us, updated_us)
                VALUES (?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (team, name) DO UPDATE SET daily_limit = excluded.daily_limit,
                    timezone = excluded.timezone, per = excluded.per, updated_us = excluded.updated_us
                """,
                (team, name, daily_limit, tz, per, now_us, now_us),
            )
            view = self._view(db, team, name, None, None)
        return view, existed is None

    def get_limit(self, team: str, name: str, agent_id: str | None = None, days: int | None = None) -> LimitView:
        check_name(name)
        if agent_id is not None:
            check_agent_id(agent_id)
        if days is not None:
            check_int(days, "days", 1, MAX_HISTORY_DAYS)
        with self._read() as db:
            return self._view(db, team, name, agent_id, days)

    def list_limits(self, team: str, agent_id: str | None = None) -> list[LimitView]:
        if agent_id is not None:
            check_agent_id(agent_id)
        with self._read() as db:
            names = [r[0] for r in db.execute("SELECT name FROM limit_defs WHERE team = ? ORDER BY name", (team,))]
            return [self._view(db, team, n, agent_id, None, with_agents=False) for n in names]

    def delete_limit(self, team: str, name: str) -> None:
        """Remove a limit with its counters and idempotency records."""
        check_name(name)
        with self._write() as db:
            if db.execute("DELETE FROM limit_defs WHERE team = ? AND name = ?", (team, name)).rowcount == 0:
                raise LimitNotFound(f"no limit named {name!r}; create it with PUT /v1/limits/{name}")
            db.execute("DELETE FROM limit_usage WHERE team = ? AND name = ?", (team, name))
            db.execute("DELETE FROM limit_idempotency WHERE team = ? AND name = ?", (team, name))

    def _view(
        self,
        db: Conn,
        team: str,
        name: str,
        agent_id: str | None,
        days: int | None,
        *,
        with_agents: bool = True,
    ) -> LimitView:
        row = db.execute(
            "SELECT daily_limit, timezone, per, created_us, updated_us FROM limit_defs WHERE team = ? AND name = ?",
            (team, name),
        ).fetchone()
        if row is None:
            raise LimitNotFound(f"no limit named {name!r}; create it with PUT /v1/limits/{name}")
        daily_limit, tz, per, created_us, updated_us = row
        zone = self._zone(tz)
        today = local_day(self._now(), zone)
        scope = TEAM_SCOPE if per == "team" else agent_id
        shown_agent = agent_id if per == "agent" else None

        first = today - timedelta(days=(days or 1) - 1)
        # per=agent without agent_id sums the agents' rows ('' rows date from a per=team period)
        who, args = ("agent_id != ?", TEAM_SCOPE) if scope is None else ("agent_id = ?", scope)
        per_day = {
            day: int(used)  # PostgreSQL sums 64-bit integers as numeric
            for day, used in db.execute(
                f"SELECT day, SUM(used) FROM limit_usage WHERE team = ? AND name = ? AND day BETWEEN ? AND ?"
                f" AND {who} GROUP BY day",
                (team, name, first.isoformat(), today.isoformat(), args),
            ).fetchall()
        }
        used = per_day.get(today.isoformat(), 0)
        agents = None
        if scope is None and with_agents:
            agents = [
                {"agent_id": a, "used": u, "remaining": max(0, daily_limit - u)}
                for a, u in db.execute(
                    "SELECT agent_id, used FROM limit_usage WHERE team = ? AND name = ? AND day = ? AND agent_id != ?"
                    " ORDER BY used DESC, agent_id LIMIT ?",
                    (team, name, today.isoformat(), TEAM_SCOPE, MAX_AGENTS_SHOWN),
                )
            ]
        history = None
        if days is not None:
            history = [
                {"day": d, "used": per_day.get(d, 0)}
                for d in ((first + timedelta(days=n)).isoformat() for n in range(days))
            ]
        return LimitView(
            name=name,
            daily_limit=daily_limit,
            timezone=tz,
            per=per,
            created_at=_iso(created_us),
            updated_at=_iso(updated_us),
            day=today.isoformat(),
            resets_at=next_midnight(today, zone).isoformat(),
            agent_id=shown_agent,
            used=used,
            remaining=None if scope is None else max(0, daily_limit - used),
            agents=agents,
            history=history,
        )

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
            row = db.execute(
                "SELECT daily_limit, timezone, per FROM limit_defs WHERE team = ? AND name = ?", (team, name)
            ).fetchone()
            if row is None:
                raise LimitNotFound(f"no limit named {name!r}; create it with PUT /v1/limits/{name}")
            daily_limit, tz, per = row
            zone = self._zone(tz)
            today = local_day(now, zone)
            day = today.isoformat()
            resets = next_midnight(today, zone)
            retry_after = max(1, math.ceil((resets - now).total_seconds()))
            if idempotency_key is not None:
                seen = db.execute(
                    "SELECT agent_id, amount, response FROM limit_idempotency"
                    " WHERE team = ? AND name = ? AND day = ? AND idem_key = ?",
                    (team, name, day, idempotency_key),
                ).fetchone()
                if seen is not None:
                    if (seen[0], seen[1]) != (agent_id, amount):
                        raise IdempotencyConflict(
                            f"idempotency_key was already used today with agent_id={seen[0]!r} "
                            f"amount={seen[1]}; use a new key for a different request"
                        )
                    return ConsumeResult(**json.loads(seen[2]), retry_after_s=retry_after, replayed=True)
            scope = agent_id if per == "agent" else TEAM_SCOPE
            hit = None
            if amount <= daily_limit:
                hit = db.execute(_CONSUME, (team, name, day, scope, amount, daily_limit)).fetchone()
            if hit is None:  # denied: the upsert changed nothing
                cur = db.execute(
                    "SELECT used FROM limit_usage WHERE team = ? AND name = ? AND day = ? AND agent_id = ?",
                    (team, name, day, scope),
                ).fetchone()
                used = cur[0] if cur else 0
                return ConsumeResult(
                    False, used, daily_limit, max(0, daily_limit - used), resets.isoformat(), retry_after
                )
            used = hit[0]
            result = ConsumeResult(True, used, daily_limit, daily_limit - used, resets.isoformat(), retry_after)
            if idempotency_key is not None:
                db.execute(
                    "INSERT INTO limit_idempotency (team, name, day, idem_key, agent_id, amount, response,"
                    " created_us) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (team, name, day, idempotency_key, agent_id, amount, json.dumps(result.body()), _to_us(now)),
                )
            return result

    # ------------------------------------------------------------ handled ledger

    def mark_handled(
        self, team: str, key: str, agent_id: str | None = None, ttl_days: int | None = None
    ) -> HandledRecord:
        """Record `key` if absent (or expired); says whether this was the first time.

        The expiry is fixed when the key is first recorded: later sightings
        bump seen_count but do not extend it.
        """
        _check_len(key, "key", MAX_HANDLED_KEY_LEN)
        if agent_id is not None:
            check_agent_id(agent_id)
        if ttl_days is not None:
            check_int(ttl_days, "ttl_days", 1, MAX_TTL_DAYS)
        now = self._now()
        now_us = _to_us(now)
        expires_us = None if ttl_days is None else _to_us(now + timedelta(days=ttl_days))
        scope = TEAM_SCOPE if agent_id is None else agent_id
        self._maybe_purge(now)
        with self._write() as db:
            first_us, last_us, count, exp_us = db.execute(
                _MARK_HANDLED, (team, scope, key, now_us, now_us, expires_us)
            ).fetchone()
        return HandledRecord(
            key, agent_id, count == 1, _iso(first_us), _iso(last_us), count, None if exp_us is None else _iso(exp_us)
        )

    def get_handled(self, team: str, key: str, agent_id: str | None = None) -> HandledRecord | None:
        """The live record, or None if never seen or expired."""
        _check_len(key, "key", MAX_HANDLED_KEY_LEN)
        if agent_id is not None:
            check_agent_id(agent_id)
        now_us = _to_us(self._now())
        with self._read() as db:
            row = db.execute(
                "SELECT first_seen_us, last_seen_us, seen_count, expires_us FROM handled"
                " WHERE team = ? AND agent_id = ? AND key = ? AND (expires_us IS NULL OR expires_us > ?)",
                (team, TEAM_SCOPE if agent_id is None else agent_id, key, now_us),
            ).fetchone()
        if row is None:
            return None
        first_us, last_us, count, exp_us = row
        return HandledRecord(
            key, agent_id, count == 1, _iso(first_us), _iso(last_us), count, None if exp_us is None else _iso(exp_us)
        )

    # ------------------------------------------------------------ housekeeping

    def _maybe_purge(self, now: datetime) -> None:
        """Drop stale idempotency records and expired handled keys, hourly (per process: harmless twice)."""
        now_us = _to_us(now)
        with self._purge_lock:
            if now_us - self._last_purge_us < PURGE_EVERY // timedelta(microseconds=1):
                return
            self._last_purge_us = now_us
        with self._write() as db:
            db.execute("DELETE FROM limit_idempotency WHERE created_us < ?", (_to_us(now - IDEMPOTENCY_RETENTION),))
            db.execute("DELETE FROM handled WHERE expires_us IS NOT NULL AND expires_us <= ?", (now_us,))


def _check_len(value: str, what: str, max_len: int) -> str:
    """Handled keys are opaque: any characters but NUL, bounded length."""
    if not isinstance(value, str) or not 1 <= len(value) <= max_len or "\x00" in value:
        raise InvalidInput(f"{what} must be 1-{max_len} characters (no NUL)")
    return value
