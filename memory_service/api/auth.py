"""Bearer keys -> the caller (team, role, pinned agent). Every route depends on a role, so nothing runs
unscoped and nothing runs above the caller's role.

Keys come from two places: the database (`memory-service keys create`, or `POST /v1/keys` by an admin
key), checked by hash and effective at once; and `MEMORY_API_KEYS`, the bootstrap/dev path, whose keys
are admins of their team. With no key anywhere and a loopback address, everything belongs to one local
team (admin): a single user's laptop needs no key.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, HTTPException, Request

from ..config import Settings, is_loopback
from ..contract.roles import Role, role_allows

if TYPE_CHECKING:
    from ..services import LimitsAndKeys


@dataclass(frozen=True)
class Caller:
    team: str
    role: Role
    agent_id: str | None = None  # a pinned key writes only as this agent


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status_code=401, detail=detail, headers={"WWW-Authenticate": "Bearer"})


def open_access(services: LimitsAndKeys) -> bool:
    """No key anywhere and a loopback address: everything belongs to the local team, no key needed."""
    settings = services.settings
    return not settings.api_keys and is_loopback(settings.host) and not services.has_stored_keys()


def caller_of_key(services: LimitsAndKeys, token: str) -> Caller | None:
    """Whose key this is (MEMORY_API_KEYS first, in constant time, then the key store), or None.
    Shared by the bearer header and the console's cookie. Reads the store: call it off the event loop."""
    caller = _env_caller(services, token)
    if caller is not None:
        return caller
    stored = services.stored_key(token)
    return None if stored is None else Caller(stored.team, stored.role, stored.agent_id)


def caller_of_key_hash(services: LimitsAndKeys, digest: str) -> Caller | None:
    """Whose key has sha256 `digest` (a console session's key), or None: as `caller_of_key`, without the key.
    Reads the store: call it off the event loop."""
    team = None
    for key, key_team in services.settings.api_keys.items():
        if hmac.compare_digest(services.key_digest(key).encode(), digest.encode()):
            team = key_team
    if team is not None:
        return Caller(team, "admin")
    stored = services.stored_key_by_hash(digest)
    return None if stored is None else Caller(stored.team, stored.role, stored.agent_id)


def _env_caller(services: LimitsAndKeys, token: str) -> Caller | None:
    """The MEMORY_API_KEYS key `token` is, compared in memory (no store read), or None."""
    team = None
    for key, key_team in services.settings.api_keys.items():
        # compare every key in constant time, so timing does not reveal prefixes
        if hmac.compare_digest(key.encode(), token.encode()):
            team = key_team
    return None if team is None else Caller(team, "admin")


BEARER = frozenset({"bearer"})
BEARER_OR_TOKEN = frozenset({"bearer", "token"})  # mem0's clients send `Authorization: Token <key>`


def presented_key(request: Request, schemes: frozenset[str] = BEARER) -> str | None:
    """The key of the `Authorization` header under one of `schemes`, or None (no header, another scheme)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() in schemes and token else None


def identify(request: Request, schemes: frozenset[str] = BEARER) -> Caller:
    """Who is calling, from the bearer key (or another scheme's, for a peer's client that names it so)."""
    services = request.app.state.services
    token = presented_key(request, schemes)
    if token is None:
        if open_access(services):
            return Caller(Settings.LOCAL_TEAM, "admin")
        raise _unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    caller = caller_of_key(services, token)
    if caller is None:
        raise _unauthorized("unknown or revoked API key")
    return caller


def requires(role: Role, schemes: frozenset[str] = BEARER) -> Callable[[Request], object]:
    """A dependency that admits callers with `role` or above, and leaves the caller on `request.state`."""

    async def dependency(request: Request) -> str:
        # a MEMORY_API_KEYS key is known in memory; any other is read from the key store (on PostgreSQL a
        # round trip): in the services' pool, off the loop. The hop cost the ack ~0.5 ms p50 (bench.remember)
        services = request.app.state.services
        token = presented_key(request, schemes)
        known = _env_caller(services, token) if token is not None else None
        caller = known or await services.off_loop(identify, request, schemes)
        if not role_allows(caller.role, role):
            raise HTTPException(
                status_code=403, detail=f"this key has role '{caller.role}'; this action needs role '{role}' or above"
            )
        request.state.caller = caller
        return caller.team

    return dependency


def check_agent(request: Request, agent_id: str | None, *, required: bool = True) -> None:
    """A key pinned to an agent writes only as that agent: 403 for any other agent_id (or none, if required)."""
    caller: Caller = request.state.caller
    if caller.agent_id is None or agent_id == caller.agent_id or (agent_id is None and not required):
        return
    raise HTTPException(
        status_code=403, detail=f"this key is pinned to agent_id '{caller.agent_id}'; it cannot act as {agent_id!r}"
    )


def agent_scope(request: Request, agent_id: str | None) -> str | None:
    """The agent a read or a bulk change is narrowed to: a pinned key's own agent whatever it asked for
    (another agent_id is a 403), or `agent_id` as given (None: the whole team) for an unpinned key."""
    check_agent(request, agent_id, required=False)
    pinned: str | None = request.state.caller.agent_id
    return pinned if pinned is not None else agent_id


def hidden_from(request: Request, owner: str) -> bool:
    """Whether a memory or key of agent `owner` is out of the caller's sight: a pinned key sees only its own
    agent's, and answers for the others as for unknown ids (a 404), so their existence does not leak."""
    pinned: str | None = request.state.caller.agent_id
    return pinned is not None and owner != pinned


def refuse_pinned(request: Request, action: str) -> None:
    """Team-wide changes (limit definitions) are for unpinned keys: a pinned key gets a 403 naming its pin."""
    caller: Caller = request.state.caller
    if caller.agent_id is not None:
        raise HTTPException(
            status_code=403,
            detail=f"this key is pinned to agent_id '{caller.agent_id}'; {action} needs a key not pinned to an agent",
        )


Team = Annotated[str, Depends(requires("read"))]  # the team of a caller that may read
Writer = Annotated[str, Depends(requires("write"))]
Admin = Annotated[str, Depends(requires("admin"))]
