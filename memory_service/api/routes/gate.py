"""HTTP routes of the gate: reserve -> finish (or release) a guarded tool call.

A gate in any language asks `reserve` before it runs a tool: the service checks the handled ledger, the
live reservations and the daily limit, and holds the key, in one transaction of the limits store. A refusal
(409 handled or in progress, 429 limit) carries one sentence a small model can act on. After the tool ran
the gate calls `finish` (the key is recorded handled, as /v1/handled shows it); if the tool failed, `release`
(the key is free again and the units are given back). A key pinned to an agent acts as that agent only: its
reservations are in its own agent's ledger (as its /v1/handled marks are), and it finishes and releases
only its own.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ...contract.gate import (
    FinishAnswer,
    FinishRequest,
    ReleaseAnswer,
    ReleaseRequest,
    ReserveAnswer,
    ReserveRequest,
)
from ...services import GateCall
from ..auth import Writer, check_agent
from ..deps import LimitsAndKeysDep
from ..errors import error_responses

router = APIRouter(tags=["gate"])
log = logging.getLogger("memory_service.api")

_ERRORS = error_responses(400, 401, 403, 413, 422, 503)
_UNKNOWN = error_responses(404, described={404: "No such reservation in this team (finished or released already)"})


@router.post(
    "/v1/gate/reserve",
    summary="Reserve a guarded tool call: its key and its units, or a refusal in one sentence",
    response_model=None,
    responses={
        200: {"model": ReserveAnswer, "description": "Allowed: run the tool, then finish (or release) it"},
        409: {"model": ReserveAnswer, "description": "Refused: the key is handled already, or in progress"},
        429: {
            "model": ReserveAnswer,
            "description": "Refused: the daily limit is used up. Nothing changed.",
            "headers": {"Retry-After": {"description": "Seconds until resets_at", "schema": {"type": "integer"}}},
        },
    }
    | error_responses(404, described={404: "No such limit"})
    | _ERRORS,
)
async def reserve(body: ReserveRequest, request: Request, team: Writer, services: LimitsAndKeysDep) -> JSONResponse:
    """In one transaction: a finished (live) record of `key` refuses (409 `handled`), a live reservation of it
    refuses (409 `in_progress`), then `units` of `limit` are consumed (denied: 429 `limit`, nothing changed),
    then the reservation is written, holding the key for `lease_s` seconds (default 300, 1-86400).

    `scope` "team" (default) puts the key in the team's ledger, "agent" in `agent_id`'s. A key pinned to an
    agent always uses its own agent's ledger and acts as that agent (`agent_id` defaults to it; another is a
    403). At least one of `key` and `limit`; `units` (1-1,000,000,000, default 1) only with `limit`."""
    check_agent(request, body.agent_id, required=False)
    pinned: str | None = request.state.caller.agent_id
    agent_id = pinned if pinned is not None else body.agent_id
    call = GateCall(
        tool=body.tool,
        key=body.key,
        scope="agent" if pinned is not None else body.scope,
        limit=body.limit,
        units=body.units or 1,
        agent_id=agent_id,
        lease_s=body.lease_s,
    )
    answer = await services.off_loop(services.gate_reserve, team, call)
    headers = {"Retry-After": str(answer.retry_after_s)} if answer.status == 429 else None
    return JSONResponse(answer.body(), status_code=answer.status, headers=headers)


@router.post(
    "/v1/gate/finish",
    summary="The tool ran: record its key handled, with a short result",
    response_model=None,
    responses={200: {"model": FinishAnswer}}
    | _UNKNOWN
    | error_responses(409, described={409: "The lease ran out and another call holds or finished the key"})
    | _ERRORS,
)
async def finish(body: FinishRequest, request: Request, team: Writer, services: LimitsAndKeysDep) -> JSONResponse:
    """Record the reservation's key in the ledger (the record GET /v1/handled shows, with `by`, `tool` and
    `result`, at most 500 chars) and drop the reservation; its units stay used. A reservation whose lease ran
    out is still recorded if nobody else reserved or finished the key since (else 409). 404: unknown
    reservation (finished or released already)."""
    pinned: str | None = request.state.caller.agent_id
    done = await services.off_loop(services.gate_finish, team, body.reservation, body.result, pinned)
    return JSONResponse(FinishAnswer(finished=True, key=done.key, at=done.at).model_dump())


@router.post(
    "/v1/gate/release",
    summary="The tool failed: free the key and give back the units",
    response_model=None,
    responses={200: {"model": ReleaseAnswer}} | _UNKNOWN | _ERRORS,
)
async def release(body: ReleaseRequest, request: Request, team: Writer, services: LimitsAndKeysDep) -> JSONResponse:
    """Drop the reservation and refund its units to the counter they came from (same day; never below 0).
    `error` (at most 500 chars) is logged, not stored. 404: unknown reservation (finished or released)."""
    pinned: str | None = request.state.caller.agent_id
    refunded = await services.off_loop(services.gate_release, team, body.reservation, pinned)
    if body.error:
        log.info("gate reservation %s released: %s", body.reservation, body.error)
    return JSONResponse(ReleaseAnswer(released=True, refunded=refunded).model_dump())
