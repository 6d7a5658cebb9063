"""One guarded call: reserve in the service, run the upstream tool only if granted, then finish or release.

    reserve (key and/or units, one transaction in the service)
      refused  -> the service's sentence is the tool's answer; the upstream is not called
      granted  -> call the upstream tool
                    error (isError, or an MCP error) -> release: the key is free again, the units refunded
                    success                          -> finish: the key is handled, with a short result

The promise is at most once per key and at most N units a day, so every doubt fails closed: a service that
does not answer, refuses the key or the values means the tool is not run, and the model reads one sentence
saying why and what to do. An upstream that stops answering mid-call may have run the tool: its reservation
is kept (it blocks the key until its lease runs out; its units stay used) rather than released.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import CONNECTION_CLOSED, REQUEST_TIMEOUT

from ..client import AsyncMemoryClient, MemoryServiceError
from ..contract.gate import render_key
from .policy import ToolPolicy

log = logging.getLogger("memory_service.gate")

RESULT_CHARS = 200  # what finish keeps of the tool's answer: the ledger's short result
ERROR_CHARS = 500
FINISH_TRIES = 3
UNREACHABLE = (0, 502, 503, 504)  # no answer, or none from the service itself: worth another try
META = "memory-service/gate"  # the `_meta` key of the gate's own answers: {"refused": why}

UpstreamCall = Callable[[str, dict[str, Any] | None], Awaitable[types.CallToolResult]]


def lost(exc: MCPError) -> bool:
    """No answer came (the connection closed, or the request timed out): the tool may have run. The SDK raises
    these itself, with codes a server may also send, so its own message is what tells them apart."""
    return (exc.code, exc.message) == (CONNECTION_CLOSED, "Connection closed") or exc.code == REQUEST_TIMEOUT


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(part.text for part in result.content if isinstance(part, types.TextContent))


def answer(text: str, reason: str) -> types.CallToolResult:
    """The gate's own answer in place of the tool's: always `isError` (the tool did not run, and a client checks
    a tool's output schema only on success), the sentence as text, and why in `_meta` for programs."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], is_error=True, _meta={META: {"refused": reason}}
    )


class Guard:
    """The guarded calls of one gate: one service client, one agent id, the policy's tools."""

    def __init__(self, memory: AsyncMemoryClient, *, url: str, agent_id: str, upstream: UpstreamCall) -> None:
        self.memory, self.url, self.agent_id, self.upstream = memory, url, agent_id, upstream

    async def call(self, policy: ToolPolicy, arguments: dict[str, Any] | None) -> types.CallToolResult:
        tool = policy.tool
        try:
            key = render_key(policy.once, arguments or {}) if policy.once else None
        except ValueError as exc:  # a field the call left out: the model can fix it
            return answer(f"{tool} was not run: {exc}.", "arguments")
        try:
            granted = await self.memory.gate.reserve(
                tool,
                key=key,
                scope=policy.scope,
                limit=policy.limit,
                units=policy.units if policy.limit else None,
                agent_id=self.agent_id,
                lease_s=policy.lease_s,
            )
        except MemoryServiceError as exc:
            refusal = self._refusal(exc)
            if refusal is not None:
                return self._refused(tool, key or policy.limit, refusal, str(exc.body.get("reason", "refused")))
            return self._closed(tool, key, policy, exc)
        if not granted.allowed or granted.reservation is None:
            said = granted.message or f"{tool} was refused; do not run it."
            return self._refused(tool, key or policy.limit, said, granted.reason or "refused")
        reservation = granted.reservation
        try:
            result = await self.upstream(tool, arguments)
        except MCPError as exc:
            if not lost(exc):  # the upstream answered an error: it did not do the job
                await self._release(reservation, tool, exc.message)
                raise
            stopped = exc.message
        except (anyio.get_cancelled_exc_class(), KeyboardInterrupt):
            raise  # the caller gave up: whether the tool ran is unknown, so the lease decides
        except Exception as exc:
            stopped = str(exc) or type(exc).__name__
        else:
            if result.is_error:
                await self._release(reservation, tool, text_of(result))
            else:
                await self._finish(reservation, tool, text_of(result)[:RESULT_CHARS])
            return result
        # no answer: the tool may have run, so the reservation is kept (its lease frees the key; units stay used)
        log.error(
            "gate: the upstream stopped answering during %s (%s): reservation %s kept until its lease ends",
            tool,
            stopped,
            reservation,
        )
        return answer(
            f"{tool} did not answer: the tool server stopped ({stopped}). Whether it ran is unknown, so it is "
            f"blocked for {policy.lease_s:.0f} s; tell the user.",
            "upstream_stopped",
        )

    # -- refusals and failures, as the model reads them ------------------------------------

    @staticmethod
    def _refused(tool: str, what: str | None, sentence: str, reason: str) -> types.CallToolResult:
        """Refused by the ledger (handled, in_progress) or the limit: the service's sentence is the answer."""
        log.info("gate: %s refused (%s): %s", tool, what, sentence)
        return answer(sentence, reason)

    @staticmethod
    def _refusal(exc: MemoryServiceError) -> str | None:
        """The service's own sentence, should a refusal (409 handled or in progress, 429 limit) come as an error."""
        body = exc.body if isinstance(exc.body, dict) else {}
        message = body.get("message")
        if exc.status in (409, 429) and body.get("allowed") is False and isinstance(message, str):
            return message
        return None

    def _closed(self, tool: str, key: str | None, policy: ToolPolicy, exc: MemoryServiceError) -> types.CallToolResult:
        """The call is not made: the service could not say it may be (fail closed, the promise is at most once)."""
        not_run = f"{tool} was not run"
        if exc.status == 404 and policy.limit:
            reason = "no_such_limit"
            text = (
                f"{not_run}: the daily limit {policy.limit!r} that guards it does not exist in the memory service. "
                "Do not retry; tell the user the limit must be set up."
            )
        elif exc.status in (401, 403):
            reason = "key_refused"
            text = (
                f"{not_run}: the memory service that guards it refused this gate's key ({exc.message}). "
                "Do not retry; tell the user to check the gate's API key."
            )
        elif exc.status in (400, 413, 422):
            reason = "values_refused"
            text = f"{not_run}: the memory service refused its guard's values ({exc.message}). Tell the user."
        elif exc.status not in UNREACHABLE:
            reason = "service_error"
            text = (
                f"{not_run}: the memory service that guards it answered {exc.status} ({exc.message}), so it cannot "
                "be checked that it was not done already. Try again in a minute; if it keeps failing, tell the user."
            )
        else:
            reason = "unavailable"
            text = (
                f"{not_run}: the memory service that guards it (at {self.url}) is not answering ({exc.message}), "
                "so it cannot be checked that it was not done already. Try again in a minute; if it keeps "
                "failing, tell the user the memory service is down."
            )
        log.warning("gate: %s (%s) not run, failing closed: %s", tool, key or policy.limit, exc)
        return answer(text, reason)

    async def _release(self, reservation: str, tool: str, error: str) -> None:
        try:
            await self.memory.gate.release(reservation, error=error[:ERROR_CHARS] or None)
        except MemoryServiceError as exc:  # the lease frees the key later; the units stay used
            log.error(
                "gate: could not release %s after %s failed (%s): it expires with its lease", reservation, tool, exc
            )

    async def _finish(self, reservation: str, tool: str, result: str) -> None:
        """Record the key handled. A service that blinks here is retried: an unrecorded key would let the item
        run again once the lease ends."""
        for attempt in range(FINISH_TRIES):
            try:
                await self.memory.gate.finish(reservation, result=result or None)
                return
            except MemoryServiceError as exc:
                if attempt and exc.status == 404:  # the try before did reach it, only its answer was lost
                    log.info("gate: %s recorded handled by an earlier try (%s)", tool, reservation)
                    return
                if exc.status not in (500, *UNREACHABLE) or attempt == FINISH_TRIES - 1:
                    log.error(
                        "gate: %s ran, but recording it handled failed (%s): reservation %s blocks it until its "
                        "lease ends, then it could run again",
                        tool,
                        exc,
                        reservation,
                    )
                    return
                await anyio.sleep(0.5 * 2**attempt)
