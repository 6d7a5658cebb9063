"""What the write path's background loops share: how they wait for work, how they name this process in
job leases, and the lower CPU priority of the threads that must not slow a save or a recall."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import uuid

IDLE_POLL_S = 1.0  # an idle loop looks again this often even when no save wakes it
BACKGROUND_NICENESS = 10


def lower_priority() -> None:
    """Lower this thread's CPU priority (Linux: each thread has its own nice value); elsewhere a no-op."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICENESS)
    except (AttributeError, OSError):
        pass


def process_holder() -> str:
    """Names this process in job leases: host, pid and a nonce (a pid is reused after a restart)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


async def wait_for(event: asyncio.Event, timeout: float) -> None:
    """Until `event` is set or `timeout` passes; then clear it (one wake-up per notification)."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        pass
    event.clear()
