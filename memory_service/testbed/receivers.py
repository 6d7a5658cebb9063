"""Webhook receivers for the tests and `bench.webhooks`: real HTTP servers on loopback, well-behaved or hostile.

A receiver is somebody else's server, so the service must survive the ones that misbehave. Each mode is what
a hostile review sent back (issue 53):
- `ok`: answers 200 at once and records each event with when it arrived;
- `trickle`: answers 200, then sends its body one byte every `trickle_s` seconds (no per-read timeout trips);
- `silent`: reads the request and never answers;
- `endless`: answers 200 with a 3 GB body, sent as fast as the peer reads it (made on the fly, never stored).

The server runs on its own event loop in a thread, so a test or a benchmark in the same process can drive
the service while its receivers hold connections; it counts open connections and body bytes sent, which is
how a test proves the service stopped reading.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

Mode = Literal["ok", "trickle", "silent", "endless"]
MODES: tuple[Mode, ...] = ("ok", "trickle", "silent", "endless")
ENDLESS_BYTES = 3 * 1024**3
_CHUNK = b"x" * 65536


@dataclass
class Arrival:
    event: dict[str, Any]
    at: float  # time.time() when the request was read whole

    @property
    def latency_s(self) -> float:
        """From the event's creation (its body's `created_at`, the service's clock) to its arrival here."""
        return self.at - float(self.event["created_at"])


@dataclass
class Counters:
    requests: int = 0
    open_connections: int = 0
    body_bytes_sent: int = 0
    arrivals: list[Arrival] = field(default_factory=list)


class Receivers:
    """One loopback server per mode asked for; `url(mode)` is where to subscribe. Use as a context manager."""

    def __init__(self, modes: tuple[Mode, ...] = MODES, trickle_s: float = 3.0) -> None:
        self.trickle_s = trickle_s
        self.counters = {mode: Counters() for mode in modes}
        self._ports: dict[Mode, int] = {}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.base_events.Server] = []
        self._handlers: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="receivers", daemon=True)

    def __enter__(self) -> Receivers:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def url(self, mode: Mode, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self._ports[mode]}{path}"

    def snapshot(self, mode: Mode) -> Counters:
        """A copy of `mode`'s counters as they are now (the server's thread keeps changing them)."""
        with self._lock:
            c = self.counters[mode]
            return Counters(c.requests, c.open_connections, c.body_bytes_sent, list(c.arrivals))

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        for mode in self.counters:
            server = await asyncio.start_server(functools.partial(self._track, mode), "127.0.0.1", 0, limit=1 << 20)
            self._servers.append(server)
            self._ports[mode] = server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _track(self, mode: Mode, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        with self._lock:
            self.counters[mode].open_connections += 1
        try:
            await self._serve(mode, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the service hung up: what a hostile receiver is waiting for
        except asyncio.CancelledError:
            pass  # closing: ended here, so asyncio's stream callback finds no cancelled task to report
        finally:
            with self._lock:
                self.counters[mode].open_connections -= 1
            writer.close()
            self._handlers.discard(task)

    async def _serve(self, mode: Mode, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:  # keep-alive: the `ok` receiver answers every request the connection brings
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.decode("latin-1").split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            body = await reader.readexactly(length)
            with self._lock:
                self.counters[mode].requests += 1
            if mode == "ok":
                with self._lock:
                    self.counters[mode].arrivals.append(Arrival(json.loads(body), time.time()))
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
                continue
            if mode == "silent":
                await reader.read()  # until the service gives up and closes
                return
            size = 10_000_000 if mode == "trickle" else ENDLESS_BYTES
            writer.write(f"HTTP/1.1 200 OK\r\ncontent-length: {size}\r\n\r\n".encode())
            await writer.drain()
            piece, pause = (b"x", self.trickle_s) if mode == "trickle" else (_CHUNK, 0.0)
            for _ in range(size // len(piece)):
                writer.write(piece)
                await writer.drain()
                with self._lock:
                    self.counters[mode].body_bytes_sent += len(piece)
                if writer.is_closing() or reader.at_eof():
                    return
                if pause:
                    await asyncio.sleep(pause)
            return
