"""`memory-service reindex [--team T]`: rebuild the vector store from the journal.

Chroma holds nothing the journal does not: every passage is a saved text and every active fact a
journal row. So a lost, damaged or stale vector store (the data dir's `chroma/`, or the collections
on the server MEMORY_CHROMA_URL names) is rebuilt by dropping it and embedding again, with the ids
and metadata the workers give (see reindex.py).

A service must not run on the data dir meanwhile: it would write into collections being dropped and
answer recalls from half a store. The command takes the data dir's exclusive lock, so it refuses
while a service holds it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from memory_service.config import Settings
from memory_service.storage.datalock import DataDirBusy, DataDirLock

JOURNAL = "journal.sqlite3"
VECTORS = "chroma"


class ReindexError(RuntimeError):
    """A rebuild that cannot go ahead; the message says why and what to do."""


def run_reindex(settings: Settings, team: str | None = None) -> dict[str, Any]:
    """Drop the vectors of `team` (of every team when None) and embed them again; returns a summary."""
    from memory_service.storage.vectors import ChromaUnreachable

    data_dir = settings.data_dir.absolute()
    if not settings.database_url and not (data_dir / JOURNAL).is_file():
        raise ReindexError(
            f"no {JOURNAL} in {data_dir}: is it a memory-service data dir? (--data-dir, env MEMORY_DATA_DIR)"
        )
    lock = DataDirLock(data_dir)
    try:
        lock.acquire(exclusive=True, wait=False)
    except DataDirBusy:
        raise ReindexError(
            f"a memory-service is running on {data_dir}: stop it, then reindex (the rebuild drops the vectors first)"
        ) from None
    try:
        return _rebuild(settings, data_dir, team)
    except ChromaUnreachable as exc:
        raise ReindexError(str(exc)) from None
    finally:
        lock.release()


def _rebuild(settings: Settings, data_dir: Path, team: str | None) -> dict[str, Any]:
    from memory_service.embedding.embedder import load_embedder
    from memory_service.ops.reindex import reindex
    from memory_service.storage.database import open_database
    from memory_service.storage.journal import Journal
    from memory_service.storage.vectors import VectorStore

    database = open_database(settings)  # MEMORY_DATABASE_URL: the shared journal (stop every process first)
    journal = Journal(database or data_dir / JOURNAL)
    try:
        store = settings.chroma_url or str(data_dir / VECTORS)
        if settings.chroma_url is None and team is None:
            # the whole embedded store goes: also what mends one that no longer opens
            shutil.rmtree(data_dir / VECTORS, ignore_errors=True)
            vectors, dropped = VectorStore(data_dir / VECTORS), None
        else:
            vectors = VectorStore(data_dir / VECTORS, url=settings.chroma_url)
            dropped = vectors.drop(team)
        try:
            embedder = load_embedder(settings.embedder, threads=settings.embed_threads, cache_dir=settings.cache_dir)
            done = reindex(journal, embedder, vectors, team=team)
        finally:
            vectors.close()
    finally:
        journal.close()
        if database is not None:
            database.close()
    return {
        "reindexed": store,
        "team": team,
        "collections_dropped": dropped,
        "passages_embedded": done.passages,
        "facts_embedded": done.facts,
    }
