"""GET /v1/team: who the caller's key is and what its team's memory holds.

Agents and tools ask this before they act: an MCP server hides write tools from a read-only key, and an
empty recall can name the agent ids and tags that do exist instead of leaving a small model to conclude
that memory is empty or broken.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from ..storage.catalog import facets
from .auth import Team
from .deps import ServicesDep
from .models import TeamOut

router = APIRouter(tags=["team"])

# Every key can read and write today; the field is the contract clients (the MCP server) already honour.
KEY_ROLE = "read-write"


@router.get("/v1/team", response_model=TeamOut)
async def team_route(team: Team, services: ServicesDep) -> TeamOut:
    """The caller's team, the key's role, and the team's memory count with its busiest agent ids and tags."""
    found = await asyncio.to_thread(facets, services.journal, team)
    return TeamOut(
        team=team, role=KEY_ROLE, memories=found.memories,
        agents=[{"agent_id": a, "memories": n} for a, n in found.agents],
        tags=[{"tag": t, "memories": n} for t, n in found.tags],
    )
