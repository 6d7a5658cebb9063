"""Forgetting in the journal, in two steps that survive a crash between them.

1. `mark_forgotten`, one transaction under the team's deciding lock: the memories become `deleted` (every
   read skips them) and free their idempotency keys, their keyword entries go, their fact sources go,
   facts left with no source are deleted (row and keyword entry) and their ids queued in `fact_purges`,
   and their earlier versions (a mem0 update's) go.
2. Once the caller has removed the vectors, `purge` deletes the rows that listed them.

`pending` is the to-do list of step 2: what a forget cut off by a crash left behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .database import Conn
from .journal import DELETED, Journal
from .versions import forget_versions

CHUNK = 500  # ids per statement, well under SQLite's variable limit


@dataclass
class Pending:
    """Vectors still to remove: forgotten memories (id, text) and deleted facts, by team."""

    memories: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    facts: dict[str, list[str]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.memories or self.facts)


def _chunks(ids: list[str]) -> list[list[str]]:
    return [ids[i : i + CHUNK] for i in range(0, len(ids), CHUNK)]


def mark_forgotten(
    journal: Journal,
    team: str,
    *,
    memory_ids: list[str] | None = None,
    agent_id: str | None = None,
    run_id: str | None = None,
    now: float | None = None,
) -> list[str]:
    """Step 1 for the team's memories matching the selector; returns the ids forgotten."""
    if memory_ids is None and agent_id is None and run_id is None:
        raise ValueError("forget needs ids, an agent_id or a run_id")
    now = time.time() if now is None else now
    where, args = ["team = ?", "status != ?"], [team, DELETED]
    if agent_id is not None:
        where.append("agent_id = ?")
        args.append(agent_id)
    if run_id is not None:
        where.append("run_id = ?")
        args.append(run_id)
    # under the team's deciding lock: a fact decision made before the forget (a merge into a fact that only
    # the forgotten memory supports) commits first, so the forget sees its new source and keeps the fact
    with journal.deciding(team), journal.transaction() as conn:
        rows: list[Any] = []
        sql = f"SELECT rowid, id, text FROM memories WHERE {' AND '.join(where)}"
        if memory_ids is None:
            rows = conn.execute(sql, args).fetchall()
        else:
            for chunk in _chunks(memory_ids):
                marks = ",".join("?" * len(chunk))
                rows += conn.execute(f"{sql} AND id IN ({marks})", (*args, *chunk)).fetchall()
        ids = [row["id"] for row in rows]
        if not ids:
            return []
        # the key goes with the text: a save repeating it from now on is a new save, not a replay of a
        # memory no read can show
        conn.executemany(
            "UPDATE memories SET status = ?, finished_at = ?, idempotency_key = NULL WHERE id = ?",
            [(DELETED, now, i) for i in ids],
        )
        if journal.dialect == "sqlite":  # PostgreSQL's text index is a column of the row: it goes with it
            conn.executemany(
                "INSERT INTO memories_fts(memories_fts, rowid, text) VALUES ('delete', ?, ?)",
                [(row["rowid"], row["text"]) for row in rows],
            )
        _forget_facts(conn, team, ids, fts=journal.dialect == "sqlite")
        forget_versions(conn, team, ids)
        return ids


def _forget_facts(conn: Conn, team: str, ids: list[str], *, fts: bool) -> None:
    """Drop these memories as sources; a fact with no source left goes, one with others stays."""
    gone = set(ids)
    affected: set[str] = set()
    for chunk in _chunks(ids):
        marks = ",".join("?" * len(chunk))
        affected.update(
            r[0] for r in conn.execute(f"SELECT DISTINCT fact_id FROM fact_sources WHERE memory_id IN ({marks})", chunk)
        )
        conn.execute(f"DELETE FROM fact_sources WHERE memory_id IN ({marks})", chunk)
    for fact_id in sorted(affected):
        fact = conn.execute(
            "SELECT rowid, text, memory_id FROM facts WHERE id = ? AND team = ?", (fact_id, team)
        ).fetchone()
        if fact is None:
            continue
        other = conn.execute(
            "SELECT memory_id FROM fact_sources WHERE fact_id = ? ORDER BY added_at LIMIT 1", (fact_id,)
        ).fetchone()
        if other is None:
            if fts:
                conn.execute(
                    "INSERT INTO facts_fts(facts_fts, rowid, text) VALUES ('delete', ?, ?)",
                    (fact["rowid"], fact["text"]),
                )
            conn.execute("DELETE FROM facts WHERE id = ?", (fact_id,))
            conn.execute(
                "INSERT INTO fact_purges (team, fact_id) VALUES (?, ?) ON CONFLICT DO NOTHING", (team, fact_id)
            )
        elif fact["memory_id"] in gone:
            # recall names a fact's memory: it must be one that still exists
            conn.execute("UPDATE facts SET memory_id = ? WHERE id = ?", (other[0], fact_id))


def pending(journal: Journal, limit: int = CHUNK) -> Pending:
    """Up to `limit` forgotten memories and deleted facts whose vectors may still exist."""
    out = Pending()
    with journal.reading() as conn:
        for row in conn.execute("SELECT team, id, text FROM memories WHERE status = ? LIMIT ?", (DELETED, limit)):
            out.memories.setdefault(row[0], []).append((row[1], row[2]))
        for row in conn.execute("SELECT team, fact_id FROM fact_purges LIMIT ?", (limit,)):
            out.facts.setdefault(row[0], []).append(row[1])
    return out


def purge(journal: Journal, done: Pending) -> None:
    """Step 2: the vectors of `done` are gone, so the rows that listed them go too."""
    with journal.transaction() as conn:
        for team, memories in done.memories.items():
            conn.executemany(
                "DELETE FROM memories WHERE id = ? AND team = ? AND status = ?",
                [(memory_id, team, DELETED) for memory_id, _ in memories],
            )
        for team, fact_ids in done.facts.items():
            conn.executemany(
                "DELETE FROM fact_purges WHERE team = ? AND fact_id = ?", [(team, fact_id) for fact_id in fact_ids]
            )
