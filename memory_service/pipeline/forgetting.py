"""Forget memories so that no step of the way can leave an orphan that recall returns.

The journal marks them forgotten first (one transaction: reads skip them from then on), then their
passage and fact vectors are removed, then the rows are purged. A crash between the steps leaves
rows marked `deleted`; `finish_pending` (run at start-up and after every forget) completes them.
A consolidated item citing a forgotten memory or a removed fact is dropped on the way (see
storage/consolidation.py): no item outlives one of its sources.
"""

from __future__ import annotations

import threading

from memory_service.pipeline.passages import passage_windows
from memory_service.storage.consolidation import ConsolidationStore, store_for
from memory_service.storage.forget import Pending, mark_forgotten, pending, purge
from memory_service.storage.journal import Journal
from memory_service.storage.vectors import VectorStore

_lock = threading.Lock()  # one purge at a time: two would only repeat each other's deletes


def passage_ids(memory_id: str, text: str) -> list[str]:
    """The vector ids `index_passages` gives a text's windows."""
    return [f"p:{memory_id}:{start}" for start, _ in passage_windows(text)]


def finish_pending(journal: Journal, vectors: VectorStore) -> int:
    """Remove the vectors of every forgotten-but-not-purged memory and fact; returns memories purged."""
    purged = 0
    with _lock:
        while True:
            todo: Pending = pending(journal)
            if not todo:
                _purge_consolidated(store_for(journal), vectors)
                return purged
            consolidated = store_for(journal)
            for team in set(todo.memories) | set(todo.facts):
                # consolidated items citing a forgotten memory or a removed fact go first (rows at once)
                consolidated.drop_citing(team, [m for m, _ in todo.memories.get(team, [])], todo.facts.get(team, []))
                ids = [i for memory_id, text in todo.memories.get(team, []) for i in passage_ids(memory_id, text)]
                vectors.delete(team, ids + todo.facts.get(team, []))
            _purge_consolidated(consolidated, vectors)
            purge(journal, todo)
            purged += sum(len(m) for m in todo.memories.values())


def _purge_consolidated(store: ConsolidationStore, vectors: VectorStore) -> None:
    """The vectors of dropped consolidated items (their rows are gone already: recall never shows them)."""
    for team, ids in store.purges().items():
        vectors.delete(team, ids)
        store.purged(team, ids)


def forget(
    journal: Journal,
    vectors: VectorStore,
    team: str,
    *,
    memory_ids: list[str] | None = None,
    agent_id: str | None = None,
    run_id: str | None = None,
) -> list[str]:
    """Forget the team's memories matching the selector (text, vectors, keyword entries, sole-source facts)."""
    ids = mark_forgotten(journal, team, memory_ids=memory_ids, agent_id=agent_id, run_id=run_id)
    if ids:
        finish_pending(journal, vectors)
    return ids
