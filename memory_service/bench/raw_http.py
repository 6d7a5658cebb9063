"""A minimal HTTP/1.1 keep-alive client over asyncio streams, for latency benchmarks.

On a 2-core machine the client shares the cores with the service and llama-server. httpx spends
about 2 ms of Python per request there (GET /health under the remember benchmark's load: p50 3.3 ms
through httpx, 1.3 ms through this), which is the client's cost, not the service's. This client
writes one request, reads the status line, the headers and a Content-Length body: what a
benchmark needs to time the service, and nothing more (no chunked bodies, no TLS, no redirects).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any


class RawHttpError(Exception):
    """The response could not be read as HTTP/1.1 with a Content-Length body."""


class RawHttpClient:
    """One keep-alive connection to `url` (http://host:port), reopened when the server closed it while idle."""

    def __init__(self, url: str, api_key: str | None) -> None:
        scheme, _, address = url.partition("://")
        if scheme != "http":
            raise ValueError(f"only http:// URLs: {url!r}")
        host, _, port = address.rstrip("/").partition(":")
        self._host, self._port = host, int(port or 80)
        self._auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> RawHttpClient:
        await self._connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()

    async def _connect(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader, self._writer = await asyncio.open_connection(self._host, self._port)

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        """(status, body). A connection the server closed since the last request (its keep-alive timeout)
        is reopened once and the request sent again; that reconnect is part of the request's time."""
        data = b"" if body is None else json.dumps(body).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\n{self._auth}"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        ).encode()
        try:
            return await self._exchange(head + data)
        except (ConnectionError, asyncio.IncompleteReadError, _Closed):
            await self._connect()
            return await self._exchange(head + data)

    async def _exchange(self, message: bytes) -> tuple[int, bytes]:
        assert self._reader is not None and self._writer is not None
        self._writer.write(message)
        await self._writer.drain()
        status_line = await self._reader.readline()
        if not status_line:
            raise _Closed
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise RawHttpError(f"not an HTTP/1.1 status line: {status_line!r}")
        length: int | None = None
        while (line := await self._reader.readline()) not in (b"\r\n", b"\n"):
            if not line:
                raise _Closed
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                raise RawHttpError("chunked responses are not supported by this client")
        if length is None:
            raise RawHttpError("response without Content-Length")
        return int(parts[1]), await self._reader.readexactly(length)


class _Closed(Exception):
    """The server closed the connection before answering (an idle keep-alive connection it timed out)."""
