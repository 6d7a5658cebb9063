"""The API's app factory: configuration in, a FastAPI app with its services' lifespan out (the console is
mounted on it by `memory_service.app`)."""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..config import ConfigError, Settings, is_loopback
from ..services import KEYS_FILE, KeyStore, Services
from . import docs_pages, errors
from .host_guard import HostGuard
from .request_id import RequestId
from .routes import gate as routes_gate
from .routes import health as routes_health
from .routes import hindsight as routes_hindsight
from .routes import keys as routes_keys
from .routes import limits as routes_limits
from .routes import mem0 as routes_mem0
from .routes import memories as routes_memories
from .routes import recall as routes_recall
from .routes import team as routes_team
from .routes import transfer as routes_transfer
from .routes import webhooks as routes_webhooks

BODY_OVERHEAD_BYTES = 64 * 1024


def package_version() -> str:
    """The installed distribution's version (pyproject's), for /docs, /health and /ready."""
    from importlib import metadata

    try:
        return metadata.version("memory-service")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _stored_keys(settings: Settings) -> bool:
    from ..services import open_database

    database = open_database(settings)
    path = settings.data_dir / KEYS_FILE
    if database is None and not path.exists():
        return False
    store = KeyStore(database or path)
    try:
        return store.has_keys()
    finally:
        store.close()
        if database is not None:
            database.close()


def keyless(settings: Settings) -> bool:
    """No key anywhere (MEMORY_API_KEYS or an active stored key): every request is admin of team `local`."""
    return not settings.auth_enabled and not _stored_keys(settings)


def check_exposure(settings: Settings) -> None:
    """Without API keys everything belongs to one local team: never expose that beyond loopback.

    (Beyond loopback a missing key is always a 401, even if every stored key is later revoked.)
    """
    if not settings.auth_enabled and not is_loopback(settings.host) and not _stored_keys(settings):
        raise ConfigError(
            f"refusing to listen on {settings.host} without API keys: create one with `memory-service keys "
            "create --team T --role admin`, or set MEMORY_API_KEYS='key:team,...', or bind to 127.0.0.1"
        )


class BodySizeLimit:
    """Refuse an oversized body from its Content-Length before reading it, and a chunked one (no length) as soon
    as it passes the limit: neither is ever held in memory whole. Plain ASGI: costs nothing."""

    STREAMED = frozenset({"/v1/import"})  # read line by line, with its own limit

    def __init__(self, app: ASGIApp, *, max_body: int, max_text: int) -> None:
        self.app, self.max_body, self.max_text = app, max_body, max_text

    def _limit(self, size: str) -> str:
        return (
            f"request body is {size} bytes; the limit is {self.max_body} bytes "
            f"(texts up to {self.max_text} bytes, MEMORY_MAX_TEXT_BYTES)"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.STREAMED:
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body:
                response = JSONResponse({"error": "too_large", "detail": self._limit(str(int(value)))}, status_code=413)
                await response(scope, receive, send)
                return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body:
                # the route's body read raises it; the error handler answers 413 before the rest is read
                raise HTTPException(413, self._limit("more than " + str(self.max_body)))
            return message

        await self.app(scope, counted, send)


def telemetry_off() -> dict[str, Any]:
    """FastAPI's own OpenTelemetry, off, on the versions that have it (0.16x on).

    It sends spans, metrics and logs to whatever OTLP endpoint the environment names once
    FASTAPI_OTEL_AUTO_CONFIGURE=true is set (a variable meant for other apps on the same host), whenever its
    exporter package is installed (`fastapi[standard]` brings it). The service makes no outbound call but
    to its llama-server and Chroma.
    """
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}
    return {
        "telemetry": {
            "tracing": False,
            "metrics": False,
            "logs": False,
            "operation_spans": False,
            "auto_configure": False,
        }
    }


def _lifespan(
    settings: Settings,
    speed_prior: tuple[float, float] | None,
    services: Services | None,
    run_workers: bool,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """What runs around the app's life: the caller's services (and, if asked, their workers), or its own."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if services is not None:
            app.state.services = services
            if not run_workers:
                yield
                return
            await services.start()
            try:
                yield
            finally:
                await services.stop_workers()
            return
        opened = Services.open(settings, speed_prior=speed_prior)
        app.state.services = opened
        await opened.start()
        try:
            yield
        finally:
            await opened.stop()

    return lifespan


def create_api(
    settings: Settings,
    *,
    speed_prior: tuple[float, float] | None = None,
    services: Services | None = None,
    run_workers: bool = False,
) -> FastAPI:
    """The API app, without the console (`memory_service.app.create_app` adds it). With `services`, the caller owns them (in-process tests); otherwise the lifespan opens them.

    `speed_prior`: the model's (prompt, generation) tokens/s measured when its build was proven, so the
    first estimates before any extraction rest on a measurement.
    `run_workers`: with `services`, the lifespan also runs their extraction, passage and consolidation loops
    (and stops them, leaving the stores open to their owner), so jobs reach `done` with no `serve` process.
    """
    check_exposure(settings)
    app = FastAPI(
        title="memory-service",
        version=package_version(),
        description="Durable memory for agent teams: remember, recall, daily limits. Local llama.cpp extraction.",
        lifespan=_lifespan(settings, speed_prior, services, run_workers),
        docs_url=None,  # FastAPI's pages load their assets from a CDN: docs_pages serves them from here
        redoc_url=None,
        **telemetry_off(),
    )
    docs_pages.install(app)
    app.state.version, app.state.started = package_version(), time.monotonic()  # /health and /ready show them
    if services is not None:
        app.state.services = services
    errors.install(app)

    app.add_middleware(
        BodySizeLimit, max_body=settings.max_text_bytes * 4 + BODY_OVERHEAD_BYTES, max_text=settings.max_text_bytes
    )
    # before any body is read: a page in a browser reaches a keyless service only from a trusted name
    app.add_middleware(HostGuard, trusted=settings.trusted_hosts, bound=settings.host)
    app.add_middleware(RequestId, access=settings.access_log)  # outermost: even a refused body gets its id

    for module in (
        routes_memories,
        routes_recall,
        routes_transfer,
        routes_limits,
        routes_gate,
        routes_team,
        routes_keys,
        routes_webhooks,
        routes_health,
        routes_mem0,  # mem0's platform API under /mem0 for its clients; it ends in a catch-all under /mem0
        routes_hindsight,  # Hindsight's REST API for its clients; last: it ends in a catch-all
    ):
        app.include_router(module.router)
    # the product card's short paths, as aliases of the v1 routes
    app.add_api_route(
        "/remember",
        routes_memories.remember,
        methods=["POST"],
        status_code=202,
        response_model=routes_memories.RememberResponse,
        include_in_schema=False,
    )
    app.add_api_route(
        "/recall",
        routes_recall.recall_route,
        methods=["POST"],
        response_model=routes_recall.RecallResponse,
        include_in_schema=False,
    )
    routes_transfer.document_lines(app)
    return app
