"""HTTP routes for daily limits and the handled-item ledger.

Everything is scoped to the caller's team (`Team`): another team's limits and
keys are invisible, even under the same names. Each store call runs in the
services' blocking pool (`off_loop`), so a store call waiting on the SQLite lock (or an
fsync with synchronous=FULL) never stalls the event loop that serves every other route.
The store does one short transaction per call; its errors (no such limit, bad input, a reused
idempotency key, busy storage) reach the one mapping in api/errors.py. Responses are built directly
(no response_model re-validation) to keep the consume path lean; the models
below only document the shapes in /docs.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response
from fastapi.responses import JSONResponse

from ...contract.limit_rules import MAX_HISTORY_DAYS
from ...contract.limits import (
    ConsumeAnswer,
    ConsumeRequest,
    HandledOut,
    HandledRequest,
    LimitOut,
    LimitSpec,
)
from ...contract.types import (
    REPLAYED,
    AgentId,
    HandledKey,
    LimitName,
)
from ...services import LimitView
from ..auth import Admin, Team, Writer, agent_scope, check_agent, refuse_pinned
from ..deps import LimitsAndKeysDep
from ..errors import Responses, error_responses

router = APIRouter(tags=["limits"])


# ---------------------------------------------------------------- input types

AgentQuery = Annotated[AgentId | None, Query(description="Show this agent's counter (per=agent limits)")]

_ERRORS = error_responses(401, 422, 503)
_NOT_FOUND = error_responses(404, described={404: "No such limit"})
_BODY_ERRORS = error_responses(400, 413)  # routes with a JSON body: not JSON, or too large
_FORBIDDEN = error_responses(403)  # below the role the route needs, or a pinned key acting as another agent


# ---------------------------------------------------------------- helpers


def _view_body(view: LimitView) -> dict[str, object]:
    body = asdict(view)
    for optional in ("agents", "history"):
        if body[optional] is None:
            del body[optional]
    return body


# ---------------------------------------------------------------- limits


@router.put(
    "/v1/limits/{name}",
    summary="Create or change a daily limit",
    response_model=None,
    responses={200: {"model": LimitOut, "description": "Changed"}, 201: {"model": LimitOut, "description": "Created"}}
    | _BODY_ERRORS
    | _FORBIDDEN
    | _ERRORS,
)
async def put_limit(
    name: LimitName, spec: LimitSpec, request: Request, team: Admin, services: LimitsAndKeysDep
) -> JSONResponse:
    """Create (201) or change (200) the team's limit `name`.

    The day is the local calendar day in `timezone` (IANA name; 23- and
    25-hour DST days included). Today's counters are kept: lowering
    `daily_limit` below today's usage denies consumes until the reset;
    changing `timezone` or `per` starts new counters. `daily_limit` is
    0-1,000,000,000 (0 blocks everything). Names: 1-128 chars of
    `[A-Za-z0-9._-]`, starting with a letter or digit, no `..`. Definitions are
    team-wide: a key pinned to an agent may not make or change them (403).
    """
    refuse_pinned(request, "defining a limit")
    view, created = await services.off_loop(services.put_limit, team, name, spec.daily_limit, spec.timezone, spec.per)
    return JSONResponse(_view_body(view), status_code=201 if created else 200)


_LISTED: Responses = {200: {"model": list[LimitOut]}}


@router.get(
    "/v1/limits",
    summary="List the team's limits with today's usage",
    response_model=None,
    responses=_LISTED | _ERRORS,
)
async def list_limits(
    request: Request, team: Team, services: LimitsAndKeysDep, agent_id: AgentQuery = None
) -> JSONResponse:
    """All of the team's limits, sorted by name, each with today's usage.

    For per=agent limits `used` is the sum over agents unless `agent_id` is given (a pinned key: always its own).
    """
    agent_id = agent_scope(request, agent_id)
    views = await services.off_loop(services.list_limits, team, agent_id)
    return JSONResponse([_view_body(v) for v in views])


@router.get(
    "/v1/limits/{name}",
    summary="One limit with today's usage (and history)",
    response_model=None,
    responses={200: {"model": LimitOut}} | _NOT_FOUND | _ERRORS,
)
async def get_limit(
    name: LimitName,
    request: Request,
    team: Team,
    services: LimitsAndKeysDep,
    agent_id: AgentQuery = None,
    days: Annotated[
        int | None, Query(ge=1, le=MAX_HISTORY_DAYS, description=f"Add the last N local days (1-{MAX_HISTORY_DAYS})")
    ] = None,
) -> JSONResponse:
    """Today's usage of `name`; 404 if the team has no such limit.

    per=agent: pass `agent_id` for one agent's counter, or omit it to get the
    sum plus per-agent counters (`agents`, busiest 1000). `days=N` adds
    `history`, the last N local days ending today (zeros included). A key
    pinned to an agent sees its own agent's counter only.
    """
    agent_id = agent_scope(request, agent_id)
    view = await services.off_loop(services.limit_view, team, name, agent_id, days)
    return JSONResponse(_view_body(view))


@router.delete(
    "/v1/limits/{name}",
    status_code=204,
    summary="Delete a limit and its counters",
    responses=_NOT_FOUND | _FORBIDDEN | _ERRORS,
)
async def delete_limit(name: LimitName, request: Request, team: Admin, services: LimitsAndKeysDep) -> Response:
    """Remove the limit, its counters and idempotency records (204); 404 if absent. Not with a pinned key (403)."""
    refuse_pinned(request, "deleting a limit")
    await services.off_loop(services.delete_limit, team, name)
    return Response(status_code=204)


@router.post(
    "/v1/limits/{name}/consume",
    summary="Check and count usage atomically",
    response_model=None,
    responses={
        200: {
            "model": ConsumeAnswer,
            "description": "Allowed and counted",
            "headers": {
                REPLAYED: {
                    "description": "`true` when this repeats an earlier idempotency_key today",
                    "schema": {"type": "string", "enum": ["true"]},
                }
            },
        },
        429: {
            "model": ConsumeAnswer,
            "description": "Denied (allowed=false). Nothing counted.",
            "headers": {"Retry-After": {"description": "Seconds until resets_at", "schema": {"type": "integer"}}},
        },
    }
    | error_responses(409, described={409: "idempotency_key reused today with another agent_id or amount"})
    | _NOT_FOUND
    | _BODY_ERRORS
    | _FORBIDDEN
    | _ERRORS,
)
async def consume(
    name: LimitName, body: ConsumeRequest, request: Request, team: Writer, services: LimitsAndKeysDep
) -> JSONResponse:
    """Add `amount` (1-1,000,000,000) to today's counter if it stays within the limit.

    Check and count are one transaction: concurrent callers can never push
    `used` past `daily_limit`, and a denial (429, same body with
    allowed=false, `Retry-After` header) changes nothing. per=agent limits
    count each `agent_id` separately. With `idempotency_key`, repeats on the
    same local day return the first allowed answer (header
    `Idempotent-Replayed: true`) and count once; denials are not recorded,
    so a denied request may be retried with the same key. 404 when the team
    has no limit `name` (create it with PUT first).
    """
    check_agent(request, body.agent_id)
    result = await services.off_loop(services.consume, team, name, body.agent_id, body.amount, body.idempotency_key)
    if not result.allowed:
        return JSONResponse(result.body(), status_code=429, headers={"Retry-After": str(result.retry_after_s)})
    headers = {REPLAYED: "true"} if result.replayed else None
    return JSONResponse(result.body(), headers=headers)


# ---------------------------------------------------------------- handled ledger


@router.post(
    "/v1/handled",
    summary="Record a key; say whether it is the first time",
    response_model=None,
    responses={200: {"model": HandledOut}} | _BODY_ERRORS | _FORBIDDEN | _ERRORS,
)
async def mark_handled(
    body: HandledRequest, request: Request, team: Writer, services: LimitsAndKeysDep
) -> JSONResponse:
    """Atomic set-if-absent of `key` in the team's ledger (or the agent's, with `agent_id`; a key pinned to
    an agent always marks in its own agent's ledger, never the team's).

    Exactly one of any number of concurrent posts gets `first_time: true`;
    others bump `seen_count`. With `ttl_days` the key is forgotten that many
    days after first being seen, and then counts as first_time again (later
    posts do not extend it). Keys: 1-2048 chars, any text but NUL.
    """
    agent_id = agent_scope(request, body.agent_id)
    record = await services.off_loop(services.mark_handled, team, body.key, agent_id, body.ttl_days)
    return JSONResponse(asdict(record))


async def _get_handled(
    request: Request, team: str, services: LimitsAndKeysDep, key: str, agent_id: str | None
) -> JSONResponse:
    """A pinned key looks in its own agent's ledger only."""
    record = await services.off_loop(services.handled_record, team, key, agent_scope(request, agent_id))
    if record is None:
        raise HTTPException(status_code=404, detail="key not recorded for this team/agent (or expired)")
    return JSONResponse(asdict(record) | {"first_time": False})


_HANDLED_GET = {200: {"model": HandledOut}} | error_responses(404, described={404: "Never seen, or expired"})


@router.get(
    "/v1/handled",
    summary="Look up a key given as a query parameter",
    response_model=None,
    responses=_HANDLED_GET | _ERRORS,
)
async def get_handled_by_query(
    request: Request,
    team: Team,
    services: LimitsAndKeysDep,
    key: Annotated[HandledKey, Query(description="The key, URL-encoded")],
    agent_id: AgentQuery = None,
) -> JSONResponse:
    """Recommended form for keys with `?`, `#`, `%` or `//` (e.g. URLs): `?key=<url-encoded>`."""
    return await _get_handled(request, team, services, key, agent_id)


@router.get(
    "/v1/handled/{key:path}",
    summary="Look up a key given in the path",
    response_model=None,
    responses=_HANDLED_GET | _ERRORS,
)
async def get_handled(
    key: Annotated[HandledKey, Path(description="The key; may contain '/'")],
    request: Request,
    team: Team,
    services: LimitsAndKeysDep,
    agent_id: AgentQuery = None,
) -> JSONResponse:
    """The record for `key`, or 404 if never seen or expired.

    The rest of the path is the key, slashes included; percent-encode `?`,
    `#` and `%`, or use `GET /v1/handled?key=` instead.
    """
    return await _get_handled(request, team, services, key, agent_id)
