"""The client's exceptions: one class per kind of failure a caller handles differently, all under
`MemoryServiceError`, so `except MemoryServiceError` still catches every one (httpx's `HTTPError` tree is the
model).

| status | class | what the caller does |
|---|---|---|
| 400, 413, 422 | `BadRequest` | fix the arguments (the message names the field and its bound) |
| 401 | `Unauthorized` | check the API key |
| 403 | `Forbidden` | this key's role or agent may not do it; retrying will not help |
| 404 | `NotFound` | the id, limit or key does not exist in this team (or was forgotten) |
| 409 | `Conflict` | an idempotency key reused with other values: choose another |
| 429 | `RateLimited` | wait `retry_after_s` (the client already waited what fitted its budget) |
| 503, no answer | `Unavailable` | the service is down, starting or busy: start it or retry later |
| 409, 429 of a guard | `Refused` | the guarded function did not run: hand `exc.message` to the model |

Anything else (a 500) is a plain `MemoryServiceError`.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BadRequest",
    "Conflict",
    "Forbidden",
    "MemoryServiceError",
    "NotFound",
    "RateLimited",
    "Refused",
    "Unauthorized",
    "Unavailable",
    "error_for",
]


class MemoryServiceError(Exception):
    """Any failed call: the HTTP status (0 when no answer came), the server's message, the request id."""

    def __init__(
        self,
        status: int,
        message: str,
        request_id: str | None,
        body: Any = None,
        *,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"{status} {message} (request id {request_id})")
        self.status, self.message, self.request_id, self.body = status, message, request_id, body
        self.retry_after_s = retry_after_s  # what the server asked for (429/503), None without Retry-After


class BadRequest(MemoryServiceError):
    """400, 413 or 422: the arguments were refused; the message names the field and what is allowed."""


class Unauthorized(MemoryServiceError):
    """401: no key, or a key the service does not know (revoked, mistyped, or keys are off)."""


class Forbidden(MemoryServiceError):
    """403: the key's role or pinned agent may not do this."""


class NotFound(MemoryServiceError):
    """404: no such memory, limit or key in this key's team."""


class Conflict(MemoryServiceError):
    """409: an idempotency key already used with other values."""


class RateLimited(MemoryServiceError):
    """429 whose wait did not fit the retry budget; `retry_after_s` says how long the server asked for."""


class Unavailable(MemoryServiceError):
    """503, or no answer at all (status 0: refused, unknown host, timed out): the message names the URL."""


class Refused(MemoryServiceError):
    """A guarded call the gate refused (memory.guard): the function did not run.

    `reason` is "handled" (the key was handled already), "in_progress" (another call holds it), "limit" (the
    daily limit is used up) or "arguments" (the key could not be built from the call's arguments); `message`
    is one plain sentence a model can act on; `handled` (who, when, which tool, the result) or `limit` (used,
    allowed, resets_at) say more. `except Refused as exc: return exc.message` hands the sentence to the model.
    """

    def __init__(
        self,
        status: int,
        message: str,
        request_id: str | None = None,
        body: Any = None,
        *,
        reason: str,
        handled: Any = None,
        limit: Any = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(status, message, request_id, body, retry_after_s=retry_after_s)
        self.reason, self.handled, self.limit = reason, handled, limit

    def __str__(self) -> str:
        return self.message


_BY_STATUS: dict[int, type[MemoryServiceError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: BadRequest,
    422: BadRequest,
    429: RateLimited,
    503: Unavailable,
}


def error_for(status: int) -> type[MemoryServiceError]:
    """The class of a failed answer's status; `MemoryServiceError` itself for the rest (a 500)."""
    return _BY_STATUS.get(status, MemoryServiceError)
