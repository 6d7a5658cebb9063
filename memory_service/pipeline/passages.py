"""Passages into the vector store, and the indexer that keeps the store caught up with the journal.

Every saved text is embedded as-is (in windows, for long texts) right after it is acked, so recall
finds it whether or not extraction ever succeeds. The same indexer, when idle, writes the fact vectors
a stop cut off between a job's commit and its vector writes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..embedding.embedder import Embedder
from ..storage.chroma_process import ChromaProcessFailed
from ..storage.database import storage_unavailable
from ..storage.journal import Journal, Memory
from ..storage.vectors import VectorItem, VectorStore
from .background import IDLE_POLL_S, lower_priority, wait_for
from .vector_items import journal_fact_item, passage_id, passage_item

STORAGE_RETRY_S = 5.0  # a full disk or a replaced vector store: try again soon, without a traceback a second

log = logging.getLogger("memory_service.pipeline.passages")

PASSAGE_WINDOW_CHARS = 1000
PASSAGE_OVERLAP_CHARS = 150
FACT_SWEEP_S = 60.0


def window_starts(length: int) -> list[int]:
    """Where the passage windows of a text of `length` characters start (their vector ids name them)."""
    if length <= PASSAGE_WINDOW_CHARS:
        return [0]
    return list(range(0, length - PASSAGE_OVERLAP_CHARS, PASSAGE_WINDOW_CHARS - PASSAGE_OVERLAP_CHARS))


def passage_windows(text: str) -> list[tuple[int, str]]:
    return [(start, text[start : start + PASSAGE_WINDOW_CHARS]) for start in window_starts(len(text))]


def passage_ids(memory_id: str, text: str) -> list[str]:
    """The vector ids `index_passages` gives a text's windows."""
    return [passage_id(memory_id, start) for start, _ in passage_windows(text)]


def index_passages(memories: list[Memory], embedder: Embedder, vectors: VectorStore) -> None:
    by_team: dict[str, list[tuple[Memory, int, str]]] = {}
    for memory in memories:
        for start, window in passage_windows(memory.text):
            by_team.setdefault(memory.team, []).append((memory, start, window))
    for team, rows in by_team.items():
        embeddings = embedder.embed([window for _, _, window in rows])
        items = [passage_item(memory, start, window, vec) for (memory, start, window), vec in zip(rows, embeddings)]
        vectors.upsert(team, items)


def write_fact_vectors(journal: Journal, vectors: VectorStore, team: str, items: list[VectorItem]) -> None:
    """After a commit: the new facts' vectors, then marked indexed (a stop in between: the sweep writes them)."""
    if items:
        vectors.upsert(team, items)
        journal.mark_facts_indexed([item.id for item in items])


@dataclass
class PassageIndexer:
    """Embeds newly saved texts as passages, oldest first, in small batches (recall shares the embedder).

    The embedding runs on a thread of its own at a lower OS priority: on a small machine whose other
    core runs the model, a save's acknowledgement and a recall must not wait for CPU behind it.
    `finish_pending` removes what forgets and supersedes left (the service's `Forgetter`).
    """

    journal: Journal
    embedder: Embedder
    vectors: VectorStore
    finish_pending: Callable[[], int]
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    _embedding: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, "passages", initializer=lower_priority)
    )

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_sweep = 0.0
        while True:
            try:
                batch = await asyncio.to_thread(self.journal.unindexed, 16)
                if not batch:
                    if time.monotonic() >= next_sweep:  # at start, then now and then: see `_sweep_facts`
                        next_sweep = time.monotonic() + FACT_SWEEP_S
                        await loop.run_in_executor(self._embedding, self._sweep_facts)
                    await wait_for(self.wake, IDLE_POLL_S)
                    continue
                await loop.run_in_executor(self._embedding, index_passages, batch, self.embedder, self.vectors)
                await asyncio.to_thread(self.journal.mark_indexed, [m.id for m in batch])
                await asyncio.to_thread(self._drop_forgotten, batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, ChromaProcessFailed) or storage_unavailable(exc):  # a full disk, a hung store
                    log.warning("passage indexer: storage unavailable for now (%s); the texts wait", exc)
                    await asyncio.sleep(STORAGE_RETRY_S)
                    continue
                log.exception("passage indexer: unexpected error")
                await asyncio.sleep(1.0)

    def close(self) -> None:
        self._embedding.shutdown(wait=False, cancel_futures=True)

    def _sweep_facts(self) -> None:
        """Finish what a stop cut off between a job's commit and its vector writes: vectors of facts still
        marked unindexed, removal of superseded facts' vectors."""
        while rows := self.journal.unindexed_facts(64):
            embeddings = self.embedder.embed([fact.text for fact, _ in rows])
            by_team: dict[str, list[VectorItem]] = {}
            for (fact, run_id), vec in zip(rows, embeddings):
                by_team.setdefault(fact.team, []).append(journal_fact_item(fact, run_id, vec))
            for team, items in by_team.items():
                write_fact_vectors(self.journal, self.vectors, team, items)
                self.finish_pending()
        self.finish_pending()

    def _drop_forgotten(self, batch: list[Memory]) -> None:
        """A text forgotten while it was being embedded: remove the passages just written for it."""
        live = self.journal.live([m.id for m in batch])
        for memory in batch:
            if memory.id not in live:
                self.vectors.delete(memory.team, passage_ids(memory.id, memory.text))
