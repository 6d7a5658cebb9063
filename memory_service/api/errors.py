"""Every error is JSON with a message that says what was wrong and what is allowed."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from memory_service.contract.models import ErrorOut
from memory_service.storage.chroma_process import ChromaProcessFailed
from memory_service.storage.database import UNAVAILABLE

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


def error_responses(*codes: int, described: dict[int, str] | None = None) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for the error statuses a route can really send, all with the one ErrorOut body
    (and so FastAPI's default 422 shape, which this service never sends, is not documented either)."""
    described = described or {}
    return {code: {"model": ErrorOut, "description": described.get(code, _DESCRIPTIONS[code])} for code in codes}


def _location(loc: tuple) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


def describe(error: dict) -> str:
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


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
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


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    body = exc.detail if isinstance(exc.detail, dict) else {"detail": exc.detail}
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code == 400 and (reason := _unparsable(exc.__cause__)):
        body["detail"] = reason
    if exc.status_code == 405:
        headers["Allow"] = _allowed_methods(request)
        body["detail"] = f"{request.method} is not allowed on {request.url.path}; allowed: {headers['Allow']}"
    body.setdefault("error", _STATUS_NAMES.get(exc.status_code, "error"))
    return JSONResponse(body, status_code=exc.status_code, headers=headers or None)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return JSONResponse({"error": "internal", "detail": f"internal error: {type(exc).__name__}"}, status_code=500)


async def _storage_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """The database is locked past its timeout, PostgreSQL is down or out of connections, or the vector
    store's process died (the next call starts another): retry later."""
    log.warning("storage unavailable on %s %s: %s", request.method, request.url.path, exc)
    return JSONResponse(
        {"error": "unavailable", "detail": f"storage unavailable, nothing changed: {' '.join(str(exc).split())[:300]}"},
        status_code=503,
        headers={"Retry-After": "1"},
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    for error in (*UNAVAILABLE, ChromaProcessFailed):
        app.add_exception_handler(error, _storage_unavailable)
    app.add_exception_handler(Exception, _unexpected)
