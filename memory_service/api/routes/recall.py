"""POST /v1/recall: ranked facts and passages of the caller's team, and a context to paste (within a budget)."""

from __future__ import annotations

import time

from fastapi import APIRouter, HTTPException, Request

from ...contract.models import RecallRequest, RecallResponse
from ...services import RecallQuery, to_epoch
from ..auth import Team, agent_scope
from ..deps import ServicesDep
from ..errors import error_responses
from ..model_response import ModelResponse

router = APIRouter(tags=["recall"])


@router.post("/v1/recall", response_model=RecallResponse, responses=error_responses(400, 401, 413, 422))
async def recall_route(body: RecallRequest, request: Request, team: Team, services: ServicesDep) -> ModelResponse:
    """Vector + keyword search over the team's facts and passages. `scope: "agent"` needs `agent_id`.
    A key pinned to an agent searches only that agent's, whatever the scope."""
    started = time.perf_counter()
    if body.scope == "agent" and not body.agent_id:
        raise HTTPException(422, "scope 'agent' needs agent_id: whose memories should be searched?")
    agent_id = agent_scope(request, body.agent_id if body.scope == "agent" else None)
    since, until = to_epoch(body.since), to_epoch(body.until)
    if since is not None and until is not None and since > until:
        raise HTTPException(422, "since is after until: the time window is empty")
    query = RecallQuery(
        team=team,
        query=body.query,
        k=body.k,
        kinds=tuple(dict.fromkeys(body.kinds)),
        agent_id=agent_id,
        tags=tuple(body.tags),
        since=since,
        until=until,
        min_score=body.min_score,
        time_field=body.time_field,
        as_of=to_epoch(body.as_of),
    )
    answer = await services.recall(query, body.max_tokens)
    services.observe_recall(time.perf_counter() - started)
    return ModelResponse(answer.response())
