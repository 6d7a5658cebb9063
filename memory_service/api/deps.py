"""Access to the service bundle built in the app's lifespan.

`LimitsAndKeysDep` is the same object, typed as the part the limit and key routes use: an app over
those stores alone (the limit tests and bench) serves them too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

if TYPE_CHECKING:
    from ..services import LimitsAndKeys, Services


async def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated["Services", Depends(get_services)]
LimitsAndKeysDep = Annotated["LimitsAndKeys", Depends(get_services)]
