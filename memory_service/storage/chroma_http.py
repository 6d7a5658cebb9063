"""The Chroma server's HTTP calls, each with a total deadline, a bounded read and a bounded share of threads.

Why (issue 53): chromadb's client waits for ever (`timeout=None`); a per-read timeout (what we set before) is
outlived by a server that trickles a byte every few seconds, and its answer is read whole with no cap. The
calls run in the service's blocking pool, which saves and key lookups share: a stuck server must not fill it.
So every request to the server goes through `BoundedTransport`:

- a total deadline: MEMORY_VECTOR_CALL_TIMEOUT_S plus an allowance for the bytes it uploads (an upsert of
  5,000 rows is ~20 MB), from the connect to the last byte of the answer: every socket read and write is
  given only what is left of it;
- a bounded read: an answer past MEMORY_CHROMA_MAX_REPLY_BYTES is refused as it arrives;
- a bounded share: at most `slots` calls wait on the server at once; one more waits for a turn up to
  `SLOT_WAIT_S`, but fails at once when the server has answered nothing for `STALLED_S` while all turns are
  taken (it is stuck: waiting would only hold a thread), so threads stuck on the server never hold the pool.

A call that fails so raises `ChromaServerFault`, which the API answers as 503 (storage unavailable).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpcore
import httpx

BYTES_PER_S_ALLOWED = 400_000  # an upload's allowance: ~10 ms a row of ~4 KB, as the embedded child's per-row
SLOT_WAIT_S = 1.0  # how long a call waits for a turn while `slots` others wait on a server that answers
STALLED_S = 0.5  # all turns taken and no answer for this long: the server is stuck, a call fails at once
DEFAULT_SLOTS = 4  # of the blocking pool's threads (min(32, cores + 4)): the rest stay for saves and lookups

_deadline = threading.local()  # the deadline (monotonic) of the request this thread is sending or reading


class ChromaServerFault(RuntimeError):
    """The Chroma server did not answer within the call's deadline, sent too much, or broke off."""


def _left(timeout: float | None) -> float | None:
    """A socket operation's timeout: what is left of the request's deadline, if less than its own."""
    at = getattr(_deadline, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise httpcore.ReadTimeout("the call's total deadline has passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None) -> Any:
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, _left(timeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """Sockets whose every operation is held to the deadline of the request that uses it."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, _left(timeout), local_address, socket_options)
        return _DeadlineStream(stream)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class BoundedTransport(httpx.BaseTransport):
    """httpx's transport for the Chroma server's client: see the module's docstring."""

    def __init__(self, url: str, *, total_s: float, max_reply_bytes: int, slots: int = DEFAULT_SLOTS) -> None:
        self.url, self.total_s, self.max_reply_bytes = url, total_s, max_reply_bytes
        self._n_slots = slots
        self._turns = threading.Condition()
        self._in_flight = 0
        self._full_since = self._last_answer = time.monotonic()
        self._pool = httpcore.ConnectionPool(network_backend=_DeadlineBackend(), max_connections=slots + 4)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        size = int(request.headers.get("content-length") or 0)
        total = self.total_s + size / BYTES_PER_S_ALLOWED
        if not self._take_turn(total):
            raise ChromaServerFault(
                f"{self._n_slots} calls are already waiting on the Chroma server at MEMORY_CHROMA_URL={self.url}: "
                f"it is stuck or overloaded, so {request.method} {path} was not sent; check the server"
            )
        deadline = time.monotonic() + total
        try:
            _deadline.at = deadline
            core = httpcore.Request(
                request.method,
                httpcore.URL(
                    scheme=request.url.raw_scheme,
                    host=request.url.raw_host,
                    port=request.url.port,
                    target=request.url.raw_path,
                ),
                headers=request.headers.raw,
                content=request.stream,
                extensions=request.extensions,
            )
            answer = self._pool.handle_request(core)
        except Exception as exc:
            self._give_turn()
            raise self._fault(request, total, exc) from None
        finally:
            _deadline.at = None
        self._last_answer = time.monotonic()
        body = _BoundedBody(self, request, answer, deadline, total)
        return httpx.Response(answer.status, headers=answer.headers, stream=body, extensions=answer.extensions)

    def _take_turn(self, total: float) -> bool:
        """A turn to call the server: at once if one is free; else wait while the server still answers."""
        give_up = time.monotonic() + min(SLOT_WAIT_S, total)
        with self._turns:
            while self._in_flight >= self._n_slots:
                now = time.monotonic()
                if now >= give_up or now - max(self._last_answer, self._full_since) > STALLED_S:
                    return False
                self._turns.wait(0.05)
            self._in_flight += 1
            if self._in_flight == self._n_slots:
                self._full_since = time.monotonic()
            return True

    def _give_turn(self) -> None:
        with self._turns:
            self._in_flight -= 1
            self._turns.notify()

    def _fault(self, request: httpx.Request, total: float, exc: BaseException) -> BaseException:
        where = f"the Chroma server at MEMORY_CHROMA_URL={self.url}"
        what = f"{request.method} {request.url.path}"
        if isinstance(exc, httpcore.TimeoutException):
            return ChromaServerFault(
                f"{where} did not answer {what} within {total:.1f}s (MEMORY_VECTOR_CALL_TIMEOUT_S): it is stuck "
                "or overloaded; the call was cut off"
            )
        if isinstance(exc, (httpcore.NetworkError, httpcore.ProtocolError)):
            return ChromaServerFault(f"{where} broke off {what}: {exc!r}")
        return exc

    def close(self) -> None:
        self._pool.close()


class _BoundedBody(httpx.SyncByteStream):
    """The answer's body, read under its request's deadline and refused past the cap; its slot is given back
    when it is closed (httpx closes it once read)."""

    def __init__(
        self, owner: BoundedTransport, request: httpx.Request, answer: httpcore.Response, deadline: float, total: float
    ) -> None:
        self._owner, self._request, self._answer = owner, request, answer
        self._deadline, self._total, self._closed = deadline, total, False

    def __iter__(self) -> Iterator[bytes]:
        cap, read = self._owner.max_reply_bytes, 0
        declared = self._answer.headers
        for name, value in declared:
            if name.lower() == b"content-length" and value.isdigit() and int(value) > cap:
                raise self._too_large(cap)
        pieces = iter(self._answer.stream)  # type: ignore[arg-type]
        while True:
            _deadline.at = self._deadline
            try:
                piece = next(pieces, None)
            except Exception as exc:
                raise self._owner._fault(self._request, self._total, exc) from None
            finally:
                _deadline.at = None
            if piece is None:
                return
            read += len(piece)
            if read > cap:
                raise self._too_large(cap)
            yield piece

    def _too_large(self, cap: int) -> ChromaServerFault:
        return ChromaServerFault(
            f"the Chroma server at MEMORY_CHROMA_URL={self._owner.url} sent more than {cap} bytes for "
            f"{self._request.method} {self._request.url.path}: refused (MEMORY_CHROMA_MAX_REPLY_BYTES)"
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._answer.close()
        finally:
            self._owner._give_turn()
