"""The explicit bundle of everything the app needs, built once in its lifespan.

Routes use what it offers (save, estimate, wait, readiness, counts); the
background workers get only their own parts, never the bundle.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .config import Settings
from .consolidation.worker import Consolidator
from .embedding.embedder import Embedder, embedder_for
from .llm.handle import ModelHandle
from .llm.pool import ModelPool
from .metrics import Metrics
from .pipeline.background import process_holder
from .pipeline.forgetting import Forgetter
from .pipeline.passages import PassageIndexer
from .pipeline.worker import ExtractionWorker
from .recall.background import BackgroundWork
from .recall.filtered_vectors import FilteredVectors
from .recall.query_embeddings import QueryEmbeddings
from .recall.search import Hit, RecallQuery, recall
from .recall.vector_view import VectorView
from .storage.consolidation import store_for
from .storage.database import DRIVER_ERRORS, Database
from .storage.datadir import KEYS_FILE as KEYS_FILE  # named from here by the app and the CLI
from .storage.datadir import DataDir, DataDirBusy
from .storage.datalock import DataDirLock
from .storage.journal import DONE, FAILED, Journal, Memory
from .storage.keys import KeyStore
from .storage.limits import LimitStore
from .storage.vectors import VectorStore

log = logging.getLogger("memory_service")

SETTLE_POLL_S = 0.5


@dataclass
class Services:
    settings: Settings
    journal: Journal
    vectors: VectorStore
    embedder: Embedder
    limits: LimitStore
    models: ModelPool  # the llama-server(s); workers are bound to one each
    keys: KeyStore
    forgetter: Forgetter  # the one that forgets and finishes purges: workers and routes share its lock
    lock: DataDirLock | None = None  # shared: tells a restore that this data dir is in use
    database: Database | None = None  # PostgreSQL shared by the stores; None: each has its SQLite file
    holder: str = field(default_factory=process_holder)  # this process's name in job leases
    metrics: Metrics = field(default_factory=Metrics)
    _tasks: list[asyncio.Task] = field(default_factory=list)
    _waiters: dict[str, list[asyncio.Event]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        wake = asyncio.Event()  # shared: a save wakes the idle workers of every server
        self.extractors = [
            ExtractionWorker(
                self.settings,
                self.journal,
                handle,
                self.embedder,
                self.vectors,
                metrics=self.metrics,
                forgetter=self.forgetter,
                settled=self._settled,
                wake=wake,
                holder=self.holder,
            )
            for handle in self.models.handles
        ]
        self.metrics.watch(self)
        self.models.set_on_timings(self.metrics.llm_timings)  # before start(): every extractor counts its tokens
        self.passages = PassageIndexer(self.journal, self.embedder, self.vectors, self.forgetter.finish_pending)
        self.consolidator: Consolidator | None = None
        if self.settings.consolidate:
            self.consolidator = Consolidator(
                self.settings, store_for(self.journal), self.models, self.embedder, self.vectors, holder=self.holder
            )
        # recall's view of the vectors follows every write: registered with the store before any worker starts
        vector_view = VectorView(self.journal)
        self.vectors.add_listener(vector_view)
        # the filtered search's loads, index builds and hubness passes run here; joined in `close`
        self._vector_background = BackgroundWork()
        self.search = FilteredVectors(self.journal, self.vectors, view=vector_view, background=self._vector_background)
        self._query_embeddings = QueryEmbeddings(self.embedder)  # repeated queries skip the embedder
        # recall's keyword leg runs here while the request's thread embeds the query (see `recall`)
        self._recall_legs = ThreadPoolExecutor(max_workers=4, thread_name_prefix="recall-keyword")

    @classmethod
    def open(cls, settings: Settings, *, speed_prior: tuple[float, float] | None = None) -> Services:
        data = DataDir(settings.data_dir)
        data.path.mkdir(parents=True, exist_ok=True)
        if not settings.llm_url:
            raise ValueError("no llama-server URL: set MEMORY_LLM_URL, or start with `memory-service serve`")
        try:
            lock = data.lock(exclusive=False)
        except DataDirBusy:
            log.info("waiting for the restore or backup running on %s to finish", data.path)
            lock = data.lock(exclusive=False, wait=True)
        stores = data.open_stores(settings)
        database, journal = stores.database, stores.journal
        if database is None:  # one process owns the file: whatever was mid-extraction was cut off
            recovered = journal.recover()
            if recovered:
                log.info("resumed %d job(s) that were mid-extraction at the last stop", recovered)
        # shared database: jobs held by processes that died come back when their lease runs out
        vectors = data.open_vectors(settings.chroma_url, process=settings.chroma_process)
        forgetter = Forgetter(journal, vectors, store_for(journal))
        purged = forgetter.finish_pending()
        if purged:
            log.info("finished forgetting %d memory(ies) that a stop cut off half-way", purged)
        return cls(
            settings=settings,
            journal=journal,
            vectors=vectors,
            embedder=embedder_for(settings),
            limits=data.open_limits(database),
            models=ModelPool.open(settings, speed_prior=speed_prior),
            keys=data.open_keys(database),
            forgetter=forgetter,
            lock=lock,
            database=database,
        )

    async def start(self) -> None:
        await self.models.probe()
        self._tasks.append(asyncio.create_task(self.passages.run(), name="passages"))
        workers = 0
        for extractor in self.extractors:  # one worker per slot per server (one for a server that is down)
            slots = extractor.model.props.slots if extractor.model.props else 1
            for _ in range(max(1, slots)):
                self._tasks.append(asyncio.create_task(extractor.run(workers), name=f"extract-{workers}"))
                workers += 1
        log.info("started %d extraction worker(s) on %d llama-server(s)", workers, len(self.extractors))
        if self.consolidator is not None:
            self._tasks.append(asyncio.create_task(self.consolidator.run(), name="consolidate"))
            log.info("consolidation on: runs while no save waits")

    async def stop(self) -> None:
        await self.stop_workers()
        self.close()

    async def stop_workers(self) -> None:
        """End what `start` began, on the loop that ran it, and leave the stores open: an in-process app's
        lifespan stops its workers while the test that opened the services still reads them."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self.passages.close()
        await self.models.aclose()

    def close(self) -> None:
        """Close the stores; a job cut off mid-extraction is queued again (on a shared database: this
        process's jobs only, at once rather than when their lease runs out)."""
        try:
            self.journal.recover(owner=self.holder if self.database is not None else None)
        except DRIVER_ERRORS as exc:  # the database is down: the leases run out and another process takes over
            log.warning("could not hand this process's jobs back (%s); they are retried when their lease ends", exc)
        self._recall_legs.shutdown(wait=True)
        self._vector_background.close()  # before the store it reads closes
        self.vectors.close()
        self.journal.close()
        self.limits.close()
        self.keys.close()
        if self.database is not None:
            self.database.close()
        if self.lock is not None:
            self.lock.release()

    # -- what the routes use ----------------------------------------------------

    def remember(self, **fields: Any) -> tuple[Memory, bool, tuple[int, int]]:
        """Commit a text and its job (blocking: call it in a thread); also the backlog up to it."""
        memory, created = self.journal.insert(**fields, budget_s=self.settings.extract_budget_s)
        return memory, created, self.journal.backlog(memory.created_at)

    def recall(self, query: RecallQuery) -> list[Hit]:
        """Recall over this team's stores (blocking: call it in a thread; the keyword leg runs beside it)."""
        return recall(
            query,
            journal=self.journal,
            vectors=self.vectors,
            embedder=self.embedder,
            search=self.search,
            legs=self._recall_legs,
            queries=self._query_embeddings,
        )

    def forget(self, team: str, **selector: Any) -> list[str]:
        """Forget the team's memories matching the selector (blocking: call it in a thread)."""
        return self.forgetter.forget(team, **selector)

    def saved(self) -> None:
        """Wake the workers: there is new work."""
        self.extractors[0].wake.set()  # the one event all workers share
        self.passages.wake.set()
        if self.consolidator is not None:
            self.consolidator.wake.set()  # its own event: a save must stop it even after a worker took the wake-up

    def consolidation_status(self) -> dict[str, Any]:
        """What /v1/stats shows of consolidation (blocking: call it in a thread)."""
        if self.consolidator is None:
            return {"enabled": False, "running": False, "items": store_for(self.journal).count(), "runs": []}
        return self.consolidator.status()

    def job_counts(self) -> dict[str, int]:
        """Texts by extraction status, and active facts (blocking: the scrape calls it in a thread)."""
        return self.journal.counts()

    @property
    def model(self) -> ModelHandle:
        """The server single-server views show (speed, readiness): the first one that is up."""
        return self.models.primary

    def vector_indexes(self) -> int:
        """Team vectors (per kind) that recall searches in process, through a clustered index."""
        return self.search.clustered_indexes()

    def model_servers(self) -> dict[str, bool]:
        """Every llama-server this service extracts with, and whether it is up."""
        return self.models.servers()

    def estimate(self, jobs: int, chars: int) -> tuple[float | None, str]:
        return self.models.estimate(jobs, chars, self.settings.max_output_tokens)

    async def wait_settled(self, team: str, memory_id: str, timeout: float) -> Memory | None:
        """The memory once its job reaches done or failed (the worker says so), or as it is after `timeout`."""
        event = asyncio.Event()
        self._waiters.setdefault(memory_id, []).append(event)
        try:
            # registered first, then looked at: a job that settled in between is not waited for
            current = await asyncio.to_thread(self.journal.get, team, memory_id)
            if current is None or current.status in (DONE, FAILED):
                return current
            if self.database is None:
                await asyncio.wait_for(event.wait(), timeout)
            else:  # another process's worker may settle it: look again now and then
                deadline = asyncio.get_running_loop().time() + timeout
                while (left := deadline - asyncio.get_running_loop().time()) > 0:
                    try:
                        await asyncio.wait_for(event.wait(), min(left, SETTLE_POLL_S))
                        break
                    except TimeoutError:
                        current = await asyncio.to_thread(self.journal.get, team, memory_id)
                        if current is None or current.status in (DONE, FAILED):
                            return current
        except TimeoutError:
            pass
        finally:
            waiters = self._waiters.get(memory_id, [])
            if event in waiters:
                waiters.remove(event)
            if not waiters:
                self._waiters.pop(memory_id, None)
        return await asyncio.to_thread(self.journal.get, team, memory_id)

    def _settled(self, memory_id: str) -> None:
        for event in self._waiters.pop(memory_id, []):
            event.set()
