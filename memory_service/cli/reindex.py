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

from typing import Any

from ..config import Settings
from ..ops.progress import Progress, no_progress
from ..storage.datadir import JOURNAL_FILE, DataDir, DataDirBusy


class ReindexError(RuntimeError):
    """A rebuild that cannot go ahead; the message says why and what to do."""


def run_reindex(settings: Settings, team: str | None = None, progress: Progress = no_progress) -> dict[str, Any]:
    """Drop the vectors of `team` (of every team when None) and embed them again; returns a summary."""
    from ..storage.vectors import ChromaUnreachable

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
    from ..embedding.embedder import embedder_for
    from ..embedding.selection import model_for
    from ..ops.reindex import reindex

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
