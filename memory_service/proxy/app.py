"""The proxy's ASGI app: `POST /v1/chat/completions` (whole and streamed) and `GET /v1/models` in front of any
OpenAI-compatible model server, plus `GET /health`.

A chat request: read within bounds → who and which session → the session's brief (one recall at its first
request, under a time limit, then fixed) → the new user messages queued for saving → forwarded with the brief
→ the upstream's answer relayed as it was sent, its final answer queued for saving. The memory service is
never waited on past the recall's limit: down, slow or failing, the model call goes on without a brief.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..client import AsyncMemoryClient
from ..config import DEFAULT_URL
from .access import Access
from .brief import opening_query, recall_brief
from .messages import MAX_BODY_BYTES, BadRequest, answer_of, error_body, first_text, parse_chat, with_brief
from .saving import Saver, answer_save, user_saves
from .sessions import BRIEF_TRIES, SESSIONS, Identity, Session, Sessions, identify
from .upstream import Unreachable, Upstream, passed_back, relay

log = logging.getLogger("memory_service.proxy")

CHAT = "/v1/chat/completions"
SAVE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ProxyConfig:
    upstream: str
    memory_url: str = DEFAULT_URL
    api_key: str | None = None
    brief_tokens: int = 300
    recall_timeout_s: float = 0.3
    default_agent: str = "agent"
    upstream_timeout_s: float = 600.0
    host: str = "127.0.0.1"  # where it listens: that name is answered besides loopback's
    trusted_hosts: tuple[str, ...] = ()
    sessions: int = SESSIONS


class Proxy:
    """What the routes share: the sessions, the two memory clients, the save queue and the upstream."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.access = Access(config.host, config.trusted_hosts)
        self.sessions = Sessions(config.sessions)
        # the brief's client never waits to resend: the recall has a few hundred ms, not a retry budget
        self.recaller = AsyncMemoryClient(
            config.memory_url, api_key=config.api_key, timeout_s=config.recall_timeout_s + 1, retry_budget_s=0
        )
        self.memory = AsyncMemoryClient(
            config.memory_url, api_key=config.api_key, timeout_s=SAVE_TIMEOUT_S, retry_budget_s=SAVE_TIMEOUT_S
        )
        self.saver = Saver(self.memory)
        self.upstream = Upstream(config.upstream, config.upstream_timeout_s)

    async def close(self) -> None:
        await self.saver.stop()
        await self.upstream.aclose()
        await self.recaller.aclose()
        await self.memory.aclose()

    # ---------------------------------------------------------------- the brief

    async def brief_for(self, who: Identity, session: Session, messages: list[dict[str, Any]]) -> str | None:
        """The session's brief: fixed after its first recall that answered; tried again (up to BRIEF_TRIES
        requests) after one that did not, the request going on without it meanwhile."""
        if session.fixed or session.tries >= BRIEF_TRIES:
            return session.brief
        async with session.lock:  # two first requests of one session at once: one recall
            if session.fixed:
                return session.brief
            query = opening_query(first_text(messages, "user"), first_text(messages, "system"))
            if not query:
                session.fixed = True
                return None
            began = time.monotonic()
            got = await recall_brief(
                self.recaller, query, budget_tokens=self.config.brief_tokens, limit_s=self.config.recall_timeout_s
            )
            took_ms = (time.monotonic() - began) * 1000
            if got.failure:
                session.tries += 1
                later = "tries again at its next request" if session.tries < BRIEF_TRIES else "goes on without one"
                log.warning(
                    "session %s of agent %s: %s: sent without a brief; the session %s",
                    who.run_id,
                    who.agent,
                    got.failure,
                    later,
                )
                return None
            session.brief, session.fixed = got.text, True
            log.info(
                "session %s of agent %s: brief of %d line(s), %s tokens, recalled in %.0f ms; fixed for the session",
                who.run_id,
                who.agent,
                got.lines,
                got.tokens,
                took_ms,
            )
            return session.brief

    # ---------------------------------------------------------------- routes

    async def chat(self, request: Request) -> Response:
        try:
            raw = await _read_body(request)
            body = parse_chat(raw)
            who = identify(dict(request.headers), body, self.config.default_agent)
        except BadRequest as exc:
            return JSONResponse(error_body(exc.message, "invalid_request_error", exc.param), exc.status)
        messages: list[dict[str, Any]] = body["messages"]
        session = self.sessions.get(who)
        brief = await self.brief_for(who, session, messages)
        for save in user_saves(who, messages):  # after the brief: this opening is not recalled into its own brief
            if session.note_saved(save.key):
                self.saver.offer(save)
        if brief is not None:
            raw = json.dumps({**body, "messages": with_brief(messages, brief)}, separators=(",", ":")).encode()

        def answered(text: str) -> None:
            save = answer_save(who, messages, text)
            if session.note_saved(save.key):
                self.saver.offer(save)

        try:
            if body.get("stream") is True:
                return await self._streamed(request, raw, answered)
            response = await self.upstream.send("POST", CHAT, request.headers, raw)
        except Unreachable as exc:
            log.warning("%s", exc)
            return JSONResponse(exc.body, exc.status)
        if response.status_code == 200:
            _answer_in(response.content, answered)
        return Response(response.content, response.status_code, headers=passed_back(response.headers))

    async def _streamed(self, request: Request, raw: bytes, answered: Callable[[str], None]) -> Response:
        response = await self.upstream.open_stream(CHAT, request.headers, raw)
        if response.status_code != 200 or "text/event-stream" not in response.headers.get("content-type", ""):
            try:
                content = await response.aread()  # an error (or an upstream that does not stream): whole
            except httpx.HTTPError as exc:
                raise self.upstream.failed(exc) from exc
            finally:
                await response.aclose()
            if response.status_code == 200:
                _answer_in(content, answered)
            return Response(content, response.status_code, headers=passed_back(response.headers))
        return StreamingResponse(relay(response, answered), response.status_code, headers=passed_back(response.headers))

    async def models(self, request: Request) -> Response:
        try:
            response = await self.upstream.send("GET", "/v1/models", request.headers)
        except Unreachable as exc:
            return JSONResponse(exc.body, exc.status)
        return Response(response.content, response.status_code, headers=passed_back(response.headers))

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "upstream": self.upstream.url, "sessions": len(self.sessions)})


def _answer_in(content: bytes, answered: Callable[[str], None]) -> None:
    try:
        text = answer_of(json.loads(content))
    except ValueError:
        return
    if text is not None:
        answered(text)


async def _read_body(request: Request) -> bytes:
    """The body, refused (413) from its Content-Length before it is read, or as soon as it passes the bound."""
    too_large = f"the request body is too large (at most {MAX_BODY_BYTES} bytes)"
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise BadRequest(too_large, 413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BadRequest(too_large, 413)
        chunks.append(chunk)
    return b"".join(chunks)


class _Guarded:
    """The Host and Origin checks in front of every route (access.py)."""

    def __init__(self, app: Starlette, proxy: Proxy) -> None:
        self.app, self.proxy = app, proxy

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            refusal = self.proxy.access.refusal(headers)
            if refusal is not None:
                status, message = refusal
                await JSONResponse(error_body(message, "forbidden", code=status), status)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(config: ProxyConfig) -> Any:
    """The ASGI app; its lifespan starts the save queue and, at shutdown, sends what is queued."""
    proxy = Proxy(config)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        proxy.saver.start()
        log.info("memory proxy in front of %s, memory at %s", proxy.upstream.url, config.memory_url)
        try:
            yield
        finally:
            await proxy.close()

    async def not_served(request: Request) -> Response:
        message = f"{request.method} {request.url.path} is not served: this proxy serves POST {CHAT} and GET /v1/models"
        return JSONResponse(error_body(message, "not_found", code=404), 404)

    routes = [
        Route(CHAT, proxy.chat, methods=["POST"]),
        Route("/chat/completions", proxy.chat, methods=["POST"]),
        Route("/v1/models", proxy.models, methods=["GET"]),
        Route("/models", proxy.models, methods=["GET"]),
        Route("/health", proxy.health, methods=["GET"]),
        Route("/{path:path}", not_served, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.proxy = proxy
    return _Guarded(app, proxy)
