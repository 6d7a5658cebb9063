"""Forwarding to the model server: the request as the client sent it (plus the brief), the answer as the
upstream sent it, status, body and content type included, streamed chunk by chunk.

Only what must change is changed: hop-by-hop headers and the proxy's own `X-Memory-*` headers are not sent on,
and the upstream is asked for an unencoded body, so the bytes relayed are the bytes it wrote. An upstream that
cannot be reached is a 502 (504 when it did not answer in time) in OpenAI's error shape, naming its URL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import httpx

from .messages import StreamedAnswer, error_body

# never forwarded either way: the connection's own, what httpx or uvicorn sets, and the proxy's own headers
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "accept-encoding",
        "content-encoding",
        "date",
        "server",
    }
)
CONNECT_TIMEOUT_S = 10.0


def base_url(url: str) -> str:
    """`http://h:8080`, `http://h:8080/` and `http://h:8080/v1` (as OpenAI clients write it) are one upstream."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def sent_on(headers: Mapping[str, str]) -> dict[str, str]:
    out = {k: v for k, v in headers.items() if k.lower() not in _HOP and not k.lower().startswith("x-memory-")}
    out["accept-encoding"] = "identity"
    return out


def passed_back(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP}


class Unreachable(Exception):
    """No answer from the upstream: the status to answer and an OpenAI-shaped body."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body["error"]["message"])
        self.status, self.body = status, body


class Upstream:
    """One pooled HTTP client to the model server."""

    def __init__(self, url: str, timeout_s: float, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = base_url(url)
        timeout = httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        self._http = httpx.AsyncClient(
            base_url=self.url, timeout=timeout, limits=limits, trust_env=False, transport=transport
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    def failed(self, exc: httpx.HTTPError) -> Unreachable:
        """The 502 (or 504) for an upstream that did not answer, or broke off its answer."""
        if isinstance(exc, httpx.TimeoutException):
            message = f"the model server at {self.url} did not answer in time ({type(exc).__name__})"
            return Unreachable(504, error_body(message, "upstream_timeout", code=504))
        message = f"the model server at {self.url} did not answer whole ({exc or type(exc).__name__})"
        return Unreachable(502, error_body(message, "upstream_unreachable", code=502))

    async def send(
        self, method: str, path: str, headers: Mapping[str, str], content: bytes | None = None
    ) -> httpx.Response:
        """A whole answer, read."""
        try:
            return await self._http.request(method, path, headers=sent_on(headers), content=content)
        except httpx.HTTPError as exc:
            raise self.failed(exc) from exc

    async def open_stream(self, path: str, headers: Mapping[str, str], content: bytes) -> httpx.Response:
        """The answer with only its head read; the caller relays (or reads) its body and closes it."""
        request = self._http.build_request("POST", path, headers=sent_on(headers), content=content)
        try:
            return await self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self.failed(exc) from exc


async def relay(response: httpx.Response, on_answer: Callable[[str], None]) -> AsyncIterator[bytes]:
    """The streamed body, chunk by chunk as it arrives; the final answer (if the stream finished with one)
    goes to `on_answer` after the last chunk. A client that leaves closes the upstream's stream too."""
    seen = StreamedAnswer()
    try:
        async for chunk in response.aiter_raw():
            seen.feed(chunk)
            yield chunk
    except httpx.HTTPError:
        return  # the upstream broke off: the client sees the stream end; no answer to save
    finally:
        await response.aclose()
    answer = seen.answer()
    if answer is not None:
        on_answer(answer)
