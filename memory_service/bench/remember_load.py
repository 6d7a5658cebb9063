"""The remember benchmark's load generator: concurrent clients, each on a keep-alive connection of its own.

Through httpx (as a Python agent sends it) or through `RawHttpClient`, a minimal HTTP/1.1 client
that leaves more of the shared cores to the service; and the disk's own fdatasync floor.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NamedTuple

import httpx

from ..client.service import async_service_client
from .raw_http import RawHttpClient, RawHttpError
from .texts import agent_text

Send = Callable[[str, str, Any], Awaitable[int]]


class Load(NamedTuple):
    """What one load run measured: the successful requests' latencies, its wall time, and the failures."""

    latencies: list[float]
    elapsed: float
    errors: int


async def load(
    url: str,
    key: str,
    clients: int,
    per_client: int,
    *,
    path: str,
    offset: int,
    interval_s: float = 0.0,
    raw: bool = False,
) -> Load:
    """`clients` workers, each with its own connection, `per_client` requests each.

    interval_s > 0: each client waits an exponential think time (mean interval_s) before each request,
    an open-ish load of clients/interval_s requests/s; 0: closed loop, as fast as the server answers.
    raw: through `RawHttpClient` (the service's time, with almost none of the client's) instead of httpx.
    """
    latencies: list[float] = []
    errors = 0
    barrier = _Barrier(clients)

    async def requests(n: int, send: Send) -> None:
        nonlocal errors
        await send("GET", "/health", None)  # open the connection before timing
        await barrier.wait()
        think = random.Random(offset + n)
        for i in range(per_client):
            if interval_s > 0:
                await asyncio.sleep(think.expovariate(1.0 / interval_s))
            body = None if path == "/health" else save_body(n, offset + n * per_client + i)
            started = time.perf_counter()
            try:
                status = await send("GET" if body is None else "POST", path, body)
                ok = status == (200 if body is None else 202)
            except (httpx.HTTPError, OSError, asyncio.IncompleteReadError, RawHttpError):
                ok = False
            if ok:
                latencies.append(time.perf_counter() - started)
            else:
                errors += 1

    async def worker(n: int) -> None:
        if raw:
            async with RawHttpClient(url, key) as raw_client:
                await requests(n, _raw_sender(raw_client))
        else:
            async with async_service_client(url, key, timeout=30.0) as client:
                await requests(n, _httpx_sender(client))

    started = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(clients)))
    return Load(latencies, time.perf_counter() - started, errors)


def save_body(client_no: int, seq: int) -> dict[str, Any]:
    """The `seq`-th save, as client `client_no` sends it."""
    return {
        "text": agent_text(seq),
        "agent_id": f"agent-{client_no % 8}",
        "run_id": f"run-{client_no}",
        "tags": ["bench", f"client-{client_no}"],
        "metadata": {"seq": seq},
    }


def _httpx_sender(client: httpx.AsyncClient) -> Send:
    async def send(method: str, path: str, body: Any) -> int:
        return (await client.request(method, path, json=body)).status_code

    return send


def _raw_sender(client: RawHttpClient) -> Send:
    async def send(method: str, path: str, body: Any) -> int:
        return (await client.request(method, path, body))[0]

    return send


class _Barrier:
    """All workers start together, after their connections are open (asyncio.Barrier is 3.11+, kept simple)."""

    def __init__(self, parties: int) -> None:
        self._parties, self._count, self._event = parties, 0, asyncio.Event()

    async def wait(self) -> None:
        self._count += 1
        if self._count >= self._parties:
            self._event.set()
        await self._event.wait()


def disk_sync_latency(directory: Path, count: int) -> list[float]:
    """Seconds per 4 KiB append + fdatasync in `directory`, paced 10 ms apart: the disk's own floor under
    every save's ack (the journal syncs its WAL before the 202), and the source of its slowest acks."""
    path = directory / "bench-disk-sync.tmp"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    latencies = []
    try:
        for _ in range(count):
            os.write(fd, b"\0" * 4096)
            started = time.perf_counter()
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - started)
            time.sleep(0.01)
    finally:
        os.close(fd)
        path.unlink()
    return latencies
