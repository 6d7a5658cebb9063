"""How the Python client fails: at once when no service is there, retrying only answers that say retry.

Real sockets throughout: a port bound with nothing listening (a refused connection), a name that cannot
resolve, and a small HTTP server on loopback that answers every request with one status and counts them.
The statuses the real service answers are in test_client.py.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from memory_service.client import (
    AsyncMemoryClient,
    BadRequest,
    Conflict,
    Forbidden,
    MemoryClient,
    MemoryServiceError,
    NotFound,
    RateLimited,
    Unauthorized,
    Unavailable,
)
from memory_service.client.core import MAX_RETRIES


class Counting(httpx.HTTPTransport):
    """httpx's own transport over real sockets, counting the requests the client hands it."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.attempts += 1
        return super().handle_request(request)


@pytest.fixture
def nothing_listening() -> Iterator[str]:
    """The URL of a loopback port that is bound (so nobody else takes it) but not listening: refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


class OneAnswer:
    """An HTTP server on loopback answering every request with `status` and `headers`; `seen` counts them."""

    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.seen = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                owner.seen += 1
                self.rfile.read(int(self.headers.get("content-length") or 0))
                body = json.dumps({"error": "x", "detail": f"answered {status}"}).encode()
                self.send_response(status)
                for name, value in {**(headers or {}), "content-type": "application/json"}.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> OneAnswer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def test_a_refused_connection_raises_unavailable_at_once_naming_the_url(nothing_listening):
    transport = Counting()
    with MemoryClient(nothing_listening, transport=transport, retry_budget_s=1) as memory:
        with pytest.raises(Unavailable) as down:
            memory.list()  # a read, safe to resend: still not resent, nobody is there to answer it
    assert transport.attempts == 1
    assert down.value.status == 0 and down.value.request_id
    assert nothing_listening in down.value.message and "serve.sh" in down.value.message
    assert isinstance(down.value, MemoryServiceError)  # what the CLI and MCP server catch


def test_an_unknown_host_raises_unavailable_at_once():
    transport = Counting()
    with MemoryClient("http://memory.invalid:8700", transport=transport, retry_budget_s=1) as memory:
        with pytest.raises(Unavailable) as down:
            memory.recall("anything")
    assert transport.attempts == 1 and "http://memory.invalid:8700" in down.value.message


def test_the_async_client_fails_as_fast(nothing_listening):
    async def main() -> None:
        async with AsyncMemoryClient(nothing_listening, retry_budget_s=1) as memory:
            await memory.team()

    with pytest.raises(Unavailable) as down:
        asyncio.run(main())
    assert down.value.status == 0 and nothing_listening in down.value.message


def test_a_url_without_a_scheme_is_refused_before_anything_is_sent():
    with pytest.raises(ValueError, match="localhost:8700.*needs a scheme"):
        MemoryClient("localhost:8700")


def test_a_503_without_retry_after_is_not_retried():
    with OneAnswer(503) as server, MemoryClient(server.url, retry_budget_s=5) as memory:
        with pytest.raises(Unavailable) as busy:
            memory.list()
    assert server.seen == 1 and busy.value.status == 503 and busy.value.message == "answered 503"
    assert busy.value.retry_after_s is None


def test_a_503_with_retry_after_is_retried_a_bounded_number_of_times():
    with OneAnswer(503, {"Retry-After": "0"}) as server, MemoryClient(server.url, retry_budget_s=5) as memory:
        with pytest.raises(Unavailable):
            memory.get("m-1")
    assert server.seen == 1 + MAX_RETRIES


def test_a_429_is_rate_limited_with_the_wait_the_server_asked_for():
    with OneAnswer(429, {"Retry-After": "3600"}) as server, MemoryClient(server.url, retry_budget_s=5) as memory:
        with pytest.raises(RateLimited) as limited:
            memory.remember("a note", agent_id="a")
    assert server.seen == 1 and limited.value.retry_after_s == 3600  # an hour does not fit 5 s: not waited
    with OneAnswer(429, {"Retry-After": "0"}) as server, MemoryClient(server.url, retry_budget_s=5) as memory:
        with pytest.raises(RateLimited):
            memory.remember("a note", agent_id="a")
    assert server.seen == 1 + MAX_RETRIES


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, BadRequest),
        (401, Unauthorized),
        (403, Forbidden),
        (404, NotFound),
        (409, Conflict),
        (413, BadRequest),
        (422, BadRequest),
        (500, MemoryServiceError),
    ],
)
def test_each_status_has_its_class_and_is_not_retried(status, kind):
    with OneAnswer(status, {"Retry-After": "0"}) as server, MemoryClient(server.url) as memory:
        with pytest.raises(kind) as failed:
            memory.team()
    assert type(failed.value) is kind and failed.value.status == status and server.seen == 1
