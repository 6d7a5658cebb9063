"""Every response carries `X-Request-ID`: the caller's own (when sane) or a fresh one.

An agent that reports an error can quote it, and a client library can attach it to the exception it
raises. The id is also set in the logs' contextvar, so every line logged while the request is handled
carries it; with `access_log`, one line per request says what it was and how it ended. Plain ASGI, so
the hot consume path pays only for one header (and the access line, when asked for).
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..logs import ACCESS_LOGGER, REQUEST_ID

HEADER = b"x-request-id"
_SANE = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")
access_log = logging.getLogger(ACCESS_LOGGER)


class RequestId:
    def __init__(self, app: ASGIApp, *, access: bool = False) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope.get("headers", ()) if k == HEADER), b"")
        request_id = given if _SANE.match(given) else uuid.uuid4().hex.encode()
        text_id = request_id.decode()
        scope.setdefault("state", {})["request_id"] = text_id
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, request_id)]}
            await send(message)

        token = REQUEST_ID.set(text_id)
        started = time.perf_counter()
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            if self.access:
                elapsed_ms = round((time.perf_counter() - started) * 1000, 2)
                access_log.info(
                    "%s %s %d %.2fms",
                    scope["method"],
                    scope["path"],
                    status,
                    elapsed_ms,
                    extra={
                        "method": scope["method"],
                        "path": scope["path"],
                        "status": status,
                        "duration_ms": elapsed_ms,
                    },
                )
            REQUEST_ID.reset(token)
