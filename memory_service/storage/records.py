"""What the journal holds, as plain dataclasses: a saved text with its job, a fact, a fact plan, a hit."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..contract.boundary import loads_stored
from ..contract.types import DONE, EXTRACTING, FAILED, QUEUED  # noqa: F401 (re-exported)

# A forgotten memory whose vectors are not removed yet: invisible to every read, purged on completion.
DELETED = "deleted"
# What `fail_attempt` answers when the worker's lease was taken over: the job is someone else's now.
LOST = "lost"


@dataclass
class Memory:
    id: str
    team: str
    agent_id: str
    run_id: str | None
    text: str
    tags: list[str]
    metadata: dict[str, Any]
    idempotency_key: str | None
    created_at: float
    status: str
    attempts: int
    deferrals: int
    next_attempt_at: float
    deadline_at: float
    started_at: float | None
    finished_at: float | None
    last_error: str | None
    raw_reply: str | None
    timings: dict[str, Any] | None
    report: dict[str, Any] | None
    progress: dict[str, Any] | None = None  # chunks already extracted, when a long text is part-way
    occurred_at: float | None = None  # when what the text tells happened, if the saver said; else created_at
    occurred_day: str | None = None  # that day (YYYY-MM-DD) where it was said: relative dates count from it
    lease_owner: str | None = None  # the worker extracting it now
    pinned: bool = False  # saved by a key pinned to its agent: its facts decide only among that agent's

    @classmethod
    def from_row(cls, row: Any) -> Memory:
        return cls(
            id=row["id"],
            team=row["team"],
            agent_id=row["agent_id"],
            run_id=row["run_id"],
            text=row["text"],
            tags=json.loads(row["tags"]),
            metadata=loads_stored(row["metadata"]),  # a value stored before the text boundary, repaired
            idempotency_key=row["idempotency_key"],
            created_at=row["created_at"],
            status=row["status"],
            attempts=row["attempts"],
            deferrals=row["deferrals"],
            next_attempt_at=row["next_attempt_at"],
            deadline_at=row["deadline_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            last_error=row["last_error"],
            raw_reply=row["raw_reply"],
            timings=json.loads(row["timings"]) if row["timings"] else None,
            report=json.loads(row["report"]) if row["report"] else None,
            progress=json.loads(row["progress"]) if row["progress"] else None,
            occurred_at=row["occurred_at"],
            occurred_day=row["occurred_day"],
            lease_owner=row["lease_owner"],
            pinned=bool(row["pinned"]),
        )


@dataclass
class Fact:
    id: str
    team: str
    agent_id: str
    memory_id: str
    text: str
    norm: str
    shape: str
    tags: list[str]
    created_at: float
    superseded_by: str | None = None
    superseded_at: float | None = None
    sources: list[dict[str, Any]] = field(default_factory=list)
    pinned: bool = False  # written by a pinned save: only its agent's saves may merge into or supersede it


@dataclass
class NewFact:
    """A grounded fact ready to be stored; `id` is deterministic so a replayed job upserts, not duplicates."""

    id: str
    text: str
    norm: str
    shape: str
    spans: list[tuple[int, int]]


@dataclass
class FactPlan:
    """What the dedup step decided for one job, applied in one transaction."""

    new: list[NewFact] = field(default_factory=list)
    merged: list[tuple[str, list[tuple[int, int]]]] = field(default_factory=list)  # (existing fact id, spans)
    superseded: list[tuple[str, str]] = field(default_factory=list)  # (old fact id, new fact id)
    born_superseded: list[tuple[str, str]] = field(default_factory=list)  # (new fact id, newer existing id)
    # (fact id, earlier memory id, span): a fact that also rests on an earlier save given as context
    context_sources: list[tuple[str, str, tuple[int, int]]] = field(default_factory=list)


@dataclass
class KeywordHit:
    """A keyword match with what recall shows of it, read in the same query (no second look-up)."""

    kind: str  # passage | fact
    item_id: str
    memory_id: str
    text: str
    rank: float
    agent_id: str
    created_at: float
    tags: tuple[str, ...]


def fact_from_row(row: Any) -> Fact:
    return Fact(
        id=row["id"],
        team=row["team"],
        agent_id=row["agent_id"],
        memory_id=row["memory_id"],
        text=row["text"],
        norm=row["norm"],
        shape=row["shape"],
        tags=json.loads(row["tags"]),
        created_at=row["created_at"],
        superseded_by=row["superseded_by"],
        superseded_at=row["superseded_at"],
        pinned=bool(row["pinned"]),
    )


def dumps_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


@lru_cache(maxsize=4096)
def tags_of(stored: str) -> tuple[str, ...]:
    """A row's tags column, parsed once per distinct value: recall reads ~100 rows a query, and a team
    uses few tag sets."""
    return tuple(json.loads(stored))
