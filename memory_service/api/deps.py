"""Access to the service bundle built in the app's lifespan."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

if TYPE_CHECKING:
    from ..services import Services


async def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated["Services", Depends(get_services)]
