"""The composition root and the one way in for routes and the console.

`Services.open` opens the data dir's stores, builds the extraction, passage and consolidation loops, and
owns every thread, executor and cache they use (`start`, `stop_workers`, `close`). Routes and the console
call only its facade methods below, each a thin call into a store, so no handler reaches into a store or
the model pool. `settings` is the one attribute they read directly: plain configuration, no behaviour.
The background workers get only their own parts, never the bundle.

The names the HTTP edge (api/, console/) uses of the stages below are imported here as `X as X`: the edge
imports only this module and contract/, so a route reads one facade, not the stores (the `edge` contract
in pyproject.toml).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from .config import Settings
from .consolidation.worker import Consolidator
from .contract.limits import HandledRecord
from .contract.roles import Role
from .embedding.embedder import Embedder, embedder_for
from .extraction.dates import occurred
from .llm.handle import ModelHandle as ModelHandle
from .llm.pool import ModelPool
from .metrics import Metrics
from .pipeline.background import process_holder
from .pipeline.forgetting import Forgetter
from .pipeline.importing import ImportTally as ImportTally
from .pipeline.importing import import_batch
from .pipeline.job_history import Bucket as Bucket
from .pipeline.passages import PassageIndexer
from .pipeline.settling import Settling
from .pipeline.webhook_urls import MAX_URL_CHARS as MAX_URL_CHARS
from .pipeline.webhook_urls import BadWebhookUrl as BadWebhookUrl
from .pipeline.webhook_urls import resolve as resolve_webhook_url  # noqa: F401  (a re-export under a clearer name)
from .pipeline.webhooks import Webhooks
from .pipeline.worker import ExtractionWorker
from .recall.answer import Narrow, RecallAnswer, answer
from .recall.query_embeddings import QueryEmbeddings
from .recall.search import Hit as Hit
from .recall.search import Recalled, recall
from .recall.search import RecallQuery as RecallQuery
from .recall.search import to_epoch as to_epoch
from .recall.vectors import BackgroundWork, FilteredVectors, VectorView
from .storage import catalog
from .storage import versions as version_store
from .storage.catalog import Listed as Listed
from .storage.catalog import ListFilter as ListFilter
from .storage.chroma_process import ChromaProcessFailed as ChromaProcessFailed
from .storage.consolidation import store_for
from .storage.database import DRIVER_ERRORS, Database
from .storage.database import describe as describe
from .storage.database import open_database as open_database
from .storage.database import storage_unavailable as storage_unavailable
from .storage.datadir import KEYS_FILE as KEYS_FILE  # named from here by the app and the CLI
from .storage.datadir import DataDir, DataDirBusy
from .storage.datalock import DataDirLock
from .storage.gate import Finished as Finished
from .storage.gate import GateCall as GateCall
from .storage.gate import Reserved as Reserved
from .storage.journal import DONE as DONE
from .storage.journal import FAILED as FAILED
from .storage.journal import Fact, Journal
from .storage.journal import Memory as Memory
from .storage.keys import SESSION_TTL_S as SESSION_TTL_S  # the console's cookie lifetime
from .storage.keys import KeyInfo as KeyInfo
from .storage.keys import KeyNotFound as KeyNotFound
from .storage.keys import KeyStore as KeyStore
from .storage.keys import LastKey as LastKey
from .storage.keys import NewKey, key_hash
from .storage.limit_views import ConsumeResult
from .storage.limit_views import LimitView as LimitView
from .storage.limits import LimitStore, Per
from .storage.occurred import occurred_times
from .storage.vectors import VectorStore
from .storage.versions import Version as Version
from .storage.webhooks import MAX_SUBSCRIPTIONS as MAX_SUBSCRIPTIONS
from .storage.webhooks import Subscription as Subscription
from .storage.webhooks import TooManySubscriptions as TooManySubscriptions

log = logging.getLogger("memory_service")
T = TypeVar("T")


class LimitsAndKeys:
    """The facade of the daily limits, the handled ledger and the API keys: what the limit and key routes,
    auth and the console call. `Services` is one; built alone it serves those routes with no model or
    journal (the limit tests and bench do)."""

    def __init__(self, settings: Settings, limits: LimitStore, keys: KeyStore) -> None:
        self.settings, self.limits, self.keys, self.metrics = settings, limits, keys, Metrics()
        self._open_pool()

    def _open_pool(self) -> None:
        # the requests' blocking work (key lookups, stores, journal, vector calls): MEMORY_BLOCKING_THREADS
        self._blocking = ThreadPoolExecutor(self.settings.blocking_threads, thread_name_prefix="blocking")

    async def off_loop(self, work: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """`work(*args, **kwargs)` in the blocking pool, with the caller's context (its request id in the logs):
        the edge's way to run blocking work, so no route picks a thread pool of its own."""
        call = functools.partial(contextvars.copy_context().run, work, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._blocking, call)

    def put_limit(self, team: str, name: str, daily_limit: int, tz: str, per: Per) -> tuple[LimitView, bool]:
        """Create or change a limit; also whether it was created."""
        return self.limits.set_limit(team, name, daily_limit, tz, per)

    def list_limits(self, team: str, agent_id: str | None = None) -> list[LimitView]:
        return self.limits.list_limits(team, agent_id)

    def limit_view(self, team: str, name: str, agent_id: str | None = None, days: int | None = None) -> LimitView:
        return self.limits.get_limit(team, name, agent_id, days)

    def delete_limit(self, team: str, name: str) -> None:
        self.limits.delete_limit(team, name)

    def consume(
        self, team: str, name: str, agent_id: str, amount: int, idempotency_key: str | None = None
    ) -> ConsumeResult:
        """Check and count in one transaction, and count the answer in the metrics."""
        result = self.limits.consume(team, name, agent_id, amount, idempotency_key)
        self.metrics.consume.labels(team, "allowed" if result.allowed else "denied").inc()
        return result

    def mark_handled(self, team: str, key: str, agent_id: str | None, ttl_days: int | None) -> HandledRecord:
        return self.limits.mark_handled(team, key, agent_id, ttl_days)

    def handled_record(self, team: str, key: str, agent_id: str | None = None) -> HandledRecord | None:
        """The live record of `key`, or None if never seen or expired."""
        return self.limits.get_handled(team, key, agent_id)

    def gate_reserve(self, team: str, call: GateCall) -> Reserved:
        """The gate's reserve: ledger, live reservations and limit checked, the key held, in one transaction."""
        return self.limits.reserve(team, call)

    def gate_finish(self, team: str, reservation: str, result: str | None, pinned: str | None) -> Finished:
        """The tool ran: its key recorded handled (by, tool, result); the units stay used."""
        return self.limits.finish(team, reservation, result, pinned)

    def gate_release(self, team: str, reservation: str, pinned: str | None) -> int:
        """The tool failed: the key freed and the units given back; how many were."""
        return self.limits.release(team, reservation, pinned)

    def has_stored_keys(self) -> bool:
        """Whether the key store holds an active key (MEMORY_API_KEYS aside)."""
        return self.keys.has_keys()

    def stored_key(self, presented: str) -> KeyInfo | None:
        return self.keys.lookup(presented)

    def stored_key_by_hash(self, digest: str) -> KeyInfo | None:
        return self.keys.lookup_hash(digest)

    @staticmethod
    def key_digest(key: str) -> str:
        """sha256 of a key, as the key store and the console's sessions keep it."""
        return key_hash(key)

    def open_console_session(self, key: str) -> str:
        return self.keys.open_session(key)

    def console_session_key(self, session: str) -> str | None:
        """The hash of the key a live console session was opened with, or None."""
        return self.keys.session_key_hash(session)

    def end_console_session(self, session: str) -> None:
        self.keys.end_session(session)

    def create_key(self, team: str, role: Role, *, agent_id: str | None, label: str | None) -> NewKey:
        return self.keys.create(team, role, agent_id=agent_id, label=label)

    def list_keys(self, team: str, *, include_revoked: bool) -> list[KeyInfo]:
        return self.keys.list(team, include_revoked=include_revoked)

    def revoke_key(self, team: str, key_id: str) -> KeyInfo:
        """Revoke one of the team's keys (KeyNotFound if none such); the last one only with MEMORY_API_KEYS set."""
        return self.keys.revoke(key_id, team=team, keyless=bool(self.settings.api_keys))


@dataclass
class Services(LimitsAndKeys):
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

    def __post_init__(self) -> None:
        self.settling = Settling(self.journal, shared_database=self.database is not None)
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
                settled=self.settling.settled,
                wake=wake,
                holder=self.holder,
            )
            for handle in self.models.handles
        ]
        self.metrics.watch(self)
        self.models.set_on_timings(self.metrics.llm_timings)  # before start(): every extractor counts its tokens
        self.passages = PassageIndexer(self.journal, self.embedder, self.vectors, self.forgetter.finish_pending)
        self.webhooks = Webhooks(self.settings, self.journal, self.limits)  # subscriptions (routes, console), delivery
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
        # repeated queries skip the embedder; keyed by team, so no team's query is fast because another asked it
        self.query_embeddings = QueryEmbeddings(self.embedder)
        # recall's keyword leg runs here while the request's thread embeds the query (see `recall`)
        self._recall_legs = ThreadPoolExecutor(self.settings.recall_threads, thread_name_prefix="recall-keyword")
        self._open_pool()

    @classmethod
    def open(cls, settings: Settings, *, speed_prior: tuple[float, float] | None = None) -> Services:
        data = DataDir(settings.data_dir)
        data.prepare()  # 0700; refuses a data dir a cut-off restore left missing
        if not settings.llm_url:
            raise ValueError("no llama-server URL: set MEMORY_LLM_URL, or start with `memory-service serve`")
        try:
            lock = data.lock(exclusive=False)
        except DataDirBusy:
            log.info("waiting for the restore or backup running on %s to finish", data.path)
            lock = data.lock(exclusive=False, wait=True)
        from .embedding.selection import model_for

        # before the journal exists: a dir without one is new and records its model (unset: the recorded one)
        embedder_model, mixed = model_for(settings, data)
        if mixed:
            log.warning("%s", mixed)
        stores = data.open_stores(settings)
        database, journal = stores.database, stores.journal
        if database is None:  # one process owns the file: whatever was mid-extraction was cut off
            recovered = journal.recover()
            if recovered:
                log.info("resumed %d job(s) that were mid-extraction at the last stop", recovered)
        # shared database: jobs held by processes that died come back when their lease runs out
        vectors = data.open_vectors(
            settings.chroma_url, process=settings.chroma_process, call_timeout_s=settings.vector_call_timeout_s
        )
        forgetter = Forgetter(journal, vectors, store_for(journal))
        purged = forgetter.finish_pending()
        if purged:
            log.info("finished forgetting %d memory(ies) that a stop cut off half-way", purged)
        return cls(
            settings=settings,
            journal=journal,
            vectors=vectors,
            embedder=embedder_for(settings, embedder_model),
            limits=data.open_limits(database),
            models=ModelPool.open(settings, speed_prior=speed_prior),
            keys=data.open_keys(database),
            forgetter=forgetter,
            lock=lock,
            database=database,
        )

    async def start(self) -> None:
        await self.models.probe()
        self._tasks.append(asyncio.create_task(self.models.watch(), name="model-watch"))  # warns while one is down
        self._tasks.append(asyncio.create_task(self.passages.run(), name="passages"))
        self._tasks.append(asyncio.create_task(self.metrics.history.run(self.journal), name="job-history"))
        self._tasks.append(asyncio.create_task(self.webhooks.run(), name="webhooks"))
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
        await self.webhooks.aclose()

    def close(self) -> None:
        """Close the stores; a job cut off mid-extraction is queued again (on a shared database: this
        process's jobs only, at once rather than when their lease runs out)."""
        try:
            self.journal.recover(owner=self.holder if self.database is not None else None)
        except DRIVER_ERRORS as exc:  # the database is down: the leases run out and another process takes over
            log.warning("could not hand this process's jobs back (%s); they are retried when their lease ends", exc)
        self._blocking.shutdown(wait=True)
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

    # -- the facade: what routes and the console call ---------------------------

    def remember(self, *, said: datetime | None = None, **fields: Any) -> tuple[Memory, bool, tuple[int, int]]:
        """Commit a text and its job (blocking: in the pool); also its team's backlog up to it. `said`: when
        the text says it happened, resolved here to a moment and a day in MEMORY_TIMEZONE (none: now), unless
        the fields carry `occurred_at` and `occurred_day` already (a changed memory keeps its own)."""
        if "occurred_at" not in fields:
            fields["occurred_at"], fields["occurred_day"] = occurred(said, time.time(), self.settings.timezone)
        memory, created = self.journal.insert(**fields, budget_s=self.settings.extract_budget_s)
        return memory, created, self.journal.team_backlog(memory.team, memory.created_at)

    async def recall(
        self, query: RecallQuery, max_tokens: int | None = None, narrow: Narrow | None = None
    ) -> RecallAnswer:
        """The finished answer to a recall: its hits, its context (within `max_tokens`) and its note. The
        search and the dates run in the blocking pool; `narrow` is a path's own filter of the hits (Hindsight's
        tags), applied before the dates are read and the context is built."""
        found, dates = await self.off_loop(self._found, query, narrow)
        timeout_s = self.settings.recall_tokenize_timeout_s
        return await answer(found, dates, query.query, max_tokens, self.token_pieces, timeout_s)

    async def recall_hits(self, query: RecallQuery) -> list[Hit]:
        """Only a recall's hits, best first, for paths that render them their own way (mem0's search, the
        console): no dates read, no context built."""
        return (await self.off_loop(self.recalled, query)).hits

    def _found(self, query: RecallQuery, narrow: Narrow | None) -> tuple[Recalled, dict[str, float]]:
        found = self.recalled(query)
        if narrow is not None:
            found = dataclasses.replace(found, hits=narrow(found.hits))
        return found, self.occurred(query.team, [h.memory_id for h in found.hits])

    def recalled(self, query: RecallQuery) -> Recalled:
        """The hits of a recall, and what the relevance floor (MEMORY_RECALL_FLOOR) left out (blocking)."""
        return recall(
            query,
            journal=self.journal,
            embedder=self.embedder,
            search=self.search,
            legs=self._recall_legs,
            queries=self.query_embeddings,
            floor=self.settings.recall_floor,
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

    def consolidation_status(self, team: str | None = None) -> dict[str, Any]:
        """What /v1/stats shows of consolidation (blocking); for one `team`: its items, no runs (they span teams)."""
        idle: dict[str, Any] = {"enabled": False, "running": False, "runs": []}
        status = idle if self.consolidator is None else self.consolidator.status()
        if team is None:
            return status | {"items": store_for(self.journal).count()}
        return status | {"items": store_for(self.journal).count(team), "runs": [], "last_error": None}

    def job_counts(self) -> dict[str, int]:
        """Texts by status (`deferred`: queued, waiting out a model too slow), active facts (blocking: in a thread)."""
        return {**self.journal.counts(), "deferred": self.journal.waiting_for_speed()}

    def memory(self, team: str, memory_id: str) -> Memory | None:
        """The team's memory, or None (this and what follows block: call them in a thread)."""
        return self.journal.get(team, memory_id)

    def carry_versions(
        self, team: str, old: Version, earlier: list[Version], new_id: str, *, keep: int, chars: int
    ) -> list[Version]:
        """Give the memory that replaces `old` (a mem0 update) old's history and old itself (storage/versions.py)."""
        return version_store.carry(self.journal, team, old, earlier, new_id, keep=keep, chars=chars)

    def versions(self, team: str, memory_id: str) -> list[Version]:
        """The earlier versions of a memory an update made, oldest first."""
        return version_store.versions(self.journal, team, memory_id)

    def facts_of_memory(self, team: str, memory_id: str) -> list[Fact]:
        return self.journal.facts_of_memory(team, memory_id)

    def facts_by_ids(self, team: str, fact_ids: list[str]) -> dict[str, Fact]:
        return self.journal.facts_by_ids(team, fact_ids)

    def list_memories(
        self, team: str, flt: catalog.ListFilter, *, limit: int, after: catalog.Cursor | None = None
    ) -> tuple[list[catalog.Listed], catalog.Cursor | None]:
        """One page of the team's memories, newest first, and the next page's cursor (None on the last)."""
        return catalog.list_memories(self.journal, team, flt, limit=limit, after=after)

    def facets(self, team: str, top: int = 50, agent_id: str | None = None) -> catalog.Facets:
        return catalog.facets(self.journal, team, top, agent_id)

    def status_counts(self, team: str) -> dict[str, int]:
        """The team's jobs by state (and how many wait out a slow model); `job_counts` counts every team's."""
        return catalog.status_counts(self.journal, team) | {"deferred": self.journal.waiting_for_speed(team=team)}

    def backlog(self, team: str, created_at: float | None = None) -> tuple[int, int]:
        """The team's (jobs, characters) waiting or running (saved by `created_at`, if given); no other team's."""
        return self.journal.team_backlog(team, created_at)

    def retry(self, team: str, memory_id: str) -> bool:
        """Queue the team's failed job again, due now; False unless it had failed."""
        return self.journal.retry(team, memory_id, budget_s=self.settings.extract_budget_s)

    def export(self, team: str, agent_id: str | None = None) -> Iterator[dict[str, Any]]:
        """Every memory of the team (of `agent_id`, when given), oldest first, as export records read lazily."""
        return catalog.export_records(self.journal, team, agent_id)

    def import_records(self, records: list[dict], team: str, *, re_extract: bool) -> ImportTally:
        """Store validated export records; `saved` must follow when any were imported."""
        return import_batch(
            records,
            team=team,
            journal=self.journal,
            embedder=self.embedder,
            vectors=self.vectors,
            re_extract=re_extract,
            budget_s=self.settings.extract_budget_s,
        )

    @property
    def primary_model(self) -> ModelHandle:
        """The one server that single-server views show (speed, readiness): the first of the pool that is up."""
        return self.models.primary

    def model_handles(self) -> list[ModelHandle]:
        return list(self.models.handles)

    async def probe_models(self, max_age_s: float) -> None:
        """Look again at the servers not checked in the last `max_age_s` seconds."""
        await self.models.probe(max_age_s=max_age_s)

    def storage_locations(self) -> dict[str, str]:
        """Where the journal and the vectors live, for operators (no credentials)."""
        database = describe(self.database.url) if self.database else "sqlite"
        return {"database": database, "vectors": self.settings.chroma_url or "embedded"}

    def render_metrics(self) -> bytes:
        """The Prometheus exposition (blocking: the gauges read the journal)."""
        return self.metrics.render()

    def observe_remember_ack(self, seconds: float) -> None:
        self.metrics.remember_ack.observe(seconds)

    def observe_recall(self, seconds: float) -> None:
        self.metrics.recall.observe(seconds)

    def occurred(self, team: str, memory_ids: list[str]) -> dict[str, float]:
        """Each memory's occurred_at, else its save time (blocking): the date of recall's context lines."""
        return occurred_times(self.journal, team, memory_ids)

    async def token_pieces(self, text: str) -> list[Any] | None:
        """`text`'s token pieces by the first llama-server that is up, None when none is (recall's budget)."""
        handle = self.models.primary
        timeout = self.settings.recall_tokenize_timeout_s
        return await handle.client.token_pieces(text, timeout=timeout) if handle.ready else None

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
        return await self.settling.wait(team, memory_id, timeout)
