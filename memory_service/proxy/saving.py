"""Saving what was said: each user message and each final answer, once, in the background.

A save goes through the service's normal `/v1/remember` (durable, extracted) with an idempotency key derived
from the message, so a message the client re-sends as history in every later turn is saved once, even across
a restart of the proxy. The key is `proxy:` + sha256 of (agent, session, role, n, text), n counting the same
role and text earlier in the conversation (a user who says "yes" twice is saved twice). The answer never waits
for a save: saves go to a bounded queue drained by a few tasks; a full queue or a failed save is logged.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..client import AsyncMemoryClient, MemoryServiceError
from .messages import text_of
from .sessions import Identity

log = logging.getLogger("memory_service.proxy")

QUEUE = 1000  # saves waiting at most; past it a save is dropped, and logged
WORKERS = 2
MAX_TEXT_BYTES = 65536  # the service's default MEMORY_MAX_TEXT_BYTES: a longer message is cut to it
SPEAKERS = {"user": "User", "assistant": "Assistant"}  # `Name:` in front: extraction says who said it
DRAIN_S = 5.0


@dataclass(frozen=True)
class Save:
    key: str
    text: str
    who: Identity
    role: str


def save_key(who: Identity, role: str, n: int, text: str) -> str:
    digest = hashlib.sha256("\0".join((who.agent, who.session, role, str(n), text)).encode("utf-8", "surrogatepass"))
    return "proxy:" + digest.hexdigest()


def _saved_text(role: str, text: str) -> str:
    said = f"{SPEAKERS[role]}: {text.strip()}"
    raw = said.encode("utf-8", "surrogatepass")
    return said if len(raw) <= MAX_TEXT_BYTES else raw[:MAX_TEXT_BYTES].decode("utf-8", "ignore")


def user_saves(who: Identity, messages: list[dict[str, Any]]) -> Iterator[Save]:
    """Every user message of the request with text (the caller skips those its session queued already)."""
    seen: Counter[str] = Counter()
    for message in messages:
        if message.get("role") != "user":
            continue
        text = text_of(message.get("content"))
        if not text.strip():
            continue
        seen[text] += 1
        yield Save(save_key(who, "user", seen[text], text), _saved_text("user", text), who, "user")


def answer_save(who: Identity, messages: list[dict[str, Any]], answer: str) -> Save:
    """The reply's final answer, numbered after the same answers already in the history."""
    n = 1 + sum(1 for m in messages if m.get("role") == "assistant" and text_of(m.get("content")) == answer)
    return Save(save_key(who, "assistant", n, answer), _saved_text("assistant", answer), who, "assistant")


class Saver:
    """The bounded queue and the tasks that send its saves."""

    def __init__(self, memory: AsyncMemoryClient, capacity: int = QUEUE, workers: int = WORKERS) -> None:
        self.memory = memory
        self.queue: asyncio.Queue[Save] = asyncio.Queue(capacity)
        self.workers = workers
        self.dropped = self.failed = self.sent = 0
        self._tasks: list[asyncio.Task[None]] = []

    def offer(self, save: Save) -> None:
        try:
            self.queue.put_nowait(save)
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning(
                "save queue full (%d waiting): a %s message of agent %s was not saved",
                self.queue.qsize(),
                save.role,
                save.who.agent,
            )

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work(), name=f"proxy-save-{n}") for n in range(self.workers)]

    async def stop(self, drain_s: float = DRAIN_S) -> None:
        """Send what is queued, for up to `drain_s`; what is left then is logged as lost."""
        try:
            await asyncio.wait_for(self.queue.join(), drain_s)
        except TimeoutError:
            log.warning("stopping with %d save(s) unsent", self.queue.qsize())
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _work(self) -> None:
        while True:
            save = await self.queue.get()
            try:
                await self.memory.remember(
                    save.text,
                    agent_id=save.who.agent,
                    run_id=save.who.run_id,
                    tags=["proxy"],
                    metadata={"source": "memory-service proxy", "role": save.role},
                    idempotency_key=save.key,
                )
                self.sent += 1
            except MemoryServiceError as exc:
                self.failed += 1
                log.warning("a %s message of agent %s was not saved: %s", save.role, save.who.agent, exc.message)
            except Exception:  # a bug must not stop the queue: the next saves still go
                self.failed += 1
                log.exception("a %s message of agent %s was not saved", save.role, save.who.agent)
            finally:
                self.queue.task_done()
