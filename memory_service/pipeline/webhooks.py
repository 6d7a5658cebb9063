"""Webhook delivery: the loop that sends the journal's outbox rows, signed, and retries until they land.

The rows are written with their event (storage/webhooks.py), so delivery is at-least-once across crashes
and restarts: a row goes only once its receiver answered 2xx, and a process that dies mid-POST leaves the
row leased for a while, then due again. Receivers dedup on the event id. A failed attempt is retried with
exponential back-off and jitter (MEMORY_WEBHOOK_RETRY_BASE_S doubling up to MEMORY_WEBHOOK_RETRY_MAX_S), until
the event is MEMORY_WEBHOOK_MAX_AGE_S old; then it is marked failed. Delivery runs on the event loop with
httpx's async client and the journal in threads, so neither a request nor extraction ever waits for it.

Each POST carries the JSON body and `X-Memory-Event-Id`, `X-Memory-Event`, `X-Memory-Timestamp` (Unix
seconds) and `X-Memory-Signature`: hex HMAC-SHA256 with the subscription's secret over
`f"{timestamp}.{body}"` (docs/webhooks.md shows a receiver's check). Redirects are not followed.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import random
import time
from typing import Any

import httpx

from ..config import Settings
from ..storage.journal import Journal
from ..storage.limits import LimitStore
from ..storage.webhooks import Delivery, Subscription, WebhookStore
from .webhook_urls import BadWebhookUrl, resolve

log = logging.getLogger("memory_service")

BATCH = 16  # rows sent at once; one slow receiver holds up at most this batch, for at most its timeout
IDLE_POLL_S = 1.0  # how often an idle loop looks for new rows (events are written by other threads)
PRUNE_EVERY_S = 3600.0


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The `X-Memory-Signature` of a delivery: hex HMAC-SHA256(secret, "<timestamp>.<body>")."""
    return hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def body_of(delivery: Delivery) -> bytes:
    event = {
        "id": delivery.event_id,
        "type": delivery.event,
        "team": delivery.team,
        "created_at": delivery.created_at,
        "data": delivery.payload,
    }
    return json.dumps(event, separators=(",", ":"), sort_keys=True).encode()


class Webhooks:
    """The team's subscriptions (what the admin routes and the console call) and the delivery loop that
    `Services` starts and stops."""

    def __init__(self, settings: Settings, journal: Journal, limits: LimitStore) -> None:
        self.settings, self.limits = settings, limits
        self.store = journal.attached("webhooks", lambda: WebhookStore(journal.db))
        self._client: httpx.AsyncClient | None = None
        self._pruned_at = 0.0

    # -- the facade (blocking: call in a thread)
    def subscribe(self, team: str, url: str, events: list[str]) -> tuple[Subscription, str]:
        return self.store.subscribe(team, url, events)

    def subscriptions(self, team: str | None = None) -> list[Subscription]:
        return self.store.subscriptions(team)

    def unsubscribe(self, team: str, sub_id: str) -> bool:
        return self.store.unsubscribe(team, sub_id)

    def status(self, team: str | None = None) -> dict[str, Any]:
        return self.store.status(team)

    # -- the loop
    async def run(self) -> None:
        """Send due rows until cancelled; a store error is logged and the loop goes on."""
        lease_s = self.settings.webhook_timeout_s + 30.0
        while True:
            try:
                await asyncio.to_thread(self._hand_on_limit_events)
                batch = await asyncio.to_thread(self.store.claim, BATCH, lease_s)
                if batch:
                    await asyncio.gather(*(self.deliver(d) for d in batch))
                    continue
                if time.time() - self._pruned_at > PRUNE_EVERY_S:
                    self._pruned_at = time.time()
                    await asyncio.to_thread(self.store.prune)
                due_in = await asyncio.to_thread(self.store.next_due_in)
                await asyncio.sleep(IDLE_POLL_S if due_in is None else min(IDLE_POLL_S, due_in))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the journal is busy or gone for now: the rows wait in it
                log.warning("webhook delivery paused: %s", exc)
                await asyncio.sleep(IDLE_POLL_S)

    def _hand_on_limit_events(self) -> None:
        """Move `limit.exhausted` events from the limits store (another SQLite file, where the counter's own
        transaction wrote them) to the outbox; an event handed on twice keeps its id (at-least-once)."""
        events = self.limits.limit_events()
        if events:
            self.store.hand_on(events, "limit.exhausted")
            self.limits.drop_limit_events([e[0] for e in events])

    async def deliver(self, delivery: Delivery) -> bool:
        """One attempt; the row is marked delivered, due again, or failed for good. True when delivered."""
        error = await self._post(delivery)
        if error is None:
            await asyncio.to_thread(self.store.delivered, delivery)
            return True
        now = time.time()
        retry_at: float | None = now + self.backoff(delivery.attempts)
        if now - delivery.created_at >= self.settings.webhook_max_age_s:
            retry_at = None
            log.warning("webhook %s to %s failed for good: %s", delivery.event_id, delivery.subscription_id, error)
        await asyncio.to_thread(self.store.attempt_failed, delivery, error, retry_at)
        return False

    def backoff(self, attempts: int) -> float:
        """Seconds before the next attempt: doubling from the base, capped, with jitter (half to all of it)
        so receivers coming back are not hit by every row at once."""
        delay = min(self.settings.webhook_retry_max_s, self.settings.webhook_retry_base_s * 2 ** min(attempts, 30))
        return delay * random.uniform(0.5, 1.0)

    async def _post(self, delivery: Delivery) -> str | None:
        """None when the receiver answered 2xx, else why not."""
        try:
            target = await resolve(delivery.url, allow_private=self.settings.webhook_allow_private)
        except BadWebhookUrl as exc:
            return str(exc)
        body = body_of(delivery)
        timestamp = str(int(time.time()))
        headers = {
            "content-type": "application/json",
            "user-agent": "memory-service-webhooks",
            "x-memory-event-id": delivery.event_id,
            "x-memory-event": delivery.event,
            "x-memory-timestamp": timestamp,
            "x-memory-signature": sign(delivery.secret, timestamp, body),
        }
        if target.host_header:
            headers["host"] = target.host_header
        extensions = {"sni_hostname": target.sni_hostname} if target.sni_hostname else None
        try:
            answer = await self._http().post(target.url, content=body, headers=headers, extensions=extensions)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"[:500] or type(exc).__name__
        if 200 <= answer.status_code < 300:
            return None
        return f"HTTP {answer.status_code}" + (" (redirects are not followed)" if answer.is_redirect else "")

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:  # no proxy or netrc from the environment: only the subscription's URL is called
            self._client = httpx.AsyncClient(
                timeout=self.settings.webhook_timeout_s, follow_redirects=False, trust_env=False
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
