"""Webhook delivery: the loop that sends the journal's outbox rows, signed, and retries until they land.

The rows are written with their event (storage/webhooks.py), so delivery is at-least-once across crashes
and restarts: a row goes only once its receiver answered 2xx, and a process that dies mid-POST leaves the
row leased for a while, then due again. Receivers dedup on the event id. A failed attempt is retried with
exponential back-off and jitter (MEMORY_WEBHOOK_RETRY_BASE_S doubling up to MEMORY_WEBHOOK_RETRY_MAX_S), until
the event is MEMORY_WEBHOOK_MAX_AGE_S old; then it is marked failed. Delivery runs on the event loop with
httpx's async client and the journal in threads, so neither a request nor extraction ever waits for it.

A receiver is somebody else's server, so it may be slow, silent or hostile. Each subscription is sent by a
sender of its own (`_send`), and the dispatcher (`run`) never waits for one: a receiver that holds its
connection open costs only its own subscription's attempts. Each attempt has one deadline for all of it
(DNS, connect, send, the answer: MEMORY_WEBHOOK_TIMEOUT_S), not httpx's per-read timeout, which a receiver
sending a byte every few seconds never trips; and only `MAX_ANSWER_BYTES` of an answer's body are read, since
only its status matters (docs/security.md, "Outbound calls").

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

BATCH = 8  # a subscription's rows sent at once: its receiver's connections from this process, at most
MAX_ANSWER_BYTES = 64 * 1024  # of a receiver's answer body: read so the connection can be re-used, no more
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
        self._senders: dict[str, asyncio.Task[None]] = {}  # subscription id -> the task sending its rows
        self._wake: asyncio.Event | None = None  # set when a sender ends: its subscription may be due again

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
    @property
    def lease_s(self) -> float:
        """How long a claimed row stays with this process: one attempt's deadline, and room to record it."""
        return self.settings.webhook_timeout_s + 30.0

    async def run(self) -> None:
        """Start a sender for each subscription with due rows that has none, until cancelled; a store error is
        logged and the loop goes on. It waits for no sender: one stuck receiver holds only its own."""
        self._wake = asyncio.Event()
        try:
            while True:
                try:
                    await asyncio.to_thread(self._hand_on_limit_events)
                    due, due_in = await asyncio.to_thread(self.store.due, set(self._senders))
                    for sub_id in due:
                        self._senders[sub_id] = asyncio.create_task(self._send(sub_id), name=f"webhook-{sub_id}")
                    if time.time() - self._pruned_at > PRUNE_EVERY_S:
                        self._pruned_at = time.time()
                        await asyncio.to_thread(self.store.prune)
                    wait_s = IDLE_POLL_S if due_in is None else min(IDLE_POLL_S, due_in)
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), wait_s)
                    except TimeoutError:
                        pass
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the journal is busy or gone for now: the rows wait in it
                    log.warning("webhook delivery paused: %s", exc)
                    await asyncio.sleep(IDLE_POLL_S)
        finally:
            senders = list(self._senders.values())
            for task in senders:
                task.cancel()
            await asyncio.gather(*senders, return_exceptions=True)
            self._senders.clear()

    async def _send(self, sub_id: str) -> None:
        """Send one subscription's due rows, `BATCH` at a time, until none is due; then hand back to `run`."""
        try:
            while batch := await asyncio.to_thread(self.store.claim, BATCH, self.lease_s, None, sub_id):
                await asyncio.gather(*(self.deliver(d) for d in batch))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the journal is busy or gone: the claimed rows come back when their lease ends
            log.warning("webhook delivery to %s paused: %s", sub_id, exc)
        finally:
            self._senders.pop(sub_id, None)
            if self._wake is not None:
                self._wake.set()

    def _hand_on_limit_events(self) -> None:
        """Move `limit.exhausted` events from the limits store (another SQLite file, where the counter's own
        transaction wrote them) to the outbox; an event handed on twice keeps its id (at-least-once)."""
        events = self.limits.limit_events()
        if events:
            self.store.hand_on(events, "limit.exhausted")
            self.limits.drop_limit_events([e[0] for e in events])

    async def deliver(self, delivery: Delivery) -> bool:
        """One attempt; the row is marked delivered, due again, or failed for good. True when delivered."""
        error = await self.attempt(delivery)
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

    async def attempt(self, delivery: Delivery) -> str | None:
        """One POST within one deadline for all of it; None when the receiver answered 2xx, else why not."""
        timeout_s = self.settings.webhook_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                return await self._post(delivery)
        except TimeoutError:
            return (
                f"no whole answer within {timeout_s:g} s (MEMORY_WEBHOOK_TIMEOUT_S bounds the whole attempt: "
                "look-up, connect, send and answer)"
            )

    async def _post(self, delivery: Delivery) -> str | None:
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
        request = self._http().build_request("POST", target.url, content=body, headers=headers, extensions=extensions)
        try:
            answer = await self._http().send(request, stream=True)
            try:  # only the status matters: read a little of the body (so a short one frees the connection)
                read = 0
                async for chunk in answer.aiter_raw():
                    read += len(chunk)
                    if read > MAX_ANSWER_BYTES:
                        break  # closing an unfinished answer closes its connection: the rest is never read
            finally:
                await answer.aclose()
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"[:500] or type(exc).__name__
        if 200 <= answer.status_code < 300:
            return None
        return f"HTTP {answer.status_code}" + (" (redirects are not followed)" if answer.is_redirect else "")

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:  # no proxy or netrc from the environment: only the subscription's URL is called
            self._client = httpx.AsyncClient(
                timeout=self.settings.webhook_timeout_s,
                follow_redirects=False,
                trust_env=False,
                # no shared cap on connections: one team's stuck receivers must not leave the others waiting for
                # a free one. Each subscription's sender holds at most BATCH, for at most the attempt's deadline.
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=32),
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
