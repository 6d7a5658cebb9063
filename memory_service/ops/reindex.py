"""Rebuild the vector store from the journal.

Vectors are derived state: every passage is a saved text and every active fact a journal row, so a
lost, damaged or stale vector store (the data dir's `chroma/`, or the collections on the server
MEMORY_CHROMA_URL names) is rebuilt by dropping it and embedding again here, with the same ids and
metadata the workers give them. Superseded facts get no vector (the workers remove theirs), forgotten
memories none either.

`reindex` embeds one journal into one store: restore uses it on its new store. `run_reindex` is the
whole rebuild of a data dir, behind `memory-service reindex` (cli/data.py) and `migrate` (store_copy.py).
A service must not run on the data dir meanwhile: it would write into collections being dropped and
answer recalls from half a store, so run_reindex takes the data dir's exclusive lock and refuses while a
service holds it. Passages are flagged unindexed first and flagged again as they are embedded, so a
rebuild cut off half-way is finished by the service's own passage indexer at its next start; facts need
the command run again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..config import Settings
from ..embedding.embedder import Embedder, embedder_for
from ..embedding.selection import model_for
from ..pipeline.passages import index_passages
from ..pipeline.vector_items import fact_item, item_metadata
from ..storage.consolidation import store_for
from ..storage.datadir import JOURNAL_FILE, DataDir, DataDirBusy
from ..storage.journal import DELETED, Journal, Memory
from ..storage.vectors import ChromaUnreachable, VectorItem, VectorStore
from .progress import Progress, Stage, no_progress

BATCH = 64


TEXTS, FACTS = Stage("embedding saved texts", "texts"), Stage("embedding facts", "facts")


@dataclass
class Reindexed:
    passages: int  # saved texts embedded (each in one or more windows)
    facts: int


class ReindexError(RuntimeError):
    """A rebuild that cannot go ahead; the message says why and what to do."""


def run_reindex(settings: Settings, team: str | None = None, progress: Progress = no_progress) -> dict[str, Any]:
    """Drop the vectors of `team` (of every team when None) and embed them again; returns a summary."""
    data = DataDir(settings.data_dir.absolute())
    if not settings.database_url and not data.has_journal():
        raise ReindexError(
            f"no {JOURNAL_FILE} in {data.path}: is it a memory-service data dir? (--data-dir, env MEMORY_DATA_DIR)"
        )
    try:
        lock = data.lock(exclusive=True)
    except DataDirBusy:
        raise ReindexError(
            f"a memory-service is running on {data.path}: stop it, then reindex (the rebuild drops the vectors first)"
        ) from None
    try:
        return _rebuild(settings, data, team, progress)
    except ChromaUnreachable as exc:
        raise ReindexError(str(exc)) from None
    finally:
        lock.release()


def _rebuild(settings: Settings, data: DataDir, team: str | None, progress: Progress) -> dict[str, Any]:
    model, _ = model_for(settings, data)  # MEMORY_EMBEDDER_MODEL, else the one the vectors were made with
    stores = data.open_stores(settings)  # MEMORY_DATABASE_URL: the shared journal (stop every process first)
    try:
        store = settings.chroma_url or str(data.vectors_dir)
        if settings.chroma_url is None and team is None:
            # the whole embedded store goes: also what mends one that no longer opens
            data.remove_vectors()
            vectors, dropped = data.open_vectors(), None
        else:
            vectors = data.open_vectors(settings.chroma_url)
            dropped = vectors.drop(team)
        try:
            done = reindex(stores.journal, embedder_for(settings, model), vectors, team=team, progress=progress)
        finally:
            vectors.close()
    finally:
        stores.close()
    if team is None:  # every vector is now `model`'s (one team's rebuild leaves the others as they were)
        data.record_embedder(model)
    return {
        "reindexed": store,
        "team": team,
        "embedder_model": model,
        "collections_dropped": dropped,
        "passages_embedded": done.passages,
        "facts_embedded": done.facts,
    }


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
