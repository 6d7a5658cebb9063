"""What the limits store answers: a consume's result and a limit with its usage, read in one transaction."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, timedelta
from zoneinfo import ZoneInfo

from ..contract.limit_rules import MAX_AGENTS_SHOWN, LimitNotFound
from .database import Conn
from .limit_days import iso, next_midnight

TEAM_SCOPE = ""  # agent_id column value for team-wide rows; real agent ids are never empty


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


def not_found(name: str) -> LimitNotFound:
    return LimitNotFound(f"no limit named {name!r}; create it with PUT /v1/limits/{name}")


@dataclass(frozen=True)
class ViewQuery:
    """Which counters a view shows: one agent's (or the team's), today only or `days` of history."""

    team: str
    name: str
    agent_id: str | None
    days: int | None
    with_agents: bool = True


def read_view(
    db: Conn, query: ViewQuery, definition: tuple[int, str, str, int, int], today: date, zone: ZoneInfo
) -> LimitView:
    """The view of one limit whose row (`definition`: daily_limit, timezone, per, created_us, updated_us) was read."""
    daily_limit, tz, per, created_us, updated_us = definition
    scope = TEAM_SCOPE if per == "team" else query.agent_id
    first = today - timedelta(days=(query.days or 1) - 1)
    per_day = _used_per_day(db, query, scope, first, today)
    used = per_day.get(today.isoformat(), 0)
    agents = None
    if scope is None and query.with_agents:
        agents = [
            {"agent_id": a, "used": u, "remaining": max(0, daily_limit - u)}
            for a, u in db.execute(
                "SELECT agent_id, used FROM limit_usage WHERE team = ? AND name = ? AND day = ? AND agent_id != ?"
                " ORDER BY used DESC, agent_id LIMIT ?",
                (query.team, query.name, today.isoformat(), TEAM_SCOPE, MAX_AGENTS_SHOWN),
            )
        ]
    history = None
    if query.days is not None:
        history = [
            {"day": d, "used": per_day.get(d, 0)}
            for d in ((first + timedelta(days=n)).isoformat() for n in range(query.days))
        ]
    return LimitView(
        name=query.name,
        daily_limit=daily_limit,
        timezone=tz,
        per=per,
        created_at=iso(created_us),
        updated_at=iso(updated_us),
        day=today.isoformat(),
        resets_at=next_midnight(today, zone).isoformat(),
        agent_id=query.agent_id if per == "agent" else None,
        used=used,
        remaining=None if scope is None else max(0, daily_limit - used),
        agents=agents,
        history=history,
    )


def _used_per_day(db: Conn, query: ViewQuery, scope: str | None, first: date, today: date) -> dict[str, int]:
    """Usage per local day from `first` to `today`, of one counter or (scope None) summed over the agents'."""
    # per=agent without agent_id sums the agents' rows ('' rows date from a per=team period)
    who, arg = ("agent_id != ?", TEAM_SCOPE) if scope is None else ("agent_id = ?", scope)
    return {
        day: int(used)  # PostgreSQL sums 64-bit integers as numeric
        for day, used in db.execute(
            f"SELECT day, SUM(used) FROM limit_usage WHERE team = ? AND name = ? AND day BETWEEN ? AND ?"
            f" AND {who} GROUP BY day",
            (query.team, query.name, first.isoformat(), today.isoformat(), arg),
        ).fetchall()
    }
