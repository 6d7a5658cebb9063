"""The journal: every saved text, its extraction job, and the facts it produced.

On SQLite (the embedded default) it is WAL with `synchronous=FULL`; on PostgreSQL (`MEMORY_DATABASE_URL`)
a committed transaction is durable. Either way a row is on disk before `/remember` answers. The job
queue lives in the same table as the text: a job cannot be lost without losing its text. A keyword
index is written in the same transaction, so a saved text is findable by recall the moment it is acked,
before any embedding or model work.

`Journal` is assembled from one module per job: `jobs` (the queue and its leases), `facts` (storing and
reading facts), `keyword` (the keyword leg of recall); the tables are in `schema` (older journals are
upgraded by `schema_upgrades`), the records in `records`. All methods are synchronous and thread-safe;
the async code calls them through `asyncio.to_thread`.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .database import Database, SqliteDatabase
from .facts import FactStore
from .jobs import JobQueue
from .keyword import KeywordSearch, PorterStems, fts_query, fts_words, has_tag, json_items
from .records import (
    DELETED,
    DONE,
    EXTRACTING,
    FAILED,
    LOST,
    QUEUED,
    Fact,
    FactPlan,
    KeywordHit,
    Memory,
    NewFact,
    tags_of,
)
from .schema import POSTGRES_SCHEMA, SCHEMA
from .schema_upgrades import open_journal_schema

T = TypeVar("T")

__all__ = [
    "DELETED",
    "DONE",
    "EXTRACTING",
    "FAILED",
    "LOST",
    "QUEUED",
    "Fact",
    "FactPlan",
    "Journal",
    "KeywordHit",
    "Memory",
    "NewFact",
    "POSTGRES_SCHEMA",
    "SCHEMA",
    "fts_query",
    "fts_words",
    "has_tag",
    "json_items",
]


class Journal(JobQueue, FactStore, KeywordSearch):
    """The journal on a `Database`: SQLite under the data dir, or PostgreSQL when given one."""

    def __init__(self, store: Path | Database) -> None:
        self._owns = not isinstance(store, Database)  # a shared database is closed by whoever opened it
        self.db: Database = store if isinstance(store, Database) else SqliteDatabase(store, synchronous="FULL")
        open_journal_schema(self.db)
        if isinstance(self.db, SqliteDatabase):
            for fts in ("memories_fts", "facts_fts"):  # document frequencies, for the bounded keyword search
                self.db.on_reader(
                    f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{fts}_vocab USING fts5vocab(main, {fts}, 'row')"
                )
        self._stems = PorterStems()
        # stores built on this journal once and living as long as it (the consolidation store): kept here,
        # not in a module registry, and keyed by name so this module needs none of theirs
        self._attached: dict[str, Any] = {}
        self._attached_lock = threading.Lock()
        self._df_cache: dict[tuple[str, str], tuple[int, float]] = {}
        self._long_backlog: tuple[float, int, int] | None = None  # (counted at, jobs, chars): see backlog()
        self._team_locks: dict[str, threading.Lock] = {}
        self._team_locks_guard = threading.Lock()

    @property
    def dialect(self) -> str:
        return self.db.dialect

    def attached(self, name: str, make: Callable[[], T]) -> T:
        """The store called `name` built on this journal, made by `make` on first use and kept with it."""
        with self._attached_lock:
            if name not in self._attached:
                self._attached[name] = make()
            return self._attached[name]

    def close(self) -> None:
        self._stems.close()
        if self._owns:
            self.db.close()

    def transaction(self, *, durable: bool = True) -> Any:
        """One write transaction, for the storage modules built on the journal (`durable`: see Database)."""
        return self.db.transaction(durable=durable)

    def reading(self) -> Any:
        """A read connection, for the storage modules built on the journal."""
        return self.db.reading()

    def insert(
        self,
        *,
        team: str,
        agent_id: str,
        text: str,
        run_id: str | None,
        tags: list[str],
        metadata: dict[str, Any],
        idempotency_key: str | None,
        budget_s: float,
        now: float | None = None,
        occurred_at: float | None = None,
        occurred_day: str | None = None,
        pinned: bool = False,
    ) -> tuple[Memory, bool]:
        """Commit a text and its job; returns (memory, created). An idempotency hit returns the first one.
        `pinned` (saved by a key pinned to `agent_id`) is kept with the job: its worker decides facts among
        that agent's only.

        The insert skips on a conflict instead of failing: two processes saving the same key at once both
        answer with the one row that won. A forgotten memory's key is free (forgetting clears it; a row
        forgotten by an older version still holding one gives it up here): the save is a new one.
        """
        now = time.time() if now is None else now
        with self.db.transaction() as conn:
            while True:  # again only when the row that took the key was forgotten in between
                if idempotency_key is not None:
                    row = conn.execute(
                        "SELECT * FROM memories WHERE team = ? AND idempotency_key = ?", (team, idempotency_key)
                    ).fetchone()
                    if row is not None and row["status"] != DELETED:
                        return Memory.from_row(row), False
                    if row is not None:
                        conn.execute("UPDATE memories SET idempotency_key = NULL WHERE id = ?", (row["id"],))
                memory_id = "mem_" + uuid.uuid4().hex
                inserted = conn.execute(
                    """INSERT INTO memories (id, team, agent_id, run_id, text, tags, metadata, idempotency_key,
                       created_at, next_attempt_at, deadline_at, occurred_at, occurred_day, pinned)
                       VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING""",
                    (
                        memory_id,
                        team,
                        agent_id,
                        run_id,
                        text,
                        json.dumps(tags),
                        json.dumps(metadata),
                        idempotency_key,
                        now,
                        now,
                        now + budget_s,
                        occurred_at,
                        occurred_day,
                        1 if pinned else 0,
                    ),
                ).rowcount
                if inserted:
                    row = conn.execute("SELECT * FROM memories WHERE id = ?", (memory_id,)).fetchone()
                    return Memory.from_row(row), True

    def mark_indexed(self, memory_ids: list[str]) -> None:
        with self.db.transaction(durable=False) as conn:
            conn.executemany("UPDATE memories SET indexed = 1 WHERE id = ?", [(m,) for m in memory_ids])

    def get(self, team: str, memory_id: str) -> Memory | None:
        with self.db.reading() as conn:
            row = conn.execute(
                "SELECT * FROM memories WHERE id = ? AND +team = ? AND status != ?", (memory_id, team, DELETED)
            ).fetchone()
        return Memory.from_row(row) if row else None

    def get_many(self, team: str, memory_ids: list[str]) -> dict[str, Memory]:
        if not memory_ids:
            return {}
        marks = ",".join("?" * len(memory_ids))
        with self.db.reading() as conn:
            rows = conn.execute(
                f"SELECT * FROM memories WHERE id IN ({marks}) AND +team = ? AND status != ?",
                (*memory_ids, team, DELETED),
            ).fetchall()
        return {row["id"]: Memory.from_row(row) for row in rows}

    def recall_rows(self, team: str, memory_ids: list[str]) -> dict[str, tuple[str, float, tuple[str, ...], str]]:
        """(agent_id, created_at, tags, text) of the team's live memories among these ids: what recall shows."""
        if not memory_ids:
            return {}
        marks = ",".join("?" * len(memory_ids))
        with self.db.reading() as conn:
            rows = conn.execute(
                f"SELECT id, agent_id, created_at, tags, text FROM memories WHERE id IN ({marks}) AND +team = ? "
                "AND status != ?",
                (*memory_ids, team, DELETED),
            ).fetchall()
        return {r[0]: (r[1], float(r[2]), tags_of(r[3]), r[4]) for r in rows}

    def live(self, memory_ids: list[str]) -> set[str]:
        """Which of these ids still exist and are not forgotten (any team: for workers, never for routes)."""
        if not memory_ids:
            return set()
        marks = ",".join("?" * len(memory_ids))
        with self.db.reading() as conn:
            rows = conn.execute(
                f"SELECT id FROM memories WHERE id IN ({marks}) AND status != ?", (*memory_ids, DELETED)
            ).fetchall()
        return {row[0] for row in rows}

    def unindexed(self, limit: int) -> list[Memory]:
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT * FROM memories WHERE indexed = 0 AND status != ? ORDER BY created_at LIMIT ?", (DELETED, limit)
            ).fetchall()
        return [Memory.from_row(r) for r in rows]

    def counts(self) -> dict[str, int]:
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT status, COUNT(*) FROM memories WHERE status != ? GROUP BY status", (DELETED,)
            ).fetchall()
            facts = conn.execute("SELECT COUNT(*) FROM facts WHERE superseded_by IS NULL").fetchone()[0]
        out = {status: 0 for status in (QUEUED, EXTRACTING, DONE, FAILED)}
        out.update({row[0]: row[1] for row in rows})
        out["facts"] = facts
        return out
