"""Forget memories so that no step of the way can leave an orphan that recall returns.

The journal marks them forgotten first (one transaction: reads skip them from then on), then their
passage and fact vectors are removed, then the rows are purged. A crash between the steps leaves
rows marked `deleted`; `Forgetter.finish_pending` (run at start-up, after every forget and after every
job's commit) completes them. A consolidated item citing a forgotten memory or a removed fact is
dropped on the way (see storage/consolidation.py): no item outlives one of its sources.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..storage.consolidation import ConsolidationStore
from ..storage.forget import Pending, mark_forgotten, pending, purge
from ..storage.journal import Journal
from ..storage.vectors import VectorStore
from .passages import passage_ids


@dataclass
class Forgetter:
    """Forgets, and finishes what a forget (or a supersede) left to remove: one per service, built by it.

    It owns the lock that lets one purge run at a time: two at once would only repeat each other's deletes.
    """

    journal: Journal
    vectors: VectorStore
    consolidated: ConsolidationStore
    _purging: threading.Lock = field(default_factory=threading.Lock)

    def forget(
        self,
        team: str,
        *,
        memory_ids: list[str] | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
    ) -> list[str]:
        """Forget the team's memories matching the selector (text, vectors, keyword entries, sole-source facts)."""
        ids = mark_forgotten(self.journal, team, memory_ids=memory_ids, agent_id=agent_id, run_id=run_id)
        if ids:
            self.finish_pending()
        return ids

    def finish_pending(self) -> int:
        """Remove the vectors of every forgotten-but-not-purged memory and fact; returns memories purged."""
        purged = 0
        with self._purging:
            while True:
                todo: Pending = pending(self.journal)
                if not todo:
                    self._purge_consolidated()
                    return purged
                for team in set(todo.memories) | set(todo.facts):
                    forgotten = todo.memories.get(team, [])
                    removed_facts = todo.facts.get(team, [])
                    # consolidated items citing a forgotten memory or a removed fact go first (rows at once)
                    self.consolidated.drop_citing(team, [m for m, _ in forgotten], removed_facts)
                    ids = [i for memory_id, text in forgotten for i in passage_ids(memory_id, text)]
                    self.vectors.delete(team, ids + removed_facts)
                self._purge_consolidated()
                purge(self.journal, todo)
                purged += sum(len(m) for m in todo.memories.values())

    def _purge_consolidated(self) -> None:
        """The vectors of dropped consolidated items (their rows are gone already: recall never shows them)."""
        for team, ids in self.consolidated.purges().items():
            self.vectors.delete(team, ids)
            self.consolidated.purged(team, ids)
