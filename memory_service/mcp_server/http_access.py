"""Who may use `memory-service mcp --transport http`: whoever reaches the port acts with the server's API key.

So beyond loopback the server does not start without a bearer token (`--token` / MEMORY_MCP_TOKEN) that every
request must carry. Without a token (loopback only) a web page in the user's browser is the threat, as for the
keyless API (api/host_guard.py): through DNS rebinding it reaches 127.0.0.1 under its own name, so only
trusted Host names are answered (loopback names, the bound host, MEMORY_TRUSTED_HOSTS) and a request a browser
marks as coming from another site is refused. The header parsing is the API's own (api/host_names.py, standard
library only, so this loads neither FastAPI nor the API's auth).
"""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

from ..api.host_names import LOOPBACK_NAMES, host_name, origin_authority
from ..config import ConfigError, is_loopback

MIN_TOKEN_CHARS = 16


def check_http_exposure(host: str, token: str | None) -> None:
    """Refuse to serve the key beyond loopback without a token, or with a token too short to resist guessing."""
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"the MCP token (--token / MEMORY_MCP_TOKEN) must be at least {MIN_TOKEN_CHARS} characters")
    if token is None and not is_loopback(host):
        raise ConfigError(
            f"refusing to serve MCP over HTTP on {host} without a token: whoever reaches the port would act with "
            "this server's API key. Set MEMORY_MCP_TOKEN (or --token) to a long random secret that clients send "
            "as `Authorization: Bearer <token>`, or bind to 127.0.0.1"
        )


class McpAccess:
    """Plain ASGI in front of the MCP app: the bearer token if one is set, else the Host and Origin checks."""

    def __init__(self, app: ASGIApp, *, token: str | None, bound: str, trusted: tuple[str, ...] = ()) -> None:
        self.app, self.token = app, token
        self.trusted = LOOPBACK_NAMES | {h.lower() for h in trusted}
        bound_name = host_name(f"[{bound}]" if ":" in bound else bound)
        if bound_name and bound_name not in ("0.0.0.0", "[::]"):
            self.trusted |= {bound_name}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        refusal = self.check(headers)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, error, detail = refusal
        body = json.dumps({"error": error, "detail": detail}).encode()
        extra = [(b"www-authenticate", b'Bearer realm="memory-service-mcp"')] if status == 401 else []
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def check(self, headers: dict[str, str]) -> tuple[int, str, str] | None:
        if self.token is not None:
            scheme, _, given = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
                return 401, "unauthorized", "this MCP server wants `Authorization: Bearer <MEMORY_MCP_TOKEN>`"
            return None  # the token admits: a browser never sends it on its own
        host = headers.get("host")
        if host is None or host_name(host) not in self.trusted:
            return (
                421,
                "untrusted_host",
                f"Host {host!r} is not one this MCP server answers to: use http://127.0.0.1:<port>, or add the "
                "name to MEMORY_TRUSTED_HOSTS",
            )
        if self._cross_site(headers, host):
            return 403, "cross_site", "refused: a request from another site (Origin or Sec-Fetch-Site)"
        return None

    def _cross_site(self, headers: dict[str, str], host: str) -> bool:
        if headers.get("sec-fetch-site", "").lower() in ("cross-site", "same-site"):
            return True
        origin = headers.get("origin")
        if origin is None:
            return False
        authority = origin_authority(origin)
        return authority is None or (authority != host.strip().lower() and host_name(authority) not in self.trusted)
