"""Rebuild the vector store from the journal.

Vectors are derived state: every passage is a saved text and every active fact a journal row, so a
restore writes only the SQLite files and embeds them again here, with the same ids and metadata the
workers give them. Superseded facts get no vector (the workers remove theirs), forgotten memories
none either.

Used by restore (into a new store) and by `memory-service reindex` (see reindex_cli.py). Passages are
flagged unindexed first and flagged again as they are embedded, so a rebuild cut off half-way is
finished by the service's own passage indexer at its next start; facts need the command run again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..embedding.embedder import Embedder
from ..pipeline.passages import index_passages
from ..pipeline.vector_items import fact_item, item_metadata
from ..storage.consolidation import store_for
from ..storage.journal import DELETED, Journal, Memory
from ..storage.vectors import VectorItem, VectorStore
from .progress import Progress, Stage, no_progress

BATCH = 64


TEXTS, FACTS = Stage("embedding saved texts", "texts"), Stage("embedding facts", "facts")


@dataclass
class Reindexed:
    passages: int  # saved texts embedded (each in one or more windows)
    facts: int


def reindex(
    journal: Journal,
    embedder: Embedder,
    vectors: VectorStore,
    *,
    team: str | None = None,
    batch: int = BATCH,
    progress: Progress = no_progress,
) -> Reindexed:
    """Embed every live passage and active fact (of `team`, or of all teams) into `vectors`.

    The collections are meant to be empty (ids are upserted, so a vector left there is overwritten, but
    one whose memory is gone stays: drop the collections first).
    """
    scope, params = ("AND team = ?", (team,)) if team is not None else ("", ())
    with journal.transaction() as conn:
        conn.execute(f"UPDATE memories SET indexed = 0 WHERE status != ? {scope}", (DELETED, *params))
    with journal.reading() as conn:
        total = conn.execute(
            f"SELECT COUNT(*) AS n FROM memories WHERE indexed = 0 AND status != ? {scope}", (DELETED, *params)
        ).fetchone()["n"]
    passages = 0
    progress(TEXTS, 0, total)
    while True:
        with journal.reading() as conn:
            rows = conn.execute(
                f"SELECT * FROM memories WHERE indexed = 0 AND status != ? {scope} ORDER BY rowid LIMIT ?",
                (DELETED, *params, batch),
            ).fetchall()
        if not rows:
            break
        todo = [Memory.from_row(row) for row in rows]
        index_passages(todo, embedder, vectors)
        journal.mark_indexed([m.id for m in todo])
        passages += len(todo)
        progress(TEXTS, passages, max(total, passages))
    facts = _reindex_facts(journal, embedder, vectors, team, batch, progress)
    _reindex_consolidated(journal, embedder, vectors, team, batch)
    return Reindexed(passages=passages, facts=facts)


def _reindex_consolidated(
    journal: Journal, embedder: Embedder, vectors: VectorStore, team: str | None, batch: int
) -> None:
    """Consolidated items too: their rows stay, so their vectors must come back with the rest."""
    from ..consolidation.worker import index_items

    store = store_for(journal)
    store.mark_unindexed(team)
    while todo := store.unindexed(batch, team):
        index_items(store, embedder, vectors, todo)


def _reindex_facts(
    journal: Journal, embedder: Embedder, vectors: VectorStore, team: str | None, batch: int, progress: Progress
) -> int:
    scope, params = ("AND f.team = ?", (team,)) if team is not None else ("", ())
    done, after = 0, 0
    with journal.reading() as conn:
        total = conn.execute(
            f"SELECT COUNT(*) AS n FROM facts f WHERE f.superseded_by IS NULL {scope}", params
        ).fetchone()["n"]
    progress(FACTS, 0, total)
    while True:
        with journal.reading() as conn:
            rows = conn.execute(
                "SELECT f.rowid, f.id, f.team, f.agent_id, f.memory_id, f.text, f.tags, f.created_at, m.run_id "
                "FROM facts f LEFT JOIN memories m ON m.id = f.memory_id "
                f"WHERE f.superseded_by IS NULL AND f.rowid > ? {scope} ORDER BY f.rowid LIMIT ?",
                (after, *params, batch),
            ).fetchall()
        if not rows:
            return done
        after = rows[-1]["rowid"]
        embeddings = embedder.embed([row["text"] for row in rows])
        by_team: dict[str, list[VectorItem]] = {}
        for row, vec in zip(rows, embeddings):
            meta = item_metadata(
                row["memory_id"], row["agent_id"], row["run_id"], row["created_at"], json.loads(row["tags"])
            )
            by_team.setdefault(row["team"], []).append(fact_item(row["id"], row["text"], vec, meta))
        for team, items in by_team.items():
            vectors.upsert(team, items)
        done += len(rows)
        progress(FACTS, done, max(total, done))
