"""POST /v1/remember, GET /v1/memories (list) and /v1/memories/{id}, DELETE (forget one or in bulk)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, HTTPException, Query, Request, Response

from ...contract.models import (
    FactOut,
    ForgetResponse,
    MemoryOut,
    MemoryPage,
    MemorySummary,
    RememberRequest,
    RememberResponse,
)
from ...contract.types import REPLAYED, AgentId, JobStatus, Moment, RunId, Tag
from ...services import DONE, FAILED, ListFilter, to_epoch
from .. import cursor as cursors
from ..auth import Admin, Team, Writer, agent_scope, hidden_from
from ..deps import ServicesDep
from ..errors import Responses, error_responses
from ..model_response import ModelResponse
from ..write_rules import check_write

if TYPE_CHECKING:
    from ...services import Services

router = APIRouter(tags=["memories"])


def _ts(value: float | None) -> datetime | None:
    return None if value is None else _at(value)


def _at(value: float) -> datetime:
    return datetime.fromtimestamp(value, tz=UTC)


_ACCEPTED: Responses = {
    202: {
        "headers": {
            REPLAYED: {
                "description": "`true` when an earlier save with the same idempotency_key was returned",
                "schema": {"type": "string", "enum": ["true"]},
            }
        }
    }
}


@router.post(
    "/v1/remember",
    status_code=202,
    response_model=RememberResponse,
    responses=_ACCEPTED | error_responses(400, 401, 403, 413, 422),
)
async def remember(body: RememberRequest, request: Request, team: Writer, services: ServicesDep) -> ModelResponse:
    """Commit the text to the journal (on disk before this answers), queue its extraction, answer 202.

    The raw text is recallable at once (keyword index) and within moments by meaning
    (passage embedding), whether or not extraction ever succeeds.
    """
    started = time.perf_counter()
    check_write(
        request,
        max_text_bytes=services.settings.max_text_bytes,
        agent_id=body.agent_id,
        text=body.text,
        metadata=body.metadata,
        key=body.idempotency_key,
    )
    memory, created, ahead = await services.off_loop(
        services.remember,
        team=team,
        agent_id=body.agent_id,
        text=body.text,
        run_id=body.run_id,
        tags=body.tags,
        metadata=body.metadata,
        idempotency_key=body.idempotency_key,
        said=body.occurred_at,
        pinned=request.state.caller.agent_id is not None,  # its facts decide among its agent's only
    )
    if not created and hidden_from(request, memory.agent_id):
        # the team's idempotency key names another agent's memory: neither its id nor its state is this key's
        raise HTTPException(409, "idempotency_key is already used in this team by another agent: choose another")
    if created:
        services.saved()
    services.observe_remember_ack(time.perf_counter() - started)
    if body.wait_s > 0 and memory.status not in (DONE, FAILED):
        memory = await services.wait_settled(team, memory.id, body.wait_s) or memory
        ahead = await services.off_loop(services.backlog, team, memory.created_at)
    # the team's own jobs ahead, at the model's speed: no other team's backlog shows in either figure
    pending = memory.status not in (DONE, FAILED)
    estimate, basis = services.estimate(*ahead) if pending else (None, None)
    return ModelResponse(
        RememberResponse(
            id=memory.id,
            status=JobStatus(memory.status),
            created=created,
            queue_depth=ahead[0],
            estimated_extraction_s=estimate,
            estimate_basis=basis,
        ),
        status_code=202,
        headers=None if created else {REPLAYED: "true"},
    )


@router.get("/v1/memories/{memory_id}", response_model=MemoryOut, responses=error_responses(401, 404, 422))
async def get_memory(memory_id: str, request: Request, team: Team, services: ServicesDep) -> MemoryOut:
    """A saved text, its job status, its facts (with spans and history), timings, and the raw reply on failure.
    A key pinned to an agent sees only that agent's memories (404 for the others, as for unknown ids)."""
    out = await memory_out(services, team, memory_id, agent_id=request.state.caller.agent_id)
    if out is None:
        raise HTTPException(404, f"no memory with id {memory_id!r} in this team")
    return out


async def memory_out(services: Services, team: str, memory_id: str, *, agent_id: str | None = None) -> MemoryOut | None:
    """The full view of one of the team's memories (of `agent_id`'s only, when given), or None: the API and
    the console show the same thing."""
    memory = await services.off_loop(services.memory, team, memory_id)
    if memory is None or (agent_id is not None and memory.agent_id != agent_id):
        return None
    facts = await services.off_loop(services.facts_of_memory, team, memory_id)
    report = memory.report or {}
    return MemoryOut(
        id=memory.id,
        status=JobStatus(memory.status),
        agent_id=memory.agent_id,
        run_id=memory.run_id,
        text=memory.text,
        tags=memory.tags,
        metadata=memory.metadata,
        created_at=_at(memory.created_at),
        occurred_at=_ts(memory.occurred_at),
        occurred_day=memory.occurred_day,
        attempts=memory.attempts,
        deferrals=memory.deferrals,
        next_attempt_at=_ts(memory.next_attempt_at) if memory.status == "queued" else None,
        last_error=memory.last_error,
        facts=[
            FactOut(
                id=f.id,
                text=f.text,
                spans=[s["span"] for s in f.sources],
                superseded_by=f.superseded_by,
                created_at=_at(f.created_at),
            )
            for f in facts
        ],
        rejected_facts=report.get("rejected", []),
        timings=memory.timings,
        extraction={k: v for k, v in report.items() if k != "rejected"} or None,
        raw_reply=memory.raw_reply if memory.status != DONE else None,
        progress=(
            {
                "chunks_done": int(memory.progress.get("chunks", 0)),
                "chars_done": int(memory.progress.get("offset", 0)),
                "chars_total": len(memory.text),
            }
            if memory.progress and memory.status != DONE
            else None
        ),
    )


@router.get("/v1/memories", response_model=MemoryPage, responses=error_responses(400, 401, 422))
async def list_route(
    request: Request,
    team: Team,
    services: ServicesDep,
    agent_id: AgentId | None = None,
    run_id: RunId | None = None,
    status: JobStatus | None = None,
    tag: Tag | None = None,
    since: Moment | None = None,
    until: Moment | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=1024)] = None,
) -> MemoryPage:
    """The team's memories, newest first, a page at a time (pass `next_cursor` back as `cursor`).
    A pinned key lists only its agent's."""
    agent_id = agent_scope(request, agent_id)
    after = cursors.decode(cursor) if cursor else None
    lo, hi = to_epoch(since), to_epoch(until)
    if lo is not None and hi is not None and lo > hi:
        raise HTTPException(422, "since is after until: the time window is empty")
    flt = ListFilter(agent_id=agent_id, run_id=run_id, status=status, tag=tag, since=lo, until=hi)
    items, nxt = await services.off_loop(services.list_memories, team, flt, limit=limit, after=after)
    return MemoryPage(
        items=[
            MemorySummary(
                id=i.memory.id,
                status=JobStatus(i.memory.status),
                agent_id=i.memory.agent_id,
                run_id=i.memory.run_id,
                text=i.memory.text,
                tags=i.memory.tags,
                created_at=_at(i.memory.created_at),
                facts=i.facts,
            )
            for i in items
        ],
        next_cursor=cursors.encode(nxt) if nxt else None,
    )


@router.delete(
    "/v1/memories/{memory_id}", status_code=204, response_class=Response, responses=error_responses(401, 403, 404, 422)
)
async def forget_one(memory_id: str, request: Request, team: Admin, services: ServicesDep) -> Response:
    """Forget a text: its passage, keyword entries, and the facts only it supported (shared facts lose it).
    A pinned key forgets only its agent's memories: another agent's is a 404, as an unknown id."""
    if request.state.caller.agent_id is not None:
        memory = await services.off_loop(services.memory, team, memory_id)
        if memory is None or hidden_from(request, memory.agent_id):
            raise HTTPException(404, f"no memory with id {memory_id!r} in this team")
    deleted = await services.off_loop(services.forget, team, memory_ids=[memory_id])
    if not deleted:
        raise HTTPException(404, f"no memory with id {memory_id!r} in this team")
    return Response(status_code=204)


@router.delete("/v1/memories", response_model=ForgetResponse, responses=error_responses(400, 401, 403, 422))
async def forget_many(
    request: Request,
    team: Admin,
    services: ServicesDep,
    agent_id: AgentId | None = None,
    run_id: RunId | None = None,
    confirm: bool = False,
) -> ForgetResponse:
    """Forget every memory of an agent and/or a run. Needs `confirm=true`: it cannot be undone.
    A pinned key forgets only its own agent's (a run's memories of other agents stay)."""
    if agent_id is None and run_id is None:
        raise HTTPException(400, "bulk forget needs agent_id or run_id (or both) to say which memories to forget")
    agent_id = agent_scope(request, agent_id)
    if not confirm:
        raise HTTPException(400, "bulk forget cannot be undone: repeat the request with confirm=true")
    deleted = await services.off_loop(services.forget, team, agent_id=agent_id, run_id=run_id)
    return ForgetResponse(deleted=len(deleted))
