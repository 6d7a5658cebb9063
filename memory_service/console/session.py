"""Who is looking at the console: a session id in a cookie, resolved to its key's team like a bearer key.

The login form takes the API key once; the cookie then holds a session id, never the key: a fresh random id
at every login (a cookie planted before it is not a session, and is ended by it), of which the key store
keeps only the hash beside the key's, so logout ends it server-side, a revoked key ends its sessions, and
none outlives `SESSION_TTL_S` (issue 53: the cookie held the key itself, the same at every login, still good
after logout, and a planted one was accepted). It is HttpOnly, SameSite=Strict, scoped to /ui, and Secure
when the console is reached over https, so page scripts cannot read it and other sites cannot send it. Every
POST also carries a CSRF token derived from the session id, so a token is worthless without the session.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from fastapi import Request

from ..api.auth import caller_of_key_hash, open_access
from ..config import Settings

COOKIE = "memory_console_session"
COOKIE_PATH = "/ui"
MAX_FORM_BYTES = 16 * 1024
LOGIN_PURPOSE = "login"  # the CSRF token of the login form, where there is no key yet


class LoginRequired(Exception):
    """No valid key in the cookie: the handler sends the browser to the login form."""

    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


class CsrfRejected(Exception):
    """A POST without the right token or from another origin: refused, nothing changed."""


@dataclass(frozen=True)
class Session:
    team: str
    csrf: str
    role: str = "admin"  # the key's role: a read key browses, retrying a job needs write
    keyless: bool = False  # no API key anywhere: everything is the team `local`, and the header says so


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def csrf_token(secret: bytes, key: str) -> str:
    return hmac.new(secret, b"csrf\x00" + key.encode(), hashlib.sha256).hexdigest()


def session_csrf(session: str) -> str:
    """A session's CSRF token: of its id, so every API process derives the same one, and none without it."""
    return hashlib.sha256(b"console csrf\x00" + session.encode()).hexdigest()


def _secret(request: Request) -> bytes:
    return request.app.state.console_secret


def _settings(request: Request) -> Settings:
    return request.app.state.services.settings


def resolve(request: Request) -> tuple[Session, str] | None:
    """The session and its id from the cookie, or None; without API keys everyone is the local team. A session
    whose key was revoked (or never was one, or is pinned to an agent) resolves to nothing."""
    services = request.app.state.services
    if open_access(services):
        return Session(Settings.LOCAL_TEAM, csrf_token(_secret(request), ""), keyless=True), ""
    session = request.cookies.get(COOKIE, "")
    digest = services.console_session_key(session) if session else None
    caller = caller_of_key_hash(services, digest) if digest else None
    if caller is None or caller.agent_id is not None:  # a key pinned to an agent sees only its agent: no console
        return None
    return Session(caller.team, session_csrf(session), caller.role), session


async def require_session(request: Request) -> Session:
    """Dependency of every console page: the caller's team, or a redirect to the login form."""
    found = await request.app.state.services.off_loop(resolve, request)  # reads the key store: off the loop
    if found is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(target)
    return found[0]


def login_token(request: Request) -> str:
    return csrf_token(_secret(request), LOGIN_PURPOSE)


def safe_next(path: str | None) -> str:
    """Only a path inside the console: a login link cannot send the browser elsewhere."""
    if path and path.startswith("/ui") and not path.startswith("//") and "\\" not in path:
        return path
    return "/ui/memories"


def same_origin(request: Request) -> bool:
    """A browser's Origin (or Sec-Fetch-Site) says where a POST came from; refuse any other site."""
    if request.headers.get("sec-fetch-site") in ("cross-site", "same-site"):
        return False
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host", "")


def token_matches(given: str, expected: str) -> bool:
    """Constant-time, on bytes: `hmac.compare_digest` refuses a str that is not ASCII (a 500, not a 403)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())


async def read_form(request: Request) -> dict[str, str]:
    """A small urlencoded form (the console's only kind); last value wins."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise CsrfRejected("form too large")
    return dict(parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True))


async def checked_form(request: Request, session: Session) -> dict[str, str]:
    """The POSTed form, after its origin and CSRF token are verified."""
    form = await read_form(request)
    if not same_origin(request) or not token_matches(form.get("csrf", ""), session.csrf):
        raise CsrfRejected("missing or wrong CSRF token")
    return form


def cookie_secure(request: Request) -> bool:
    return request.url.scheme == "https"
