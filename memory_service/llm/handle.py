"""The service's view of its llama-server: reachable or not, its props, its measured speed.

Workers block on `wait_ready()` while the server is down or loading; recall
never touches this.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import Settings
from ..extraction.completion import ServerProps
from ..extraction.extractor import Extractor
from ..extraction.sizing import backlog_seconds
from ..extraction.throughput import Throughput
from .client import LlamaClient
from .thinking import check_thinking

log = logging.getLogger("memory_service.model")


@dataclass
class ModelHandle:
    settings: Settings
    client: LlamaClient
    throughput: Throughput = field(default_factory=Throughput)
    props: ServerProps | None = None
    extractor: Extractor | None = None
    last_error: str | None = None
    last_check: float = 0.0
    # (prompt, generation) tokens/s measured when the build was proven on this model: the first estimates
    speed_prior: tuple[float, float] | None = None
    # passed on to every extractor: told each completion's timings (the metrics count its tokens)
    on_timings: Callable[[dict[str, Any]], None] | None = None
    _thinking: tuple[float, dict] | None = None  # (when, check_thinking result)
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        if self.speed_prior:
            self.throughput.prior(*self.speed_prior, source="bootstrap smoke test")

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def mark_down(self, reason: str) -> None:
        self.last_error = reason
        self._ready.clear()

    async def probe(self) -> bool:
        """Ask the server for health and props; on success, (re)build the extractor."""
        self.last_check = time.time()
        if not await self.client.health():
            self.mark_down(f"llama-server at {self.client.base_url} is not healthy")
            return False
        try:
            props = await self.client.props()
        except Exception as exc:
            self.mark_down(f"could not read /props: {exc}")
            return False
        if props.n_ctx <= 0:
            self.mark_down("llama-server reported no context size")
            return False
        if self.props is None or props.n_ctx != self.props.n_ctx:
            log.info("llama-server ready: n_ctx=%d slots=%d build=%s", props.n_ctx, props.slots, props.build_info)
        self.props = props
        same = self.extractor is not None and (self.extractor.props.n_ctx, self.extractor.props.model_path) == (
            props.n_ctx,
            props.model_path,
        )
        if same and self.extractor is not None:
            self.extractor.props = props  # same server setup: keep the counted system-prompt tokens
        else:
            self.extractor = Extractor(
                client=self.client,
                props=props,
                throughput=self.throughput,
                max_output_tokens=min(self.settings.max_output_tokens, max(64, props.n_ctx // 4)),
                max_facts=self.settings.max_facts,
                max_fact_chars=self.settings.max_fact_chars,
                on_timings=self.on_timings,
            )
        self.last_error = None
        self._ready.set()
        return True

    async def went_down(self, reason: str) -> bool:
        """After a failed call: is the server itself down? Then mark it so (workers wait, no attempt is spent)."""
        if await self.client.health():
            return False
        self.mark_down(reason)
        return True

    def estimate(self, jobs: int, chars: int, max_output: int) -> tuple[float | None, str]:
        """Seconds to extract `jobs` saves of `chars` characters at the model's speed, and what that rests on."""
        throughput = self.throughput
        system = 0 if throughput.system_cached() or self.extractor is None else self.extractor.counted_system_tokens
        seconds = backlog_seconds(
            max(jobs, 1), chars, throughput.prompt_tps(), throughput.generation_tps(), system, max_output
        )
        if seconds is None:
            return None, "unknown: the model's speed has not been measured yet"
        slots = self.props.slots if self.props else 1
        return round(seconds / max(1, slots), 2), throughput.source

    async def thinking(self, max_age_s: float = 60.0) -> dict:
        """Does the chat template turn thinking off? Template rendering only; re-checked at most once a minute."""
        if self._thinking is None or time.time() - self._thinking[0] > max_age_s:
            self._thinking = (time.time(), await check_thinking(self.client))
        return self._thinking[1]

    async def wait_ready(self) -> Extractor:
        """Until the server answers: probe with back-off, or resume at once when another probe (/ready) saw it up."""
        delay = 0.5
        while not self._ready.is_set() or self.extractor is None:
            if await self.probe():
                break
            try:
                await asyncio.wait_for(self._ready.wait(), delay)
            except TimeoutError:
                pass
            delay = min(delay * 2, 10.0)
        assert self.extractor is not None
        return self.extractor
