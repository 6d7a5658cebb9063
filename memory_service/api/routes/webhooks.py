"""/v1/webhooks: an admin key subscribes its own team to events, lists and deletes its subscriptions.

A subscription's signing secret is shown once, in the answer to its creation (it is stored: the service
signs with it). Its URL must be http(s) and, unless the operator set MEMORY_WEBHOOK_ALLOW_PRIVATE=1, resolve
only to public addresses (pipeline/webhook_urls.py; checked again at every delivery). Subscriptions are
the team's, so a key pinned to an agent may not change them (403). See docs/webhooks.md.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from fastapi import APIRouter, HTTPException, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from ...services import (
    MAX_SUBSCRIPTIONS,
    MAX_URL_CHARS,
    BadWebhookUrl,
    Subscription,
    TooManySubscriptions,
    resolve_webhook_url,
)
from ..auth import Admin, refuse_pinned
from ..deps import ServicesDep
from ..errors import error_responses

router = APIRouter(tags=["webhooks"])

Event = Literal["memory.extracted", "memory.failed", "limit.exhausted"]


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=MAX_URL_CHARS, description="An http:// or https:// URL to POST to")
    events: list[Event] = Field(min_length=1, max_length=3, description="The events to send; repeats are dropped")


class WebhookOut(BaseModel):
    id: str
    url: str
    events: list[Event]
    created_at: datetime
    delivered: int = Field(description="Events this URL acknowledged with a 2xx")
    failed: int = Field(description="Events given up on (not delivered within MEMORY_WEBHOOK_MAX_AGE_S)")
    pending: int = Field(description="Events waiting to be delivered or retried")
    last_delivery_at: datetime | None
    last_failure_at: datetime | None
    last_error: str | None = Field(description="Why the last failed attempt failed")


class NewWebhookOut(WebhookOut):
    secret: str = Field(description="The signing secret: shown this once, never again")


def _stamp(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, tz=UTC)


def _out(sub: Subscription) -> dict:
    return {
        "id": sub.id,
        "url": sub.url,
        "events": list(sub.events),
        "created_at": _stamp(sub.created_at),
        "delivered": sub.delivered,
        "failed": sub.failed,
        "pending": sub.pending,
        "last_delivery_at": _stamp(sub.last_delivery_at),
        "last_failure_at": _stamp(sub.last_failure_at),
        "last_error": sub.last_error,
    }


@router.post(
    "/v1/webhooks",
    status_code=201,
    response_model=NewWebhookOut,
    summary="Subscribe a URL to this team's events",
    responses=error_responses(400, 401, 403, 409, 413, 422),
)
async def create_webhook(body: WebhookCreate, request: Request, team: Admin, services: ServicesDep) -> NewWebhookOut:
    """422 for a URL that is not http(s) or resolves to a loopback, private, link-local or reserved address
    (unless the operator allows those); 409 when the team has its most subscriptions already."""
    refuse_pinned(request, "managing webhooks")
    try:
        await resolve_webhook_url(body.url, allow_private=services.settings.webhook_allow_private)
    except BadWebhookUrl as exc:
        raise HTTPException(422, f"url: {exc}") from None
    try:
        sub, secret = await services.off_loop(services.webhooks.subscribe, team, body.url, list(body.events))
    except TooManySubscriptions as exc:
        raise HTTPException(409, str(exc)) from None
    return NewWebhookOut(**_out(sub), secret=secret)


@router.get(
    "/v1/webhooks",
    response_model=list[WebhookOut],
    summary=f"List this team's webhook subscriptions (at most {MAX_SUBSCRIPTIONS}; never their secrets)",
    responses=error_responses(401, 403),
)
async def list_webhooks(request: Request, team: Admin, services: ServicesDep) -> list[WebhookOut]:
    refuse_pinned(request, "managing webhooks")
    subs = await services.off_loop(services.webhooks.subscriptions, team)
    return [WebhookOut(**_out(sub)) for sub in subs]


@router.delete(
    "/v1/webhooks/{webhook_id}",
    status_code=204,
    summary="Delete a subscription and its undelivered events",
    responses=error_responses(401, 403, 404, 422),
)
async def delete_webhook(webhook_id: str, request: Request, team: Admin, services: ServicesDep) -> Response:
    refuse_pinned(request, "managing webhooks")
    if len(webhook_id) > 64 or not await services.off_loop(services.webhooks.unsubscribe, team, webhook_id):
        raise HTTPException(404, f"no webhook with id {webhook_id[:64]!r} in this team")
    return Response(status_code=204)
