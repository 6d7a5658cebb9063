"""GET /v1/team: who the caller's key is and what its team's memory holds.

Agents and tools ask this before they act: an MCP server hides write tools from a read-only key, and an
empty recall can name the agent ids and tags that do exist instead of leaving a small model to conclude
that memory is empty or broken.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from ...contract.models import AgentCount, TagCount, TeamOut
from ..auth import Caller, Team
from ..deps import ServicesDep
from ..errors import error_responses

router = APIRouter(tags=["team"])


@router.get("/v1/team", response_model=TeamOut, responses=error_responses(401))
async def team_route(request: Request, team: Team, services: ServicesDep) -> TeamOut:
    """The caller's team, the key's role, and the team's memory count with its busiest agent ids and tags
    (a key pinned to an agent: its agent's memories only)."""
    caller: Caller = request.state.caller
    found = await services.off_loop(services.facets, team, agent_id=caller.agent_id)
    return TeamOut(
        team=team,
        role=caller.role,
        memories=found.memories,
        agents=[AgentCount(agent_id=a, memories=n) for a, n in found.agents],
        tags=[TagCount(tag=t, memories=n) for t, n in found.tags],
    )
