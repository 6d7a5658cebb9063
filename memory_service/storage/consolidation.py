"""Consolidated items: one line per subject summing up its facts, with every fact and memory it rests on.

Kept in tables of their own next to the journal (same database, SQLite or PostgreSQL):

- `consolidated`: the item (id `c:...`, team, agent, subject, part, text) and the digest of the fact ids it
  was written from: a group whose digest is unchanged is not written again (idempotent, and a restart
  resumes with the groups not yet written);
- `consolidated_sources`: (item, fact, memory) for each source, so recall shows them all and forgetting a
  memory finds the items that cite it;
- `consolidated_purges`: vectors still to remove after an item was dropped (survives a crash);
- `consolidation_runs`: the log of passes: when, by whom, how it ended, what it wrote.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from .consolidation_runs import RunLog
from .journal import DELETED, Journal

__all__ = [
    "ConsolidationStore",
    "Item",
    "SourceFact",
    "store_for",
]

CHUNK = 500  # ids per statement, well under SQLite's variable limit

_TABLES = """
CREATE TABLE IF NOT EXISTS consolidated (
    id TEXT PRIMARY KEY,
    team TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    subject TEXT NOT NULL,
    part INTEGER NOT NULL,
    text TEXT NOT NULL,
    tags TEXT NOT NULL DEFAULT '[]',
    memory_id TEXT NOT NULL,
    created_at {real} NOT NULL,
    occurred_at {real},
    updated_at {real} NOT NULL,
    digest TEXT NOT NULL,
    indexed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS consolidated_team ON consolidated(team, agent_id, subject);
CREATE TABLE IF NOT EXISTS consolidated_sources (
    item_id TEXT NOT NULL,
    fact_id TEXT NOT NULL,
    memory_id TEXT NOT NULL,
    PRIMARY KEY (item_id, fact_id, memory_id)
);
CREATE INDEX IF NOT EXISTS consolidated_sources_memory ON consolidated_sources(memory_id);
CREATE INDEX IF NOT EXISTS consolidated_sources_fact ON consolidated_sources(fact_id);
CREATE TABLE IF NOT EXISTS consolidated_purges (
    team TEXT NOT NULL,
    item_id TEXT NOT NULL,
    PRIMARY KEY (team, item_id)
);
CREATE TABLE IF NOT EXISTS consolidation_runs (
    id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    started_at {real} NOT NULL,
    beat_at {real} NOT NULL,
    ended_at {real},
    outcome TEXT NOT NULL,
    groups_due INTEGER NOT NULL DEFAULT 0,
    written INTEGER NOT NULL DEFAULT 0,
    removed INTEGER NOT NULL DEFAULT 0,
    detail TEXT
);
CREATE INDEX IF NOT EXISTS consolidation_runs_started ON consolidation_runs(started_at);
"""
SQLITE_SCHEMA = _TABLES.format(real="REAL")
POSTGRES_SCHEMA = _TABLES.format(real="DOUBLE PRECISION")


@dataclass
class SourceFact:
    """An active fact as consolidation groups it: its text, who said it, and every memory it rests on."""

    id: str
    agent_id: str
    text: str
    tags: list[str]
    created_at: float
    memory_ids: list[str]
    occurred_at: float | None = None
    occurred_day: str | None = None


@dataclass
class Item:
    id: str
    team: str
    agent_id: str
    subject: str
    part: int
    text: str
    tags: list[str]
    memory_id: str
    created_at: float
    occurred_at: float | None
    digest: str
    sources: list[tuple[str, str]] = field(default_factory=list)  # (fact id, memory id)

    @property
    def fact_ids(self) -> list[str]:
        return list(dict.fromkeys(f for f, _ in self.sources))

    @property
    def memory_ids(self) -> list[str]:
        return list(dict.fromkeys(m for _, m in self.sources))


def _chunks(ids: list[str]) -> list[list[str]]:
    return [ids[i : i + CHUNK] for i in range(0, len(ids), CHUNK)]


class ConsolidationStore(RunLog):
    """The tables above on the journal's database (created on first use, both dialects)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        journal.db.create_schema(SQLITE_SCHEMA, POSTGRES_SCHEMA)

    # -- what the pass reads ----------------------------------------------------------------------------

    def teams(self) -> list[str]:
        with self.journal.reading() as conn:
            return [r[0] for r in conn.execute("SELECT DISTINCT team FROM facts WHERE superseded_by IS NULL")]

    def recent_facts(self, team: str, limit: int) -> list[SourceFact]:
        """The team's newest active facts with all their source memories (live ones) and when they happened."""
        with self.journal.reading() as conn:
            rows = conn.execute(
                "SELECT id, agent_id, text, tags, created_at FROM facts WHERE team = ? AND superseded_by IS NULL "
                "ORDER BY created_at DESC, id LIMIT ?",
                (team, limit),
            ).fetchall()
            facts = {r[0]: SourceFact(r[0], r[1], r[2], json.loads(r[3]), float(r[4]), []) for r in rows}
            for chunk in _chunks(list(facts)):
                marks = ",".join("?" * len(chunk))
                for r in conn.execute(
                    f"SELECT s.fact_id, s.memory_id, COALESCE(m.occurred_at, m.created_at), m.occurred_day "
                    f"FROM fact_sources s JOIN memories m ON m.id = s.memory_id "
                    f"WHERE s.fact_id IN ({marks}) AND m.status != ? ORDER BY s.added_at",
                    (*chunk, DELETED),
                ):
                    fact = facts[r[0]]
                    if r[1] not in fact.memory_ids:
                        fact.memory_ids.append(r[1])
                    if fact.occurred_at is None:  # the first source: when it was first said
                        fact.occurred_at, fact.occurred_day = float(r[2]), r[3]
        return [f for f in facts.values() if f.memory_ids]

    def digests(self, team: str) -> dict[str, str]:
        """item id -> digest of the fact ids it was written from."""
        with self.journal.reading() as conn:
            return {r[0]: r[1] for r in conn.execute("SELECT id, digest FROM consolidated WHERE team = ?", (team,))}

    def items_by_ids(self, team: str, item_ids: list[str]) -> dict[str, Item]:
        """The team's items among these ids, with their sources (recall reads them this way)."""
        out: dict[str, Item] = {}
        if not item_ids:
            return out
        with self.journal.reading() as conn:
            for chunk in _chunks(list(dict.fromkeys(item_ids))):
                marks = ",".join("?" * len(chunk))
                for r in conn.execute(
                    f"SELECT id, team, agent_id, subject, part, text, tags, memory_id, created_at, occurred_at, "
                    f"digest FROM consolidated WHERE id IN ({marks}) AND +team = ?",
                    (*chunk, team),
                ):
                    out[r[0]] = Item(
                        r[0],
                        r[1],
                        r[2],
                        r[3],
                        int(r[4]),
                        r[5],
                        json.loads(r[6]),
                        r[7],
                        float(r[8]),
                        None if r[9] is None else float(r[9]),
                        r[10],
                    )
                for r in conn.execute(
                    f"SELECT item_id, fact_id, memory_id FROM consolidated_sources "
                    f"WHERE item_id IN ({marks}) ORDER BY memory_id",
                    chunk,
                ):
                    item = out.get(r[0])
                    if item is not None:
                        item.sources.append((r[1], r[2]))
        return out

    def vector_rows(self, team: str) -> list[tuple[str, str, tuple[str, ...], float]]:
        """(id, agent, tags, created_at) of the team's items: the filtered vector search's directory."""
        with self.journal.reading() as conn:
            rows = conn.execute(
                "SELECT id, agent_id, tags, created_at FROM consolidated WHERE team = ?", (team,)
            ).fetchall()
        return [(r[0], r[1], tuple(sorted(json.loads(r[2]))), float(r[3])) for r in rows]

    def count(self, team: str | None = None) -> int:
        scope, args = (" WHERE team = ?", (team,)) if team is not None else ("", ())
        with self.journal.reading() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM consolidated" + scope, args).fetchone()[0])

    def unindexed(self, limit: int, team: str | None = None) -> list[Item]:
        """Items whose vector was never written (a stop between the commit and the upsert, a reindex)."""
        scope, args = ("AND team = ?", (team,)) if team is not None else ("", ())
        with self.journal.reading() as conn:
            rows = conn.execute(
                f"SELECT id, team FROM consolidated WHERE indexed = 0 {scope} LIMIT ?", (*args, limit)
            ).fetchall()
        out: list[Item] = []
        for team in {r[1] for r in rows}:
            out += self.items_by_ids(team, [r[0] for r in rows if r[1] == team]).values()
        return out

    def save_waiting(self) -> bool:
        """A save is queued or being extracted: consolidation must not hold the model."""
        with self.journal.reading() as conn:
            return (
                conn.execute("SELECT 1 FROM memories WHERE status IN ('queued', 'extracting') LIMIT 1").fetchone()
                is not None
            )

    # -- writes ---------------------------------------------------------------------------------------

    def write(self, item: Item, now: float | None = None) -> bool:
        """Store (or replace) an item and its sources in one transaction; False, writing nothing, when one of
        its facts was superseded or forgotten or one of its memories forgotten meanwhile."""
        now = time.time() if now is None else now
        with self.journal.transaction() as conn:
            live_facts = 0
            for chunk in _chunks(item.fact_ids):
                marks = ",".join("?" * len(chunk))
                live_facts += int(
                    conn.execute(
                        f"SELECT COUNT(*) FROM facts WHERE id IN ({marks}) AND superseded_by IS NULL", chunk
                    ).fetchone()[0]
                )
            live_memories = 0
            for chunk in _chunks(item.memory_ids):
                marks = ",".join("?" * len(chunk))
                live_memories += int(
                    conn.execute(
                        f"SELECT COUNT(*) FROM memories WHERE id IN ({marks}) AND status != ?", (*chunk, DELETED)
                    ).fetchone()[0]
                )
            if live_facts != len(set(item.fact_ids)) or live_memories != len(set(item.memory_ids)):
                return False
            conn.execute("DELETE FROM consolidated WHERE id = ?", (item.id,))
            conn.execute("DELETE FROM consolidated_sources WHERE item_id = ?", (item.id,))
            conn.execute(
                "INSERT INTO consolidated (id, team, agent_id, subject, part, text, tags, memory_id, created_at, "
                "occurred_at, updated_at, digest, indexed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
                (
                    item.id,
                    item.team,
                    item.agent_id,
                    item.subject,
                    item.part,
                    item.text,
                    json.dumps(item.tags),
                    item.memory_id,
                    item.created_at,
                    item.occurred_at,
                    now,
                    item.digest,
                ),
            )
            conn.executemany(
                "INSERT INTO consolidated_sources (item_id, fact_id, memory_id) VALUES (?, ?, ?)",
                sorted({(item.id, f, m) for f, m in item.sources}),
            )
        return True

    def mark_unindexed(self, team: str | None = None) -> None:
        """Every item (of a team) to be embedded again: after its vectors were dropped (reindex)."""
        scope, args = ("WHERE team = ?", (team,)) if team is not None else ("", ())
        with self.journal.transaction() as conn:
            conn.execute(f"UPDATE consolidated SET indexed = 0 {scope}", args)

    def mark_indexed(self, item_ids: list[str]) -> None:
        if item_ids:
            with self.journal.transaction(durable=False) as conn:
                conn.executemany("UPDATE consolidated SET indexed = 1 WHERE id = ?", [(i,) for i in item_ids])

    def drop(self, team: str, item_ids: list[str]) -> int:
        """Remove these items (rows at once, their vectors queued in `consolidated_purges`)."""
        return self._drop_where(team, "id", item_ids)

    def drop_citing(self, team: str, memory_ids: list[str] = (), fact_ids: list[str] = ()) -> int:  # type: ignore[assignment]
        """Remove the items that cite any of these memories or facts: an item never outlives a source."""
        return self._drop_where(team, "memory_id", list(memory_ids), via_sources=True) + self._drop_where(
            team, "fact_id", list(fact_ids), via_sources=True
        )

    def drop_stale(self, team: str) -> int:
        """Remove items resting on a fact that is no longer active (superseded, or deleted by a forget)."""
        with self.journal.reading() as conn:
            ids = [
                r[0]
                for r in conn.execute(
                    "SELECT DISTINCT c.id FROM consolidated c JOIN consolidated_sources s ON s.item_id = c.id "
                    "LEFT JOIN facts f ON f.id = s.fact_id LEFT JOIN memories m ON m.id = s.memory_id "
                    "WHERE c.team = ? AND (f.id IS NULL OR f.superseded_by IS NOT NULL OR m.id IS NULL "
                    "OR m.status = ?)",
                    (team, DELETED),
                )
            ]
        return self.drop(team, ids)

    def _drop_where(self, team: str, column: str, values: list[str], via_sources: bool = False) -> int:
        dropped = 0
        for chunk in _chunks(list(dict.fromkeys(values))):
            marks = ",".join("?" * len(chunk))
            with self.journal.transaction() as conn:
                if via_sources:
                    ids = [
                        r[0]
                        for r in conn.execute(
                            f"SELECT DISTINCT s.item_id FROM consolidated_sources s JOIN consolidated c ON c.id = s.item_id "
                            f"WHERE s.{column} IN ({marks}) AND c.team = ?",
                            (*chunk, team),
                        )
                    ]
                else:
                    ids = [
                        r[0]
                        for r in conn.execute(
                            f"SELECT id FROM consolidated WHERE id IN ({marks}) AND team = ?", (*chunk, team)
                        )
                    ]
                for part in _chunks(ids):
                    item_marks = ",".join("?" * len(part))
                    conn.execute(f"DELETE FROM consolidated WHERE id IN ({item_marks})", part)
                    conn.execute(f"DELETE FROM consolidated_sources WHERE item_id IN ({item_marks})", part)
                    conn.execute(
                        f"DELETE FROM consolidated_purges WHERE team = ? AND item_id IN ({item_marks})", (team, *part)
                    )
                    conn.executemany(
                        "INSERT INTO consolidated_purges (team, item_id) VALUES (?, ?)", [(team, i) for i in part]
                    )
                dropped += len(ids)
        return dropped

    def purges(self) -> dict[str, list[str]]:
        """Vectors of dropped items still to remove, by team."""
        with self.journal.reading() as conn:
            rows = conn.execute("SELECT team, item_id FROM consolidated_purges").fetchall()
        out: dict[str, list[str]] = {}
        for team, item_id in rows:
            out.setdefault(team, []).append(item_id)
        return out

    def purged(self, team: str, item_ids: list[str]) -> None:
        with self.journal.transaction() as conn:
            conn.executemany(
                "DELETE FROM consolidated_purges WHERE team = ? AND item_id = ?", [(team, i) for i in item_ids]
            )


def store_for(journal: Journal) -> ConsolidationStore:
    """The one store of a journal (its tables created once), for the paths that only hold the journal.

    The journal keeps it (`Journal.attached`): no registry outside the objects that own it.
    """
    return journal.attached("consolidation", lambda: ConsolidationStore(journal))
