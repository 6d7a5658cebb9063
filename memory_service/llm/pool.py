"""The llama-servers the service extracts with (MEMORY_LLM_URL may list several).

Each server has its own `ModelHandle`: its own readiness, props and measured speed.
Extraction workers are bound to one handle each, so a server that goes down only
idles its own workers (they wait on its /health and claim nothing meanwhile) while
the others keep taking jobs; when it answers again its workers resume.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import Settings
from .client import LlamaClient
from .handle import ModelHandle

log = logging.getLogger("memory_service.model")

WATCH_S = 60.0  # how often an unreachable server is named again in the log


@dataclass
class ModelPool:
    handles: list[ModelHandle]

    @classmethod
    def open(cls, settings: Settings, *, speed_prior: tuple[float, float] | None = None) -> ModelPool:
        """One handle per URL, in the order given; the first is the primary while it is up."""
        return cls(
            [
                ModelHandle(settings, LlamaClient.for_settings(url, settings), speed_prior=speed_prior)
                for url in settings.llm_urls
            ]
        )

    def __post_init__(self) -> None:
        if not self.handles:
            raise ValueError("a model pool needs at least one llama-server")

    @property
    def primary(self) -> ModelHandle:
        """The first server that is up (or the first listed, when none is): what single-server views show."""
        return next((h for h in self.handles if h.ready), self.handles[0])

    @property
    def ready(self) -> bool:
        """At least one server can extract."""
        return any(h.ready for h in self.handles)

    def set_on_timings(self, callback: Callable[[dict[str, Any]], None]) -> None:
        for handle in self.handles:
            handle.on_timings = callback

    async def probe(self, max_age_s: float | None = None) -> None:
        """Probe every server at once (a down one costs at most its health timeout, not the sum of them)."""
        due = [h for h in self.handles if max_age_s is None or not h.ready or time.time() - h.last_check > max_age_s]
        await asyncio.gather(*(h.probe() for h in due))

    async def watch(self, every_s: float = WATCH_S) -> None:
        """Log a WARNING for each server that does not answer, at once and every `every_s` while it does not
        (saves are kept and queued meanwhile, so nothing else would say so in the log), and an INFO line when
        it answers again. A task Services starts and cancels."""
        down: set[str] = set()
        while True:
            await self.probe(max_age_s=every_s / 2)
            for handle in self.handles:
                url = handle.client.base_url
                if not handle.ready:
                    down.add(url)
                    log.warning(
                        "llama-server at %s is unreachable (%s): saves are kept and queued, nothing is extracted "
                        "until it answers. Start it (`memory-service serve` without MEMORY_LLM_URL starts its "
                        "own), or point MEMORY_LLM_URL at a running one; `memory-service doctor --llm-url %s` "
                        "checks it",
                        url,
                        handle.last_error or "no answer",
                        url,
                    )
                elif url in down:
                    down.discard(url)
                    log.info("llama-server at %s answers again: extraction resumes", url)
            await asyncio.sleep(every_s)

    def servers(self) -> dict[str, bool]:
        """{url: up} for every server, in the order given."""
        return {h.client.base_url: h.ready for h in self.handles}

    def estimate(self, jobs: int, chars: int, max_output: int) -> tuple[float | None, str]:
        """Seconds to extract a backlog with the servers that are up working side by side (rates add up).

        With none up, the servers' last known speeds stand in: the jobs wait for one to return.
        """
        estimates = [(h.ready, *h.estimate(jobs, chars, max_output)) for h in self.handles]
        known = [(ready, seconds, source) for ready, seconds, source in estimates if seconds]
        usable = [e for e in known if e[0]] or known
        if not usable:
            return estimates[0][1], estimates[0][2]
        combined = 1.0 / sum(1.0 / seconds for _, seconds, _ in usable)
        return round(combined, 2), usable[0][2]

    async def aclose(self) -> None:
        await asyncio.gather(*(h.client.aclose() for h in self.handles))
