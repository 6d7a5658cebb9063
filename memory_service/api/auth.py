"""Bearer keys -> team. Every route depends on `Team`, so nothing runs unscoped."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from ..config import Settings


def _settings(request: Request) -> Settings:
    return request.app.state.services.settings


def team_of_key(settings: Settings, token: str) -> str | None:
    """The team of an API key, or None. Shared by the bearer header and the console's cookie."""
    team = None
    for key, key_team in settings.api_keys.items():
        # compare every key in constant time, so timing does not reveal prefixes
        if hmac.compare_digest(key.encode(), token.encode()):
            team = key_team
    return team


async def require_team(request: Request) -> str:
    """Async on purpose: a sync dependency costs a threadpool hop on every request."""
    settings = _settings(request)
    if not settings.auth_enabled:
        return Settings.LOCAL_TEAM
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPException(
            status_code=401,
            detail="missing API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    team = team_of_key(settings, token.strip())
    if team is None:
        raise HTTPException(status_code=401, detail="unknown API key", headers={"WWW-Authenticate": "Bearer"})
    return team


Team = Annotated[str, Depends(require_team)]
