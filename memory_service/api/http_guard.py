"""The HTTP/1.1 connection `memory-service serve` runs: uvicorn's httptools protocol with the limits it lacks.

uvicorn times out only idle keep-alive connections. A client that sends its headers a byte at a time
(slowloris), or stops half-way through a body, holds a connection and its task for ever, and headers have
no size cap. This subclass adds a header deadline, a body idle timeout and a header size cap, and answers
what the HTTP parser refuses with the API's JSON error body instead of uvicorn's plain text.
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEADER_BYTES = 64 * 1024  # request line and headers together
LINGER_S = 2.0  # after a refusal, read and drop what the client is still sending before closing


def error_bytes(status: int, error: str, detail: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """A complete `{error, detail}` response that closes the connection, written below the ASGI app."""
    body = json.dumps({"error": error, "detail": detail}).encode()
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
    head += [name + b": " + value for name, value in default_headers]
    head += [b"content-type: application/json", b"content-length: " + str(len(body)).encode(), b"connection: close"]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class GuardedHttpProtocol(HttpToolsProtocol):
    """One connection: headers must be complete `header_timeout_s` after they start (or after the connection
    opens), and a body may not stall longer than `body_timeout_s` between bytes while the app waits for it."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._in_headers = False
        self._last_body = 0.0
        self._refusal: tuple[int, str, str] | None = None
        self._lingering = False

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

    def _answer_and_close(self, status: int, error: str, detail: str) -> None:
        """Write the answer and end our side, then drop what the client still sends for a moment: closing at
        once with unread bytes makes the kernel reset the connection, and the client may lose the answer."""
        self._disarm()
        self.transport.write(error_bytes(status, error, detail, self.server_state.default_headers))
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._lingering = True
        self.flow.resume_reading()
        self._timer = self.loop.call_later(LINGER_S, self.transport.close)

    # ------------------------------------------------------------ connection and parser callbacks

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout_s, self._headers_late)

    def data_received(self, data: bytes) -> None:
        if not self._lingering:
            super().data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
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


def guarded_protocol(header_timeout_s: float, body_timeout_s: float) -> type[GuardedHttpProtocol]:
    """The protocol class for `uvicorn.run(http=...)`, which builds it with uvicorn's own arguments only."""
    return type(
        "GuardedHttpProtocol",
        (GuardedHttpProtocol,),
        {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s},
    )
