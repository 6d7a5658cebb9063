"""Every response carries `X-Request-ID`: the caller's own (when sane) or a fresh one.

An agent that reports an error can quote it, and a client library can attach it to the exception it
raises. Plain ASGI, so the hot consume path pays only for one header.
"""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
_SANE = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")


class RequestId:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope.get("headers", ()) if k == HEADER), b"")
        request_id = given if _SANE.match(given) else uuid.uuid4().hex.encode()
        scope.setdefault("state", {})["request_id"] = request_id.decode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, request_id)]}
            await send(message)

        await self.app(scope, receive, send_with_id)
