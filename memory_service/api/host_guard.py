"""Which web pages may talk to the service: Host and Origin checks, below every route.

Keyless mode (no key anywhere, loopback bind) makes every request the local admin, so the only thing between
a web page in the user's browser and the service is the browser's same-origin policy. DNS rebinding defeats
that: a page at evil.example re-points its name to 127.0.0.1 and reads the answers, sending `Host:
evil.example`. So in keyless mode only trusted Host names are answered (loopback names, the bound host and
MEMORY_TRUSTED_HOSTS), and a write that a browser marks as coming from another site is refused. The console's
forms are refused from another site in any mode (its cookie is the key).
"""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .auth import open_access
from .host_names import LOOPBACK_NAMES, host_authority, host_name, origin_authority

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _refusal(status: int, error: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status)


class HostGuard:
    """Plain ASGI. The trusted-host path costs a header scan; the key store is asked only when a request is
    about to be refused, to tell keyless mode from keyed."""

    def __init__(self, app: ASGIApp, *, trusted: tuple[str, ...], bound: str) -> None:
        self.app = app
        self.configured = frozenset(h.lower() for h in trusted)
        self.trusted = (
            LOOPBACK_NAMES | self.configured | {host_name(f"[{bound}]" if ":" in bound else bound) or "127.0.0.1"}
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = await self.check(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        await refusal(scope, receive, send)

    async def check(self, scope: Scope) -> JSONResponse | None:
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope.get("headers", ())}
        host = headers.get("host")
        trusted_host = host is None or host_name(host) in self.trusted
        unsafe = scope.get("method", "GET") not in SAFE_METHODS
        cross = unsafe and self._cross_site(headers)
        console = scope.get("path", "").startswith("/ui")
        if trusted_host and not cross:
            return None
        if cross and console:  # the console's cookie is its key: no form from another site, in any mode
            return _refusal(403, "cross_site", "refused: this form was posted from another site (Origin)")
        services = scope["app"].state.services
        if not await services.off_loop(open_access, services):  # reads the key store: off the event loop
            return None  # with keys, a key is what admits a request; the API's bearer keys are never sent cross-site
        if not trusted_host:
            return _refusal(
                421,
                "untrusted_host",
                f"Host {host!r} is not one this keyless service answers to: use http://127.0.0.1:<port> or "
                "http://localhost:<port>, or add the name to MEMORY_TRUSTED_HOSTS (e.g. a reverse proxy's)",
            )
        return _refusal(
            403,
            "cross_site",
            "refused: a write from another site (Origin or Sec-Fetch-Site) to a keyless service; "
            "send it from a local client without an Origin header",
        )

    def _cross_site(self, headers: dict[str, str]) -> bool:
        """A browser says where a request came from: Sec-Fetch-Site, or an Origin other than this service's
        (scheme aside: the same host and port), unless it is a MEMORY_TRUSTED_HOSTS name (a proxy's)."""
        if headers.get("sec-fetch-site", "").lower() in ("cross-site", "same-site"):
            return True
        origin = headers.get("origin")
        if origin is None:
            return False
        authority = origin_authority(origin)
        if authority is None:  # `null` (a sandboxed frame, a file) or garbage
            return True
        if authority == host_authority(headers.get("host", "")) or host_name(authority) in self.configured:
            return False
        return True
