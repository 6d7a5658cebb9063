"""Listing, exporting and importing a team's memories: bulk reads and writes on the journal.

Listing and export use keyset pagination on (created_at, id), so a page costs the same at any depth
and a save made meanwhile never shifts what the next page holds.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..contract.text import normalize
from .database import Conn
from .journal import (
    DELETED,
    DONE,
    EXTRACTING,
    FAILED,
    QUEUED,
    Journal,
    Memory,
    has_tag,
    json_items,
)

Cursor = tuple[float, str]  # (created_at, id) of the last item shown


@dataclass
class ListFilter:
    agent_id: str | None = None
    run_id: str | None = None
    status: str | None = None
    tag: str | None = None
    since: float | None = None
    until: float | None = None


@dataclass
class Listed:
    memory: Memory
    facts: int


def list_memories(
    journal: Journal, team: str, flt: ListFilter, *, limit: int, after: Cursor | None = None, newest_first: bool = True
) -> tuple[list[Listed], Cursor | None]:
    """One page of the team's memories and the cursor of the next page (None on the last)."""
    where: list[str] = ["m.team = ?", "m.status != ?"]
    args: list[Any] = [team, DELETED]
    for column, value in (("agent_id", flt.agent_id), ("run_id", flt.run_id), ("status", flt.status)):
        if value is not None:
            where.append(f"m.{column} = ?")
            args.append(value)
    if flt.tag is not None:
        where.append(has_tag(journal.dialect, "m.tags"))
        args.append(flt.tag)
    if flt.since is not None:
        where.append("m.created_at >= ?")
        args.append(flt.since)
    if flt.until is not None:
        where.append("m.created_at <= ?")
        args.append(flt.until)
    op, order = ("<", "DESC") if newest_first else (">", "ASC")
    if after is not None:
        where.append(f"(m.created_at {op} ? OR (m.created_at = ? AND m.id {op} ?))")
        args += [after[0], after[0], after[1]]
    sql = (
        "SELECT m.*, (SELECT COUNT(DISTINCT s.fact_id) FROM fact_sources s WHERE s.memory_id = m.id) AS n_facts "
        f"FROM memories m WHERE {' AND '.join(where)} ORDER BY m.created_at {order}, m.id {order} LIMIT ?"
    )
    with journal.reading() as conn:
        rows = conn.execute(sql, (*args, limit + 1)).fetchall()
    items = [Listed(Memory.from_row(row), int(row["n_facts"])) for row in rows[:limit]]
    last = items[-1].memory if len(rows) > limit else None
    return items, (last.created_at, last.id) if last is not None else None


def export_records(
    journal: Journal, team: str, agent_id: str | None = None, batch: int = 200
) -> Iterator[dict[str, Any]]:
    """Every memory of the team (of one agent when `agent_id` is given), oldest first, with its facts (spans,
    supersession history)."""
    after: Cursor | None = None
    flt = ListFilter(agent_id=agent_id)
    while True:
        page, after = list_memories(journal, team, flt, limit=batch, after=after, newest_first=False)
        for item in page:
            yield _record(journal, team, item.memory)
        if after is None:
            return


def _record(journal: Journal, team: str, memory: Memory) -> dict[str, Any]:
    facts = journal.facts_of_memory(team, memory.id)
    return {
        "id": memory.id,
        "text": memory.text,
        "agent_id": memory.agent_id,
        "run_id": memory.run_id,
        "tags": memory.tags,
        "metadata": memory.metadata,
        "created_at": memory.created_at,
        "status": memory.status,
        "idempotency_key": memory.idempotency_key,
        "occurred_at": memory.occurred_at,
        "occurred_day": memory.occurred_day,
        "facts": [
            {
                "id": f.id,
                "text": f.text,
                "spans": [s["span"] for s in f.sources],
                "created_at": f.created_at,
                "superseded_by": f.superseded_by,
                "superseded_at": f.superseded_at,
            }
            for f in facts
        ],
    }


def imported_fact_id(team: str, original_id: str) -> str:
    """Deterministic per (team, original fact): re-importing upserts, and `superseded_by` links survive."""
    return "f:" + hashlib.sha256(f"{team}\x00import\x00{original_id}".encode()).hexdigest()[:32]


@dataclass
class ImportedFact:
    id: str
    text: str


def import_record(
    journal: Journal,
    team: str,
    record: dict[str, Any],
    *,
    keep_facts: bool,
    budget_s: float,
    shape: Callable[[str], str],
    now: float | None = None,
) -> tuple[Memory, bool, list[ImportedFact]]:
    """Insert one exported memory (idempotent: keyed on its original idempotency key or id). `shape`: a fact's
    value-masked form (extraction's rule, given by the caller: storage knows no extraction).

    A line is skipped when the team already holds it: the same key, the memory itself (an export imported back
    into its own team), or the original it was copied from (a copy that went to another team and back).

    Returns (memory, created, active facts newly stored). Those are stored as not yet indexed: their vectors
    are written after the commit, and if that fails the indexer's sweep writes them.
    """
    now = time.time() if now is None else now
    key = record.get("idempotency_key") or f"import:{record['id']}"
    facts = (record.get("facts") or []) if keep_facts else []
    status = {DONE: DONE, FAILED: FAILED}.get(record.get("status", ""), QUEUED) if keep_facts else QUEUED
    tags = json.dumps(record.get("tags") or [])
    with journal.transaction() as conn:
        # the line's lineage: this team's own memory (its id), or a copy of one (`import:<original id>`)
        original = key.removeprefix("import:") if key.startswith("import:") else record["id"]
        row = conn.execute(
            "SELECT * FROM memories WHERE team = ? AND status != ? AND (idempotency_key = ? OR id = ? OR id = ?)",
            (team, DELETED, key, record["id"], original),
        ).fetchone()
        if row is not None:
            return Memory.from_row(row), False, []
        memory_id = "mem_" + uuid.uuid4().hex
        conn.execute(
            """INSERT INTO memories (id, team, agent_id, run_id, text, tags, metadata, idempotency_key, created_at,
               status, next_attempt_at, deadline_at, finished_at, occurred_at, occurred_day)
               VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)""",
            (
                memory_id,
                team,
                record["agent_id"],
                record.get("run_id"),
                record["text"],
                tags,
                json.dumps(record.get("metadata") or {}),
                key,
                float(record["created_at"]),
                status,
                now,
                now + budget_s,
                now if status != QUEUED else None,
                record.get("occurred_at"),
                record.get("occurred_day"),
            ),
        )
        fresh = [_insert_fact(conn, team, memory_id, record, fact, tags, now, shape) for fact in facts]
        memory = Memory.from_row(conn.execute("SELECT * FROM memories WHERE id = ?", (memory_id,)).fetchone())
    return memory, True, [f for f in fresh if f is not None]


def _insert_fact(
    conn: Conn,
    team: str,
    memory_id: str,
    record: dict[str, Any],
    fact: dict[str, Any],
    tags: str,
    now: float,
    shape: Callable[[str], str],
) -> ImportedFact | None:
    fact_id = imported_fact_id(team, fact["id"])
    superseded_by = imported_fact_id(team, fact["superseded_by"]) if fact.get("superseded_by") else None
    norm = normalize(fact["text"])
    created = conn.execute(
        "INSERT INTO facts (id, team, agent_id, memory_id, text, norm, shape, tags, created_at, "
        "superseded_by, superseded_at, indexed) VALUES (?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
        (
            fact_id,
            team,
            record["agent_id"],
            memory_id,
            fact["text"],
            norm,
            shape(norm),
            tags,
            float(fact.get("created_at") or record["created_at"]),
            superseded_by,
            fact.get("superseded_at"),
            int(superseded_by is not None),  # a superseded value never gets a vector; an active one: see above
        ),
    ).rowcount
    for start, end in fact.get("spans") or [(0, 0)]:
        conn.execute(
            "INSERT INTO fact_sources (fact_id, memory_id, span_start, span_end, added_at) "
            "VALUES (?,?,?,?,?) ON CONFLICT DO NOTHING",
            (fact_id, memory_id, int(start), int(end), now),
        )
    return ImportedFact(fact_id, fact["text"]) if created and superseded_by is None else None


@dataclass
class Facets:
    """What a team's memory holds, in counts: the filters a caller can use."""

    memories: int
    agents: list[tuple[str, int]]
    tags: list[tuple[str, int]]


def facets(journal: Journal, team: str, top: int = 50, agent_id: str | None = None) -> Facets:
    """The team's memory count and its busiest agent ids and tags (at most `top` of each); only `agent_id`'s
    memories when given (what a key pinned to that agent may see).

    One indexed pass per question; called at an MCP server's start and on an empty recall, not per request.
    """
    live = "m.team = ? AND m.status != ?" + (" AND m.agent_id = ?" if agent_id is not None else "")
    args: tuple[str, ...] = (team, DELETED) + ((agent_id,) if agent_id is not None else ())
    with journal.reading() as conn:
        total = conn.execute(f"SELECT COUNT(*) FROM memories m WHERE {live}", args).fetchone()[0]
        agents = conn.execute(
            f"SELECT m.agent_id, COUNT(*) FROM memories m WHERE {live} GROUP BY m.agent_id ORDER BY 2 DESC, 1 LIMIT ?",
            (*args, top),
        ).fetchall()
        tags = conn.execute(
            f"SELECT j.value, COUNT(*) FROM memories m, {json_items(journal.dialect, 'm.tags', 'j')} WHERE {live} "
            "GROUP BY j.value "
            "ORDER BY 2 DESC, 1 LIMIT ?",
            (*args, top),
        ).fetchall()
    return Facets(int(total), [(a, int(n)) for a, n in agents], [(t, int(n)) for t, n in tags])


def status_counts(journal: Journal, team: str) -> dict[str, int]:
    """How many of the team's jobs are in each state (queued, extracting, done, failed)."""
    with journal.reading() as conn:
        rows = conn.execute(
            "SELECT status, COUNT(*) FROM memories WHERE team = ? AND status != ? GROUP BY status", (team, DELETED)
        ).fetchall()
    out = {status: 0 for status in (QUEUED, EXTRACTING, DONE, FAILED)}
    out.update({row[0]: int(row[1]) for row in rows})
    return out


def pending_by_team(journal: Journal) -> dict[str, int]:
    """Every team's jobs queued or extracting, teams with none left out (the console's queue-depth samples)."""
    where = f"status IN ('{QUEUED}', '{EXTRACTING}')"  # literals: the partial index `memories_team_pending`'s terms
    with journal.reading() as conn:
        rows = conn.execute(f"SELECT team, COUNT(*) FROM memories WHERE {where} GROUP BY team").fetchall()
    return {str(team): int(count) for team, count in rows}
