"""The gate's one primitive: reserve -> finish (or release) of a tool call, against the ledger and a daily limit.

A mixin of `LimitStore`: a reservation checks the handled ledger, the live reservations and the limit, and
writes itself, in one transaction of the limits store, so of any number of concurrent reserves of one key
exactly one wins (SQLite: the one writer under BEGIN IMMEDIATE; PostgreSQL: an advisory lock on the key,
taken first, and the counter's row lock). Finish records the key in the same `handled` table /v1/handled
reads; release refunds the units its reserve consumed, to the same day's counter.

What it cannot know: whether a tool whose gate died ran. A reservation past its lease stops blocking its key
(the item may be retried) and keeps its units (the tool may have run: at most N a day is the promise).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..contract.gate import (
    MAX_LEASE_S,
    MAX_RESULT_CHARS,
    GateLimit,
    HandledBy,
    handled_message,
    in_progress_message,
    limit_message,
)
from ..contract.limit_rules import (
    MAX_DAILY_LIMIT,
    MAX_HANDLED_KEY_LEN,
    InvalidInput,
    ReservationConflict,
    ReservationNotFound,
    check_agent_id,
    check_int,
    check_name,
)
from .database import Conn, Database
from .limit_days import iso, to_us
from .limit_schema import FINISH_HANDLED
from .limit_views import TEAM_SCOPE, ConsumeResult

_TOOL = re.compile(r"[A-Za-z0-9._-]{1,128}")
# an expired reservation is kept this long after its lease, so a slow gate's finish can still record its key
RESERVATION_RETENTION = timedelta(days=1)
_LIVE_HANDLED = (
    "SELECT first_seen_us, done_by, tool, result FROM handled"
    " WHERE team = ? AND agent_id = ? AND key = ? AND (expires_us IS NULL OR expires_us > ?)"
)
_HOLDER = (
    "SELECT id, agent_id, created_us FROM gate_reservations"
    " WHERE team = ? AND ledger = ? AND key = ? AND expires_us > ? ORDER BY created_us LIMIT 1"
)


@dataclass(frozen=True)
class GateCall:
    """One reserve: what will run, the key and/or limit guarding it, for whom and how long the key is held."""

    tool: str
    key: str | None = None
    scope: str = "team"  # whose ledger the key is in: "team" or "agent" (needs agent_id)
    limit: str | None = None
    units: int = 1
    agent_id: str | None = None
    lease_s: float = 300.0


@dataclass(frozen=True)
class Reserved:
    """A reserve's answer: allowed with a reservation, or refused with a reason and its sentence."""

    allowed: bool
    reservation: str | None = None
    expires_at: str | None = None
    limit: GateLimit | None = None
    reason: str | None = None
    message: str | None = None
    handled: HandledBy | None = None
    retry_after_s: int = field(default=0, compare=False)

    @property
    def status(self) -> int:
        return 200 if self.allowed else 429 if self.reason == "limit" else 409

    def body(self) -> dict[str, Any]:
        """The JSON answer: the contract's fields for this status, no more."""
        limit = None if self.limit is None else self.limit.model_dump()
        if self.allowed:
            return {"allowed": True, "reservation": self.reservation, "expires_at": self.expires_at, "limit": limit}
        if self.reason == "limit":
            return {"allowed": False, "reason": "limit", "message": self.message, "limit": limit}
        handled = None if self.handled is None else self.handled.model_dump()
        return {"allowed": False, "reason": self.reason, "message": self.message, "handled": handled}


@dataclass(frozen=True)
class Finished:
    key: str | None
    at: str


class Gate:
    """The gate's methods; the store provides the clock, the transactions, the count and the hourly purge."""

    db: Database
    _now: Callable[[], datetime]
    _write: Callable[[], Any]
    _maybe_purge: Callable[[datetime], None]
    _today: Callable[..., Any]
    _count: Callable[..., tuple[ConsumeResult, str]]

    def reserve(self, team: str, call: GateCall) -> Reserved:
        """Check the ledger, the live reservations and the limit, and hold the key, in one transaction.

        A refusal changes nothing. `pinned`-ness is the caller's business: a key pinned to an agent passes
        scope "agent" and its own agent_id (the API does)."""
        ledger = _check(call)
        now = self._now()
        now_us = to_us(now)
        self._maybe_purge(now)
        with self._write() as db:
            if call.key is not None:
                self._lock_key(db, team, ledger, call.key)
                done = db.execute(_LIVE_HANDLED, (team, ledger, call.key, now_us)).fetchone()
                if done is not None:
                    record = HandledBy(key=call.key, by=done[1], at=iso(done[0]), tool=done[2], result=done[3])
                    return Reserved(False, reason="handled", message=handled_message(record), handled=record)
                holder = db.execute(_HOLDER, (team, ledger, call.key, now_us)).fetchone()
                if holder is not None:
                    message = in_progress_message(call.key, holder[1], iso(holder[2]), now)
                    return Reserved(False, reason="in_progress", message=message)
            limit, day, counter = None, None, None
            if call.limit is not None:
                today = self._today(db, team, call.limit, now)
                counted, counter = self._count(db, today, call.agent_id, call.units, now)
                limit = GateLimit(
                    name=call.limit,
                    used=counted.used,
                    limit=counted.limit,
                    remaining=counted.remaining,
                    resets_at=counted.resets_at,
                )
                if not counted.allowed:
                    return Reserved(
                        False,
                        limit=limit,
                        reason="limit",
                        message=limit_message(limit, call.units, call.tool),
                        retry_after_s=counted.retry_after_s,
                    )
                day = today.day
            reservation = "res_" + secrets.token_hex(12)
            expires_us = now_us + round(call.lease_s * 1_000_000)
            db.execute(
                "INSERT INTO gate_reservations (id, team, ledger, key, agent_id, tool, limit_name, limit_day,"
                " counter, units, created_us, expires_us) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    reservation,
                    team,
                    ledger,
                    call.key,
                    call.agent_id,
                    call.tool,
                    call.limit,
                    day,
                    counter,
                    call.units if call.limit is not None else 0,
                    now_us,
                    expires_us,
                ),
            )
        return Reserved(True, reservation=reservation, expires_at=iso(expires_us), limit=limit)

    def finish(self, team: str, reservation: str, result: str | None, pinned: str | None = None) -> Finished:
        """Record the reservation's key handled (by, tool, result) and drop the reservation; its units stay used.

        A reservation whose lease ran out is still recorded if nobody else holds or finished its key since;
        else ReservationConflict and nothing changes. `pinned`: a key pinned to that agent finishes only its
        own agent's reservations (another's is as unknown)."""
        if result is not None and (not isinstance(result, str) or len(result) > MAX_RESULT_CHARS or "\x00" in result):
            raise InvalidInput(f"result must be at most {MAX_RESULT_CHARS} characters (no NUL)")
        now_us = to_us(self._now())
        with self._write() as db:
            row = _take(db, team, reservation, pinned, "ledger, key, agent_id, tool, expires_us")
            ledger, key, agent_id, tool, expires_us = row
            if key is None:  # a limit alone: nothing to record
                return Finished(None, iso(now_us))
            self._lock_key(db, team, ledger, key)
            if expires_us <= now_us:
                done = db.execute(_LIVE_HANDLED, (team, ledger, key, now_us)).fetchone()
                holder = db.execute(_HOLDER, (team, ledger, key, now_us)).fetchone()
                if done is not None or holder is not None:
                    raise ReservationConflict(
                        f"reservation {reservation} ran out of its lease at {iso(expires_us)} and {key!r} was "
                        f"{'handled' if done is not None else 'reserved'} by another call since; nothing was "
                        "recorded: do not run the tool for this item again"
                    )
            first_us = db.execute(
                FINISH_HANDLED, (team, ledger, key, now_us, now_us, agent_id, tool, result)
            ).fetchone()[0]
        return Finished(key, iso(first_us))

    def release(self, team: str, reservation: str, pinned: str | None = None) -> int:
        """Drop the reservation (its key is free again) and give back its units to the counter its reserve
        took them from (same day and agent, never below 0); the units actually given back."""
        with self._write() as db:
            name, day, counter, units = _take(db, team, reservation, pinned, "limit_name, limit_day, counter, units")
            if name is None or not units:
                return 0
            row = db.execute(
                "SELECT used FROM limit_usage WHERE team = ? AND name = ? AND day = ? AND agent_id = ?",
                (team, name, day, counter),
            ).fetchone()
            if row is None:  # the limit was deleted (or redefined) since: nothing to give back
                return 0
            refunded = min(int(units), int(row[0]))
            db.execute(
                "UPDATE limit_usage SET used = used - ? WHERE team = ? AND name = ? AND day = ? AND agent_id = ?",
                (refunded, team, name, day, counter),
            )
            return refunded

    def _lock_key(self, db: Conn, team: str, ledger: str, key: str) -> None:
        """PostgreSQL: one transaction at a time per key (SQLite's single writer already is)."""
        if self.db.dialect == "postgresql":
            db.execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 1))", (f"{team}\x1f{ledger}\x1f{key}",))


def _check(call: GateCall) -> str:
    """The store's own bounds (a direct caller cannot write what the API refuses); the key's ledger."""
    if not isinstance(call.tool, str) or _TOOL.fullmatch(call.tool) is None:
        raise InvalidInput("tool must be 1-128 characters of A-Z a-z 0-9 . _ -")
    if call.key is None and call.limit is None:
        raise InvalidInput("give a key (the item), a limit (a daily limit's name), or both: nothing to guard")
    if call.key is not None and (
        not isinstance(call.key, str) or not 1 <= len(call.key) <= MAX_HANDLED_KEY_LEN or "\x00" in call.key
    ):
        raise InvalidInput(f"key must be 1-{MAX_HANDLED_KEY_LEN} characters (no NUL)")
    if call.limit is not None:
        check_name(call.limit)
        check_int(call.units, "units", 1, MAX_DAILY_LIMIT)
    if call.agent_id is not None:
        check_agent_id(call.agent_id)
    if not 1 <= call.lease_s <= MAX_LEASE_S:
        raise InvalidInput(f"lease_s must be from 1 to {MAX_LEASE_S} seconds")
    if call.scope == "agent":
        if call.agent_id is None:
            raise InvalidInput(
                "scope 'agent' puts the key in an agent's own ledger: give agent_id, or use scope 'team'"
            )
        return call.agent_id
    if call.scope != "team":
        raise InvalidInput("scope must be 'team' or 'agent'")
    return TEAM_SCOPE


def _take(db: Conn, team: str, reservation: str, pinned: str | None, columns: str) -> Any:
    """Delete the team's reservation and return its `columns`: of two finishes (or a finish and a release) of
    one reservation, one takes it and the other finds it gone. ReservationNotFound if it is not there (or,
    for a pinned key, is another agent's)."""
    where, args = "id = ? AND team = ?", [reservation, team]
    if pinned is not None:
        where, args = where + " AND agent_id = ?", [*args, pinned]
    row = db.execute(f"DELETE FROM gate_reservations WHERE {where} RETURNING {columns}", args).fetchone()
    if row is None:
        raise ReservationNotFound(
            f"no reservation {reservation} in this team: it was finished or released already, or never made "
            "(reserve again with POST /v1/gate/reserve)"
        )
    return row
