"""POST /v1/recall: ranked facts and passages of the caller's team, and a context to paste (within a budget)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal, cast

from fastapi import APIRouter, HTTPException, Request

from ...contract.models import RecallItem, RecallRequest, RecallResponse
from ...recall.context import fitted, pieces_of, unbudgeted
from ...recall.search import Recalled, RecallQuery, to_epoch
from ..auth import Team, agent_scope
from ..deps import ServicesDep
from ..errors import error_responses
from ..model_response import ModelResponse

if TYPE_CHECKING:
    from ...services import Services

ItemKind = Literal["fact", "passage", "consolidated"]
Counter = Literal["model", "estimate"]

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
    found, occurred = await asyncio.to_thread(_search, services, query)
    hits = found.hits
    if body.max_tokens is None:
        context = unbudgeted(pieces_of(hits, occurred, body.query))
    else:  # only the items said in what fits
        timeout_s = services.settings.recall_tokenize_timeout_s
        context = await fitted(hits, occurred, body.query, body.max_tokens, services.token_pieces, timeout_s)
        hits = [hits[rank] for rank in context.kept]
    answer = RecallResponse(
        context=context.text,
        tokens=context.tokens,
        token_counter=cast(Counter | None, context.counter),
        note=found.note,
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
        ],
    )
    services.observe_recall(time.perf_counter() - started)
    return ModelResponse(answer)


def _search(services: Services, query: RecallQuery) -> tuple[Recalled, dict[str, float]]:
    """The hits (and the relevance floor's note), and when each one's text tells it happened (for the
    context's dates): one thread hop."""
    found = services.recalled(query)
    return found, services.occurred(query.team, [h.memory_id for h in found.hits])
