"""The explicit bundle of everything the app needs, built once in its lifespan."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from .config import Settings
from .extraction.client import LlamaClient
from .model_handle import ModelHandle
from .storage.embedder import Embedder, load_embedder
from .storage.journal import Journal
from .storage.limits import LimitStore
from .storage.vectors import VectorStore
from .worker import extraction_loop, passage_loop

log = logging.getLogger("memory_service")


@dataclass
class Services:
    settings: Settings
    journal: Journal
    vectors: VectorStore
    embedder: Embedder
    limits: LimitStore
    model: ModelHandle
    _work: asyncio.Event = field(default_factory=asyncio.Event)
    _passages: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task] = field(default_factory=list)

    @classmethod
    def open(cls, settings: Settings) -> "Services":
        data = settings.data_dir
        data.mkdir(parents=True, exist_ok=True)
        if not settings.llm_url:
            raise ValueError("no llama-server URL: set MEMORY_LLM_URL, or start with `memory-service serve`")
        journal = Journal(data / "journal.sqlite3")
        recovered = journal.recover()
        if recovered:
            log.info("resumed %d job(s) that were mid-extraction at the last stop", recovered)
        return cls(
            settings=settings,
            journal=journal,
            vectors=VectorStore(data / "chroma", url=settings.chroma_url),
            embedder=load_embedder(settings.embedder, threads=settings.embed_threads),
            limits=LimitStore(data / "limits.sqlite3"),
            model=ModelHandle(settings, LlamaClient(settings.llm_url)),
        )

    async def start(self) -> None:
        await self.model.probe()
        slots = self.model.props.slots if self.model.props else 1
        self._tasks.append(asyncio.create_task(passage_loop(self), name="passages"))
        for worker_no in range(max(1, slots)):
            self._tasks.append(asyncio.create_task(extraction_loop(self, worker_no), name=f"extract-{worker_no}"))
        log.info("started %d extraction worker(s)", max(1, slots))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.model.client.aclose()
        self.journal.recover()  # a job cut off mid-extraction is queued again
        self.journal.close()
        self.limits.close()

    def notify_saved(self) -> None:
        self._work.set()
        self._passages.set()

    async def wait_for_work(self, timeout: float) -> None:
        await _wait(self._work, timeout)

    async def wait_for_passages(self, timeout: float) -> None:
        await _wait(self._passages, timeout)


async def _wait(event: asyncio.Event, timeout: float) -> None:
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        pass
    event.clear()
