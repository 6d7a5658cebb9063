"""Forget memories so that no step of the way can leave an orphan that recall returns.

The journal marks them forgotten first (one transaction: reads skip them from then on), then their
passage and fact vectors are removed, then the rows are purged. A crash between the steps leaves
rows marked `deleted`; `Forgetter.finish_pending` (run at start-up, after every forget and after every
job's commit) completes them. A consolidated item citing a forgotten memory or a removed fact is
dropped on the way (see storage/consolidation.py): no item outlives one of its sources.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from ..storage.consolidation import ConsolidationStore
from ..storage.forget import Pending, mark_forgotten, pending, purge
from ..storage.journal import Journal
from ..storage.vectors import VectorStore
from .passages import passage_ids

log = logging.getLogger(__name__)


@dataclass
class Forgetter:
    """Forgets, and finishes what a forget (or a supersede) left to remove: one per service, built by it.

    It owns the lock that lets one purge run at a time: two at once would only repeat each other's deletes.
    """

    journal: Journal
    vectors: VectorStore
    consolidated: ConsolidationStore
    _purging: threading.Lock = field(default_factory=threading.Lock)
    _asked: int = 0  # finish_pending calls so far: a running purge that sees it change looks again

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
            # forgotten from here on (every read skips them); their vectors go now if the store answers, else
            # the rows stay to do and the next forget, job commit or fact sweep removes them: a vector store
            # that hangs or whose disk is full must not make a done forget look failed, nor hold it
            try:
                self.finish_pending(wait=False)
            except Exception:
                log.warning("forgot %d memories; removing their vectors failed, retried later", len(ids), exc_info=True)
        return ids

    def finish_pending(self, *, wait: bool = True) -> int:
        """Remove the vectors of every forgotten-but-not-purged memory and fact; returns memories purged.

        Without `wait`, a purge already running is left to do this one's work too (it looks again before it
        ends when asked meanwhile), so a forget does not queue behind a purge the vector store holds up."""
        self._asked += 1
        if not self._purging.acquire(blocking=wait):
            return 0
        try:
            purged = 0
            while True:
                asked = self._asked
                purged += self._purge_all()
                if self._asked == asked:
                    return purged
        finally:
            self._purging.release()

    def _purge_all(self) -> int:
        """One pass over the to-do list until it is empty (under `_purging`)."""
        purged = 0
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
