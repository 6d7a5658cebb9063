"""`remember` with `wait_s`: wait until the save's job is done or failed, without polling the journal.

The worker that settles a job calls `settled(memory_id)`; the waiting request wakes at once. With a shared
database another process's worker may settle it, so the waiter also looks again now and then.
"""

from __future__ import annotations

import asyncio

from ..storage.journal import DONE, FAILED, Journal, Memory

POLL_S = 0.5  # how often a waiter looks at a shared database, where another process may settle the job


class Settling:
    """The requests waiting for a job to settle, by memory id (owned by Services, used on its event loop)."""

    def __init__(self, journal: Journal, *, shared_database: bool) -> None:
        self.journal, self.shared_database = journal, shared_database
        self._waiters: dict[str, list[asyncio.Event]] = {}

    def settled(self, memory_id: str) -> None:
        for event in self._waiters.pop(memory_id, []):
            event.set()

    async def wait(self, team: str, memory_id: str, timeout: float) -> Memory | None:
        """The memory once its job reaches done or failed, or as it is after `timeout`."""
        event = asyncio.Event()
        self._waiters.setdefault(memory_id, []).append(event)
        try:
            # registered first, then looked at: a job that settled in between is not waited for
            current = await self._current(team, memory_id)
            if current is None or current.status in (DONE, FAILED):
                return current
            if not self.shared_database:
                await asyncio.wait_for(event.wait(), timeout)
            else:
                deadline = asyncio.get_running_loop().time() + timeout
                while (left := deadline - asyncio.get_running_loop().time()) > 0:
                    try:
                        await asyncio.wait_for(event.wait(), min(left, POLL_S))
                        break
                    except TimeoutError:
                        current = await self._current(team, memory_id)
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
        return await self._current(team, memory_id)

    async def _current(self, team: str, memory_id: str) -> Memory | None:
        return await asyncio.to_thread(self.journal.get, team, memory_id)
