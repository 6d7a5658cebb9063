"""POST /v1/recall: ranked facts and passages of the caller's team."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Literal, cast

from fastapi import APIRouter, HTTPException, Request

from ...contract.models import RecallItem, RecallRequest, RecallResponse
from ...recall.search import RecallQuery, to_epoch
from ..auth import Team, agent_scope
from ..deps import ServicesDep
from ..errors import error_responses
from ..model_response import ModelResponse

ItemKind = Literal["fact", "passage", "consolidated"]

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
    )
    hits = await asyncio.to_thread(services.recall, query)
    answer = RecallResponse(
        items=[
            RecallItem(
                kind=cast(ItemKind, h.kind),  # the search names only these kinds; pydantic checks it
                text=h.text,
                score=round(h.score, 6),
                similarity=round(h.similarity, 4) if h.similarity is not None else None,
                memory_id=h.memory_id,
                source_memory_ids=h.source_memory_ids,
                fact_id=h.fact_id,
                agent_id=h.agent_id,
                created_at=datetime.fromtimestamp(h.created_at, tz=UTC),
                tags=h.tags,
            )
            for h in hits
        ]
    )
    services.observe_recall(time.perf_counter() - started)
    return ModelResponse(answer)
