"""The HTTP/1.1 connection `memory-service serve` runs: uvicorn's httptools protocol with the limits it lacks.

uvicorn times out only idle keep-alive connections. A client that sends its headers a byte at a time
(slowloris), or stops half-way through a body, holds a connection and its task for ever, and headers have
no size cap. This subclass adds a header deadline, a body idle timeout and a header size cap, and answers
what the HTTP parser refuses with the API's JSON error body instead of uvicorn's plain text.

The other direction too: a client that asks for a large answer and never reads it held the whole answer in
the transport's write buffer for ever (40 such sockets pinned 310 MB). Here a response goes out in 64 KiB
pieces, each sent only once the buffer is below its high-water mark, so at most about 128 KiB of it waits in
this process beyond the kernel's socket buffer; a connection whose unsent bytes do not move for
`write_timeout_s` is aborted, which frees them and the rest of the answer. And the number of open
connections (in all, and from one address) is capped. Over the cap in all, the connection that has waited
longest without a request in progress (opened and silent, between keep-alive requests, or still sending its
headers) is closed to make room, so one client holding the cap with idle sockets no longer shuts every other
client out (issue 53); only when every open connection is in a request is the new one a JSON 503, as is the
one over the cap from one address.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from http import HTTPStatus
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEADER_BYTES = 64 * 1024  # request line and headers together
LINGER_S = 2.0  # after a refusal, read and drop what the client is still sending before closing
WRITE_HIGH_WATER = 64 * 1024  # the transport's write buffer above this pauses the response (asyncio flow control)
SEND_PIECE = 64 * 1024  # a response body goes to the transport in pieces of at most this size

log = logging.getLogger("memory_service.http")


def error_bytes(
    status: int,
    error: str,
    detail: str,
    default_headers: list[tuple[bytes, bytes]],
    extra: tuple[tuple[bytes, bytes], ...] = (),
) -> bytes:
    """A complete `{error, detail}` response that closes the connection, written below the ASGI app."""
    body = json.dumps({"error": error, "detail": detail}).encode()
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
    head += [name + b": " + value for name, value in [*default_headers, *extra]]
    head += [b"content-type: application/json", b"content-length: " + str(len(body)).encode(), b"connection: close"]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class PiecewiseSends:
    """The app with its response bodies cut into `SEND_PIECE` pieces: uvicorn waits for the transport to drain
    before each send, so only one piece at a time joins the write buffer. After each send the connection
    starts its write deadline if bytes are left waiting."""

    def __init__(self, app: ASGIApp, connection: GuardedHttpProtocol) -> None:
        self.app, self.connection = app, connection

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def piecewise(message: Message) -> None:
            body = message.get("body", b"")
            if message["type"] != "http.response.body" or len(body) <= SEND_PIECE:
                await send(message)
            else:
                last = len(body) - SEND_PIECE
                for start in range(0, len(body), SEND_PIECE):
                    more = start < last or message.get("more_body", False)
                    await send(
                        {"type": "http.response.body", "body": body[start : start + SEND_PIECE], "more_body": more}
                    )
            self.connection.watch_writes()

        await self.app(scope, receive, piecewise)


class GuardedHttpProtocol(HttpToolsProtocol):
    """One connection: headers must be complete `header_timeout_s` after they start (or after the connection
    opens), a body may not stall longer than `body_timeout_s` between bytes while the app waits for it, and
    response bytes may not wait unread longer than `write_timeout_s`; at most `max_connections` are open
    (`max_per_client` from one address, 0: no such cap)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    write_timeout_s: float = 30.0
    max_connections: int = 512
    max_per_client: int = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.app = PiecewiseSends(self.app, self)
        self._write_timer: asyncio.TimerHandle | None = None
        self._unsent = 0  # the write buffer's size when the write deadline was armed
        self._drained = False  # the buffer fell below its low-water mark since then
        self._lost = False
        self._timer: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._in_headers = False
        self._last_body = 0.0
        self._refusal: tuple[int, str, str] | None = None
        self._lingering = False
        self._idle_since: float | None = None  # when it last had no request in progress

    # ------------------------------------------------------------ timers

    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _headers_late(self) -> None:
        self._timer = None
        if not self._in_headers:  # opened and never used: nothing to answer
            self.transport.close()
            return
        self._refuse(
            408,
            "request_timeout",
            f"request headers not complete within {self.header_timeout_s:g} s "
            "(MEMORY_HEADER_TIMEOUT_S); send them at once",
        )

    def _body_late(self) -> None:
        self._timer = None
        idle = self.loop.time() - self._last_body
        if self.flow.read_paused or idle < self.body_timeout_s:  # paused: the app is behind, not the client
            self._arm(self.body_timeout_s - (0 if self.flow.read_paused else idle), self._body_late)
            return
        if self.cycle is not None and self.cycle.response_complete:  # answered already (413): drop the rest
            self.transport.close()
            return
        self._refuse(
            408,
            "request_timeout",
            f"request body stalled: no bytes for {self.body_timeout_s:g} s (MEMORY_BODY_TIMEOUT_S)",
        )

    def _refuse(self, status: int, error: str, detail: str) -> None:
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if cycle.response_started:  # too late for an answer of our own: just cut the connection
                self.transport.close()
                return
            cycle.disconnected = True  # the app's receive now sees a disconnect, and its sends are dropped
            cycle.message_event.set()
        self._answer_and_close(status, error, detail)

    def _answer_and_close(
        self, status: int, error: str, detail: str, extra: tuple[tuple[bytes, bytes], ...] = ()
    ) -> None:
        """Write the answer and end our side, then drop what the client still sends for a moment: closing at
        once with unread bytes makes the kernel reset the connection, and the client may lose the answer."""
        self._disarm()
        self.transport.write(error_bytes(status, error, detail, self.server_state.default_headers, extra))
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._lingering = True
        self.flow.resume_reading()
        self._timer = self.loop.call_later(LINGER_S, self.transport.close)

    # ------------------------------------------------------------ unread responses and the connection caps

    def watch_writes(self) -> None:
        """Start the write deadline when response bytes wait in the write buffer (the kernel's is full)."""
        if self._write_timer is None and not self._lost:
            unsent = self.transport.get_write_buffer_size()
            if unsent:
                self._unsent, self._drained = unsent, False
                self._write_timer = self.loop.call_later(self.write_timeout_s, self._writes_late)

    def _writes_late(self) -> None:
        """Nothing of the waiting bytes went out for `write_timeout_s`: the client reads nothing, so the
        connection is aborted (a close would wait for the bytes) and the answer's memory freed."""
        self._write_timer = None
        if self._lost:
            return
        unsent = self.transport.get_write_buffer_size()
        if unsent and unsent == self._unsent and not self._drained:
            log.warning(
                "dropped a connection from %s: %d response bytes unread for %g s (MEMORY_WRITE_TIMEOUT_S)",
                self.client[0] if self.client else "?",
                unsent,
                self.write_timeout_s,
            )
            self._reset()
            return
        self.watch_writes()

    def _reset(self) -> None:
        """Abort with a reset: a plain close would leave the kernel's send queue (megabytes on loopback) to an
        orphaned socket that waits for the same client to read it; SO_LINGER 0 discards it with the connection."""
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        self.transport.abort()

    def pause_writing(self) -> None:
        super().pause_writing()
        self.watch_writes()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._drained = True

    def _idle(self) -> bool:
        """No request in progress: opened and silent, between keep-alive requests, or still sending headers."""
        cycle = self.cycle
        return (
            self._idle_since is not None
            and (cycle is None or cycle.response_complete)
            and not self.pipeline
            and not self._lingering
            and not self.transport.is_closing()
        )

    def _make_room(self) -> bool:
        """Close a connection to make room for this one: one refused already (lingering a moment so its answer
        gets out), else the one idle longest; False if every other one is in a request (or going already)."""
        others = [c for c in self.connections if c is not self and isinstance(c, GuardedHttpProtocol)]
        # first one already refused and only lingering to let its answer out, then the one idle longest
        lingering = [c for c in others if c._lingering and not c.transport.is_closing()]
        idle = lingering or [c for c in others if c._idle()]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c._idle_since or 0.0)
        log.info(
            "closed an idle connection from %s: %d open (MEMORY_MAX_CONNECTIONS)",
            oldest.client[0] if oldest.client else "?",
            len(self.connections),
        )
        oldest._disarm()
        oldest.transport.close()
        return True

    def _over_cap(self) -> str | None:
        """Why this new connection is one too many (uvicorn has already counted it), or None. Over the cap in
        all, the connection idle longest is closed instead, if there is one."""
        if self.max_per_client and self.client:
            address = self.client[0]
            peers = (getattr(other, "client", None) for other in self.connections)
            mine = sum(1 for peer in peers if peer is not None and peer[0] == address)
            if mine > self.max_per_client:
                return f"{address} has {self.max_per_client} connections open (MEMORY_MAX_CONNECTIONS_PER_CLIENT)"
        if len(self.connections) > self.max_connections and not self._make_room():
            return (
                f"the service has {self.max_connections} connections open (MEMORY_MAX_CONNECTIONS), each in a request"
            )
        return None

    # ------------------------------------------------------------ connection and parser callbacks

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        busy = self._over_cap()
        if busy:
            self._answer_and_close(
                503, "too_many_connections", f"{busy}; retry shortly", extra=((b"retry-after", b"1"),)
            )
            return
        self._idle_since = self.loop.time()
        self._arm(self.header_timeout_s, self._headers_late)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._idle_since = self.loop.time()

    def data_received(self, data: bytes) -> None:
        if not self._lingering:
            super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._disarm()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes, self._in_headers = 0, True
        if self._timer is None:  # the connection's first request keeps the deadline armed when it opened
            self._arm(self.header_timeout_s, self._headers_late)

    def _count(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > MAX_HEADER_BYTES:
            self._refusal = (431, "too_large", f"request line and headers are larger than {MAX_HEADER_BYTES} bytes")
            raise ValueError(self._refusal[2])  # the parser stops; uvicorn then calls send_400_response

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._last_body = self.loop.time()
        self._arm(self.body_timeout_s, self._body_late)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._last_body = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        status, error, detail = self._refusal or (
            400,
            "bad_request",
            "malformed HTTP/1.1 request line or headers (for example a control character in a "
            "header, or a path that is not ASCII)",
        )
        self._refusal = None
        self._answer_and_close(status, error, detail)


def guarded_protocol(header_timeout_s: float, body_timeout_s: float, **limits: float) -> type[GuardedHttpProtocol]:
    """The protocol class for `uvicorn.run(http=...)`, which builds it with uvicorn's own arguments only;
    `limits`: write_timeout_s, max_connections, max_per_client (the class's defaults where not given)."""
    unknown = set(limits) - {"write_timeout_s", "max_connections", "max_per_client"}
    if unknown:
        raise TypeError(f"unknown connection limits: {sorted(unknown)}")
    return type(
        "GuardedHttpProtocol",
        (GuardedHttpProtocol,),
        {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s, **limits},
    )


def protocol_for(settings: Any) -> type[GuardedHttpProtocol]:
    """The guarded protocol with the limits `settings` (a `Settings`) name."""
    return guarded_protocol(
        settings.header_timeout_s,
        settings.body_timeout_s,
        write_timeout_s=settings.write_timeout_s,
        max_connections=settings.max_connections,
        max_per_client=settings.max_connections_per_client,
    )
