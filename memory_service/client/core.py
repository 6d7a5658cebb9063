"""The client's one implementation, with no I/O: it builds requests, reads answers, decides retries.

`MemoryClient` and `AsyncMemoryClient` (memory_client.py) only send what this builds, so the sync and async
clients cannot drift apart. Results are the wire's own pydantic models (contract/). It imports nothing of
the server: an agent that imports the client pays for no FastAPI, storage, Chroma, ONNX Runtime or torch.
"""

from __future__ import annotations

import builtins
import functools
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any, Generic, TypeVar

import httpx
from pydantic import TypeAdapter

from ..contract.gate import DEFAULT_LEASE_S, FinishAnswer, ReleaseAnswer, ReserveAnswer
from ..contract.limits import ConsumeAnswer, HandledOut, LimitOut
from ..contract.models import (
    ExportedMemory,
    ForgetResponse,
    ImportResponse,
    MemoryOut,
    MemoryPage,
    RecallResponse,
    RememberResponse,
    TeamOut,
)
from .errors import MemoryServiceError, Unavailable, error_for
from .service import path_segment

T = TypeVar("T")

RETRIED_STATUSES = (429, 503)
MAX_RETRIES = 4  # resends of one call at most, however short the waits asked for
REQUEST_ID = "X-Request-ID"
# no answer because the request never reached a service (refused, unknown host, no connection in time) or it
# never answered in time: resending only makes the caller wait longer, so these raise at once
_NOT_RESENT = (httpx.ConnectError, httpx.TimeoutException, httpx.UnsupportedProtocol, httpx.ProxyError)


@dataclass
class Call(Generic[T]):
    """One request and how to read its answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    json: Any = None
    content: bytes | None = None
    extra_timeout_s: float = 0.0
    idempotent: bool = True  # safe to resend when the answer was lost
    accept: tuple[int, ...] = ()  # error statuses that are answers, not failures (a denied consume)
    headers: dict[str, str] = field(default_factory=lambda: {REQUEST_ID: uuid.uuid4().hex})


@functools.cache
def _adapter(kind: Any) -> TypeAdapter:
    return TypeAdapter(kind)


def _model(kind: Any) -> Callable[[httpx.Response], Any]:
    """Read an answer as `kind`: a pydantic model or a dataclass (the ledger's record), one way for both."""
    adapter = _adapter(kind)
    return lambda response: adapter.validate_python(response.json())


def _none(response: httpx.Response) -> None:
    return None


def _lines(response: httpx.Response) -> list[ExportedMemory]:
    return [ExportedMemory.model_validate_json(line) for line in response.text.splitlines() if line.strip()]


def _iso(value: datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


def _drop_none(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


_LIMITS = TypeAdapter(list[LimitOut])


def _limit(name: str) -> str:
    return path_segment(name, "limit name")


def retry_after_s(response: httpx.Response) -> float | None:
    """Seconds the server asks us to wait (delta-seconds or an HTTP date), None without the header."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            return max(
                0.0, (parsedate_to_datetime(value) - datetime.now(parsedate_to_datetime(value).tzinfo)).total_seconds()
            )
        except (TypeError, ValueError):
            return 1.0


def retry_delay(
    call: Call[Any],
    response: httpx.Response | None,
    elapsed_s: float,
    budget_s: float,
    attempt: int,
    failure: Exception | None = None,
) -> float | None:
    """How long to wait before resending, or None to stop: an answer that says retry (a 429/503 with
    Retry-After) whose wait fits the budget, or an answer lost after the request went out (the connection
    dropped) to a call that is safe to resend. A service that is not there (refused, unknown host, timed out)
    is never waited for, and no call is resent more than MAX_RETRIES times."""
    if attempt >= MAX_RETRIES:
        return None
    if response is None:
        resendable = call.idempotent and not isinstance(failure, _NOT_RESENT)
        delay = min(2.0, 0.1 * 2**attempt) if resendable else None
    elif response.status_code in RETRIED_STATUSES:
        delay = retry_after_s(response)
    else:
        return None
    if delay is None or elapsed_s + delay > budget_s:
        return None
    return delay


def finish(call: Call[T], response: httpx.Response) -> T:
    """The parsed answer, or the `MemoryServiceError` subclass of its status (errors.py) with the server's
    message and the request id."""
    if response.status_code < 400 or response.status_code in call.accept:
        return call.parse(response)
    request_id = response.headers.get(REQUEST_ID) or call.headers.get(REQUEST_ID)
    try:
        body = response.json()
    except ValueError:
        body = response.text
    message = body.get("detail", body) if isinstance(body, dict) else body
    raise error_for(response.status_code)(
        response.status_code,
        message if isinstance(message, str) else json.dumps(message),
        request_id,
        body,
        retry_after_s=retry_after_s(response),
    )


def lost(call: Call[Any], exc: Exception, base_url: str) -> MemoryServiceError:
    """No answer at all: `Unavailable` (status 0) naming the URL, what happened and what to do."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        what = f"could not connect to the memory service at {base_url} ({exc or type(exc).__name__})"
        todo = (
            "is it running? Start it with ./scripts/serve.sh (or `memory-service serve`), "
            "or give the client the URL of one that runs"
        )
    elif isinstance(exc, httpx.TimeoutException):
        what = f"the memory service at {base_url} did not answer in time ({type(exc).__name__})"
        todo = "it may be overloaded: retry later, or give the client a longer timeout_s"
    else:
        what = f"no answer from the memory service at {base_url}: {type(exc).__name__}: {exc}"
        todo = "retry later; if it keeps failing, check the service's log"
    return Unavailable(0, f"{what}; {todo}", call.headers.get(REQUEST_ID))


class Requests:
    """Builds every call of the API, and is where the clients' methods are written: each method's parameters,
    docstring and result type are those of `MemoryClient`'s (and, awaited, `AsyncMemoryClient`'s) method of the
    same name (`limits_set` is `client.limits.set`, `import_` is `client.import_memories`).

    A caller's value goes into a path only through `path_segment` (one encoded segment; `..` refused with a
    ValueError before anything is sent); elsewhere it is a query parameter or JSON, which httpx encodes."""

    # -- memories ---------------------------------------------------------------

    def remember(
        self,
        text: str,
        *,
        agent_id: str,
        run_id: str | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        wait_s: float = 0.0,
    ) -> Call[RememberResponse]:
        """Save a text for `agent_id`: the RememberResponse (`id`, `status`, `created`). `wait_s` (≤ 120) waits
        for its extraction before answering; `idempotency_key` makes a resend return the first save."""
        # a key of our own, so a resend after a lost answer returns the first save instead of a second one
        body = _drop_none(
            {
                "text": text,
                "agent_id": agent_id,
                "run_id": run_id,
                "tags": tags or [],
                "metadata": metadata or {},
                "wait_s": wait_s,
                "idempotency_key": idempotency_key or "client-" + uuid.uuid4().hex,
            }
        )
        return Call("POST", "/v1/remember", _model(RememberResponse), json=body, extra_timeout_s=wait_s)

    def get(self, memory_id: str) -> Call[MemoryOut]:
        """One memory (MemoryOut): its status, facts with their spans, errors and timings."""
        return Call("GET", f"/v1/memories/{path_segment(memory_id, 'memory_id')}", _model(MemoryOut))

    def recall(
        self,
        query: str,
        *,
        k: int = 10,
        agent_id: str | None = None,
        kinds: list[str] | None = None,
        tags: list[str] | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        min_score: float | None = None,
        time_field: str | None = None,
        max_tokens: int | None = None,
        as_of: datetime | str | None = None,
    ) -> Call[RecallResponse]:
        """The RecallResponse: ranked `items`, and `context`, those items as dated lines to paste into a prompt.
        `agent_id` searches only that agent's memories; `max_tokens`: only the best items whose lines fit;
        `as_of`: when the question is asked (default now): its 'last week' or '3 days ago' count from it."""
        body = _drop_none(
            {
                "query": query,
                "k": k,
                "agent_id": agent_id,
                "scope": "agent" if agent_id else "team",
                "kinds": kinds,
                "tags": tags,
                "since": _iso(since),
                "until": _iso(until),
                "min_score": min_score,
                "time_field": time_field,
                "max_tokens": max_tokens,
                "as_of": _iso(as_of),
            }
        )
        return Call("POST", "/v1/recall", _model(RecallResponse), json=body)

    def list(
        self,
        *,
        agent_id: str | None = None,
        run_id: str | None = None,
        status: str | None = None,
        tag: str | None = None,
        since: datetime | str | None = None,
        until: datetime | str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Call[MemoryPage]:
        """The team's memories (a MemoryPage), newest first; `cursor` is the previous page's `next_cursor`."""
        params = _drop_none(
            {
                "agent_id": agent_id,
                "run_id": run_id,
                "status": status,
                "tag": tag,
                "since": _iso(since),
                "until": _iso(until),
                "limit": limit,
                "cursor": cursor,
            }
        )
        return Call("GET", "/v1/memories", _model(MemoryPage), params=params)

    def forget(
        self,
        memory_id: str | None = None,
        *,
        agent_id: str | None = None,
        run_id: str | None = None,
        confirm: bool = False,
    ) -> Call[ForgetResponse]:
        """Forget one memory by id, or all of an agent's and/or a run's (which needs confirm=True)."""
        if memory_id is not None:
            path = f"/v1/memories/{path_segment(memory_id, 'memory_id')}"
            return Call("DELETE", path, lambda r: ForgetResponse(deleted=1))
        params = _drop_none({"agent_id": agent_id, "run_id": run_id, "confirm": str(confirm).lower()})
        return Call("DELETE", "/v1/memories", _model(ForgetResponse), params=params)

    def export(self) -> Call[builtins.list[ExportedMemory]]:  # `list` here is the method above
        """The team's memories with their facts, oldest first, as `import_memories` takes them."""
        return Call("GET", "/v1/export", _lines, extra_timeout_s=300)

    def import_(self, records: builtins.list[ExportedMemory], *, re_extract: bool = False) -> Call[ImportResponse]:
        """Import records as `export` returns them (the clients' `import_memories`); an id present is skipped."""
        content = "".join(r.model_dump_json() + "\n" for r in records).encode()
        return Call(
            "POST",
            "/v1/import",
            _model(ImportResponse),
            params={"re_extract": str(re_extract).lower()},
            content=content,
            extra_timeout_s=300,
        )

    def team(self) -> Call[TeamOut]:
        """This key's team and role, the memory count, the busiest agent ids and tags."""
        return Call("GET", "/v1/team", _model(TeamOut))

    # -- daily limits and the handled ledger --------------------------------------

    def limits_set(self, name: str, *, daily_limit: int, timezone: str = "UTC", per: str = "team") -> Call[LimitOut]:
        """Define (or change) a daily limit, counted per team or per agent, resetting at midnight in `timezone`."""
        return Call(
            "PUT",
            f"/v1/limits/{_limit(name)}",
            _model(LimitOut),
            json={"daily_limit": daily_limit, "timezone": timezone, "per": per},
        )

    def limits_get(self, name: str, *, agent_id: str | None = None, days: int | None = None) -> Call[LimitOut]:
        """A limit and today's count (of `agent_id` for a per-agent limit); `days`: that many days of history."""
        return Call(
            "GET",
            f"/v1/limits/{_limit(name)}",
            _model(LimitOut),
            params=_drop_none({"agent_id": agent_id, "days": days}),
        )

    def limits_list(self, *, agent_id: str | None = None) -> Call[builtins.list[LimitOut]]:
        """Every limit of the team with today's count."""
        return Call(
            "GET", "/v1/limits", lambda r: _LIMITS.validate_python(r.json()), params=_drop_none({"agent_id": agent_id})
        )

    def limits_consume(
        self, name: str, *, agent_id: str, amount: int = 1, idempotency_key: str | None = None
    ) -> Call[ConsumeAnswer]:
        """Check and count in one step: a ConsumeAnswer whose `allowed` is False when the limit is reached (an
        answer, not an exception)."""
        # a denial is an answer (allowed=false), retried only if its reset falls within the budget
        return Call(
            "POST",
            f"/v1/limits/{_limit(name)}/consume",
            _model(ConsumeAnswer),
            json=_drop_none({"agent_id": agent_id, "amount": amount, "idempotency_key": idempotency_key}),
            idempotent=idempotency_key is not None,
            accept=(429,),
        )

    def limits_delete(self, name: str) -> Call[None]:
        """Remove a limit and its counts."""
        return Call("DELETE", f"/v1/limits/{_limit(name)}", _none)

    def handled_mark(self, key: str, *, agent_id: str | None = None, ttl_days: int | None = None) -> Call[HandledOut]:
        """Mark an item handled: a HandledOut whose `first_time` says whether no one had marked it before."""
        # not resent after a lost answer: the resend would report first_time=false for a first time
        return Call(
            "POST",
            "/v1/handled",
            _model(HandledOut),
            json=_drop_none({"key": key, "agent_id": agent_id, "ttl_days": ttl_days}),
            idempotent=False,
        )

    def handled_check(self, key: str, *, agent_id: str | None = None) -> Call[HandledOut | None]:
        """The HandledOut of a key marked before, or None."""
        record = _model(HandledOut)

        def parse(response: httpx.Response) -> HandledOut | None:
            return None if response.status_code == 404 else record(response)

        return Call("GET", "/v1/handled", parse, params=_drop_none({"key": key, "agent_id": agent_id}), accept=(404,))

    # -- the gate: reserve -> finish (or release) a guarded tool call ----------------

    def gate_reserve(
        self,
        tool: str,
        *,
        key: str | None = None,
        scope: str = "team",
        limit: str | None = None,
        units: int | None = None,
        agent_id: str | None = None,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> Call[ReserveAnswer]:
        """Before running `tool`: hold `key` (a handled-ledger key, in the team's or, scope="agent", the agent's
        ledger) and consume `units` of the daily `limit`, in one step. A ReserveAnswer: `allowed` with a
        `reservation` to finish or release, or refused (an answer, not an exception) with `reason` ("handled",
        "in_progress", "limit") and `message`, one sentence to hand to the model."""
        # not resent after a lost answer: the resend would find our own reservation and answer in_progress
        body = _drop_none(
            {
                "tool": tool,
                "key": key,
                "scope": scope,
                "limit": limit,
                "units": units,
                "agent_id": agent_id,
                "lease_s": lease_s,
            }
        )
        return Call("POST", "/v1/gate/reserve", _model(ReserveAnswer), json=body, idempotent=False, accept=(409, 429))

    def gate_finish(self, reservation: str, *, result: str | None = None) -> Call[FinishAnswer]:
        """The tool ran: record the reservation's key handled with a short `result` (at most 500 chars)."""
        return Call(
            "POST",
            "/v1/gate/finish",
            _model(FinishAnswer),
            json=_drop_none({"reservation": reservation, "result": result}),
            idempotent=False,  # a resend after a lost answer would be a 404: the first one finished it
        )

    def gate_release(self, reservation: str, *, error: str | None = None) -> Call[ReleaseAnswer]:
        """The tool failed: free the reservation's key and give back its units (`refunded`)."""
        return Call(
            "POST",
            "/v1/gate/release",
            _model(ReleaseAnswer),
            json=_drop_none({"reservation": reservation, "error": error}),
            idempotent=False,
        )
