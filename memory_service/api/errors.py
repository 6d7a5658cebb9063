"""THE one error mapping: every error type the service knows becomes one status and one JSON shape here.

Request problems (validation, HTTPException) keep their own handlers below; every other exception a route
raises reaches `classify`: the stores' domain errors (4xx), storage that is busy or gone for now (503 with
Retry-After) and, for anything else, a bug: 500 with the request id, logged with its traceback. The
console asks for the same classification and renders it as a page (`render_pages_under`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..contract.limit_rules import (
    IdempotencyConflict,
    InvalidInput,
    LimitNotFound,
    ReservationConflict,
    ReservationNotFound,
)
from ..contract.models import ErrorOut
from ..logs import REQUEST_ID
from ..services import ChromaProcessFailed, KeyNotFound, LastKey, storage_unavailable

log = logging.getLogger("memory_service.api")

_STATUS_NAMES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "limit_reached",
    500: "internal",
    501: "not_implemented",
    503: "unavailable",
}


_DESCRIPTIONS = {
    400: "Body is not JSON, or a parameter cannot be used as given (the message says which). Nothing changed.",
    401: "Missing, unknown or revoked API key.",
    403: "The key's role is below what this route needs, or a key pinned to one agent acts as another. "
    "The message names the role needed. Nothing changed.",
    404: "Not found in the caller's team.",
    409: "Conflicts with an earlier request. Nothing changed.",
    413: "Body too large (the message gives the limit). Nothing changed.",
    422: "Invalid input: the message names each field and what is allowed. Nothing changed.",
    503: "Storage busy or closed: retry after `Retry-After` seconds. Nothing changed.",
}


# a route's `responses=`: what FastAPI documents for each status
Responses = dict[int | str, dict[str, Any]]


def error_responses(*codes: int, described: dict[int, str] | None = None) -> Responses:
    """`responses=` entries for the error statuses a route can really send, all with the one ErrorOut body
    (and so FastAPI's default 422 shape, which this service never sends, is not documented either)."""
    described = described or {}
    return {code: {"model": ErrorOut, "description": described.get(code, _DESCRIPTIONS[code])} for code in codes}


def _location(loc: tuple) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


def describe(error: Mapping[str, Any]) -> str:
    """One validation error as 'field: what is wrong'."""
    kind = error.get("type", "")
    where = _location(tuple(error.get("loc", ())))
    if kind == "extra_forbidden":
        return f"{where}: unknown field (not part of this request's schema, see /docs)"
    if kind == "missing":
        return f"{where}: field required"
    msg = error.get("msg", "invalid")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return f"{where}: {msg}"


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)  # registered for it alone
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return JSONResponse({"error": "bad_request", "detail": "request body is not valid JSON"}, status_code=400)
    messages = [describe(e) for e in errors]
    return JSONResponse(
        {
            "error": "invalid_request",
            "detail": "; ".join(messages),
            "errors": [{"field": _location(tuple(e.get("loc", ()))), "message": m} for e, m in zip(errors, messages)],
        },
        status_code=422,
    )


def _unparsable(cause: BaseException | None) -> str | None:
    """What was wrong with a body FastAPI could not parse (it says only "There was an error parsing the body")."""
    if isinstance(cause, UnicodeError):
        return "request body is not valid UTF-8: send JSON encoded as UTF-8"
    if isinstance(cause, RecursionError):
        return (
            "request body nests JSON objects or arrays too deeply to parse; no request needs more than a few "
            "levels (metadata: at most 32)"
        )
    return None


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path: the router's 405 names only the first route that matched.
    Asks each route whether it would fully match the request with another method (public route API, so it
    holds however the framework nests included routers)."""
    routes = request.app.router.routes
    return ", ".join(
        method
        for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
        if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes)
    )


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)  # registered for it alone
    body = exc.detail if isinstance(exc.detail, dict) else {"detail": exc.detail}
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code == 400 and (reason := _unparsable(exc.__cause__)):
        body["detail"] = reason
    if exc.status_code == 405:
        headers["Allow"] = _allowed_methods(request)
        body["detail"] = f"{request.method} is not allowed on {request.url.path}; allowed: {headers['Allow']}"
    body.setdefault("error", _STATUS_NAMES.get(exc.status_code, "error"))
    return JSONResponse(body, status_code=exc.status_code, headers=headers or None)


@dataclass(frozen=True)
class Problem:
    """One error, classified: the status, the message for people, and any headers (Retry-After)."""

    status: int
    detail: str
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def error(self) -> str:
        """The code for programs (ErrorOut.error)."""
        return _STATUS_NAMES.get(self.status, "error")

    def body(self, request_id: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.error, "detail": self.detail}
        if request_id is not None and self.status >= 500:
            body["request_id"] = request_id
        return body


def classify(exc: BaseException) -> Problem:
    """Every error a route can raise, mapped once. Only storage that is busy or gone for now is a 503:
    a database error that is a bug ("no such column") is a 500 like any other."""
    if isinstance(exc, InvalidInput):
        return Problem(422, str(exc))
    if isinstance(exc, LimitNotFound | KeyNotFound | ReservationNotFound):
        return Problem(404, str(exc))
    if isinstance(exc, IdempotencyConflict | LastKey | ReservationConflict):
        return Problem(409, str(exc))
    if isinstance(exc, ChromaProcessFailed) or storage_unavailable(exc):
        reason = " ".join(str(exc).split())[:300]
        return Problem(503, f"storage unavailable, nothing changed: {reason}", {"Retry-After": "1"})
    return Problem(500, f"internal error: {type(exc).__name__}")


def request_id_of(request: Request) -> str | None:
    """The id `RequestId` gave this request (and returns in X-Request-ID)."""
    return getattr(request.state, "request_id", None) or REQUEST_ID.get()


# a renderer of a classified error as a page, for the routes under a path prefix (the console)
PageRenderer = Callable[[Request, Problem, str | None], Response]


def render_pages_under(app: FastAPI, prefix: str, render: PageRenderer) -> None:
    """Errors under `prefix` are rendered by `render` (same classification, another format)."""
    app.state.error_pages = {**getattr(app.state, "error_pages", {}), prefix: render}


def answer(request: Request, exc: BaseException) -> Response:
    """The response for `exc`: logged (a 500 with its traceback), as JSON or as the page of its prefix."""
    problem = classify(exc)
    where = f"{request.method} {request.url.path}"
    if problem.status >= 500 and problem.status != 503:
        log.error("unhandled error on %s", where, exc_info=(type(exc), exc, exc.__traceback__))
    elif problem.status == 503:
        log.warning("storage unavailable on %s: %s", where, exc)
    request_id = request_id_of(request)
    pages: dict[str, PageRenderer] = getattr(request.app.state, "error_pages", {})
    for prefix, render in pages.items():
        if request.url.path == prefix or request.url.path.startswith(prefix + "/"):
            return render(request, problem, request_id)
    return JSONResponse(problem.body(request_id), status_code=problem.status, headers=dict(problem.headers) or None)


class ErrorBoundary:
    """Catches what no handler took, inside the request-id middleware, so even a bug's 500 is in the
    service's error shape and carries X-Request-ID (the server's own 500 would have neither). An error
    after the response started cannot be answered any more: it goes on to the server."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            if started:
                raise
            await answer(Request(scope, receive), exc)(scope, receive, send)


def install(app: FastAPI) -> None:
    """The handlers, and the boundary as the innermost middleware (call before adding the request id's)."""
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(ErrorBoundary)
