"""The handled-item ledger: "have I already dealt with this item?", answered atomically per team and agent.

A mixin of `LimitStore` (same database, same purge), kept apart because it shares no table with the limits.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from ..contract.limit_rules import (
    MAX_HANDLED_KEY_LEN,
    MAX_TTL_DAYS,
    InvalidInput,
    check_agent_id,
    check_int,
)
from ..contract.limits import HandledRecord
from .limit_days import iso, to_us
from .limit_schema import MARK_HANDLED
from .limit_views import TEAM_SCOPE


class HandledLedger:
    """The ledger's methods; the store provides the clock, the transactions and the hourly purge."""

    _now: Callable[[], datetime]
    _write: Callable[[], Any]
    _read: Callable[[], Any]
    _maybe_purge: Callable[[datetime], None]

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
        now_us = to_us(now)
        expires_us = None if ttl_days is None else to_us(now + timedelta(days=ttl_days))
        scope = TEAM_SCOPE if agent_id is None else agent_id
        self._maybe_purge(now)
        with self._write() as db:
            row = db.execute(MARK_HANDLED, (team, scope, key, now_us, now_us, expires_us)).fetchone()
        return _record(key, agent_id, row)

    def get_handled(self, team: str, key: str, agent_id: str | None = None) -> HandledRecord | None:
        """The live record, or None if never seen or expired."""
        _check_len(key, "key", MAX_HANDLED_KEY_LEN)
        if agent_id is not None:
            check_agent_id(agent_id)
        now_us = to_us(self._now())
        with self._read() as db:
            row = db.execute(
                "SELECT first_seen_us, last_seen_us, seen_count, expires_us, done_by, tool, result FROM handled"
                " WHERE team = ? AND agent_id = ? AND key = ? AND (expires_us IS NULL OR expires_us > ?)",
                (team, TEAM_SCOPE if agent_id is None else agent_id, key, now_us),
            ).fetchone()
        return None if row is None else _record(key, agent_id, row)


def _record(key: str, agent_id: str | None, row: Any) -> HandledRecord:
    first_us, last_us, count, exp_us, by, tool, result = row
    return HandledRecord(
        key,
        agent_id,
        count == 1,
        iso(first_us),
        iso(last_us),
        count,
        None if exp_us is None else iso(exp_us),
        by,
        tool,
        result,
    )


def _check_len(value: str, what: str, max_len: int) -> str:
    """Handled keys are opaque: any characters but NUL, bounded length."""
    if not isinstance(value, str) or not 1 <= len(value) <= max_len or "\x00" in value:
        raise InvalidInput(f"{what} must be 1-{max_len} characters (no NUL)")
    return value
