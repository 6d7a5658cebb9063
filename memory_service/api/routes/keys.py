"""/v1/keys: an admin key manages its own team's keys (create, list, revoke), effective at once.

An admin key pinned to an agent manages only the keys pinned to that same agent: it creates only those,
lists only those, and another key's id is a 404 to it, so it cannot lock the rest of the team out.

A new key is shown once, in the answer to its creation; only its hash is stored.
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, HTTPException, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from ...contract.roles import Role
from ...contract.types import AgentId, Label
from ...services import KeyInfo, KeyNotFound
from ..auth import Admin, Caller, hidden_from
from ..deps import LimitsAndKeysDep
from ..errors import error_responses

router = APIRouter(tags=["keys"])


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Role = Field(
        description="read: recall, get, list, check; write: also remember, consume, mark handled, "
        "import; admin: also forget, define limits, manage keys"
    )
    agent_id: AgentId | None = Field(
        default=None, description="Pin the key to this agent: it can write only as this agent_id"
    )
    label: Label | None = None


class KeyOut(BaseModel):
    id: str
    team: str
    role: Role
    agent_id: str | None
    label: str | None
    created_at: datetime
    revoked_at: datetime | None


class NewKeyOut(KeyOut):
    key: str = Field(description="The key itself: shown this once, never again")


def _out(info: KeyInfo) -> dict:
    stamp = lambda t: None if t is None else datetime.fromtimestamp(t, tz=UTC)  # noqa: E731
    return {
        "id": info.id,
        "team": info.team,
        "role": info.role,
        "agent_id": info.agent_id,
        "label": info.label,
        "created_at": stamp(info.created_at),
        "revoked_at": stamp(info.revoked_at),
    }


@router.post(
    "/v1/keys",
    status_code=201,
    response_model=NewKeyOut,
    summary="Create a key for this team",
    responses=error_responses(400, 401, 403, 413, 422),
)
async def create_key(body: KeyCreate, request: Request, team: Admin, services: LimitsAndKeysDep) -> NewKeyOut:
    """Admins create keys for their own team only. A pinned admin key cannot create unpinned keys."""
    caller: Caller = request.state.caller
    if caller.agent_id is not None and body.agent_id != caller.agent_id:
        raise HTTPException(
            403, f"this key is pinned to agent_id '{caller.agent_id}'; it can create only keys pinned to the same agent"
        )
    made = await services.off_loop(services.create_key, team, body.role, agent_id=body.agent_id, label=body.label)
    return NewKeyOut(**_out(made.info), key=made.key)


@router.get(
    "/v1/keys",
    response_model=list[KeyOut],
    summary="List this team's keys (never their secrets)",
    responses=error_responses(401, 403, 422),
)
async def list_keys(
    request: Request, team: Admin, services: LimitsAndKeysDep, include_revoked: bool = False
) -> list[KeyOut]:
    found = await services.off_loop(services.list_keys, team, include_revoked=include_revoked)
    return [KeyOut(**_out(info)) for info in found if not hidden_from(request, info.agent_id or "")]


@router.delete(
    "/v1/keys/{key_id}",
    status_code=204,
    summary="Revoke a key of this team, at once",
    responses=error_responses(401, 403, 404, 409, 422),
)
async def revoke_key(key_id: str, request: Request, team: Admin, services: LimitsAndKeysDep) -> Response:
    """Revoke at once; 404 (KeyNotFound, mapped in api/errors.py) if the team has no such key, or if the key
    is pinned to another agent than a pinned caller's (as for unknown ids); 409 (LastKey) for the last active
    key, which would turn authentication off: keyless mode is chosen on the host (`keys revoke --keyless`)."""
    if request.state.caller.agent_id is not None:
        keys = await services.off_loop(services.list_keys, team, include_revoked=True)
        if not any(info.id == key_id and not hidden_from(request, info.agent_id or "") for info in keys):
            raise KeyNotFound(f"no key with id {key_id!r} in this team")
    await services.off_loop(services.revoke_key, team, key_id)
    return Response(status_code=204)
