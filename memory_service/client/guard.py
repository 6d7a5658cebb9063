"""`memory.guard(...)`: a plain function (sync or async) behind the gate: run once per key, within a daily limit.

    @memory.guard(once="ticket:{item_id}", limit="emails", agent_id="triage")
    def process_item(item_id: int, note: str) -> str: ...

Each call binds its arguments to the function's signature, renders the key from the template, reserves it
(and the units) in the service, runs the function, and finishes with a short result (str(return value), at
most 200 chars); an exception releases the key and refunds the units, then propagates. A refused call does
not run the function: it raises `Refused` carrying the service's sentence (`exc.message`).

What it cannot promise: a function that had its effect and then raised is released (and may run again); a
process that died between reserve and finish leaves the key held until the lease (`lease_s`) runs out, after
which the item may run again. A finish that fails after the function ran is logged and the value returned:
the function's effect happened, and raising would invite a second run.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from ..contract.gate import ReserveAnswer, render_key, template_fields
from .errors import MemoryServiceError, Refused

if TYPE_CHECKING:
    from .memory_client import AsyncMemoryClient, MemoryClient

log = logging.getLogger("memory_service.client")

P = ParamSpec("P")
R = TypeVar("R")
RESULT_CHARS = 200  # the short result a finish records: str(return value), cut here
_NOT_TOOL_CHARS = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class Policy:
    """What guards a function: its key template and/or daily limit, whose ledger, for which agent."""

    once: str | None
    limit: str | None
    units: int
    scope: str
    agent_id: str | None
    lease_s: float
    tool: str | None

    def __post_init__(self) -> None:
        if self.once is None and self.limit is None:
            raise ValueError("guard needs once= (a key template such as 'ticket:{item_id}'), limit=, or both")
        if self.units != 1 and self.limit is None:
            raise ValueError("units= counts against a daily limit: name it with limit=")
        if self.once is not None:
            template_fields(self.once)  # a malformed template fails at decoration, not at the first call


def _tool_name(func: Callable[..., Any], tool: str | None) -> str:
    """The name the ledger records: `tool`, or the function's name in the tool-name alphabet."""
    name = tool or _NOT_TOOL_CHARS.sub("_", getattr(func, "__name__", "tool"))[:128]
    return name or "tool"


def _arguments(signature: inspect.Signature, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The call's arguments by parameter name, defaults applied; a **kwargs parameter's entries are flattened in."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    values = dict(bound.arguments)
    for name, parameter in signature.parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            values.update(values.pop(name, {}))
    return values


def _key(policy: Policy, signature: inspect.Signature, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    """The call's key, or Refused ("arguments") naming the field the template lacks: the function is not run."""
    if policy.once is None:
        return None
    try:
        return render_key(policy.once, _arguments(signature, args, kwargs))
    except (ValueError, TypeError) as exc:  # TypeError: the call does not fit the signature
        raise Refused(422, str(exc), reason="arguments") from exc


def _reserve_args(policy: Policy, tool: str, key: str | None) -> dict[str, Any]:
    return {
        "key": key,
        "scope": policy.scope,
        "limit": policy.limit,
        "units": policy.units if policy.limit is not None else None,
        "agent_id": policy.agent_id,
        "lease_s": policy.lease_s,
    }


def _refused(answer: ReserveAnswer) -> Refused:
    status = 429 if answer.reason == "limit" else 409
    return Refused(
        status,
        answer.message or f"refused: {answer.reason}",
        body=answer.model_dump(),
        reason=answer.reason or "refused",
        handled=answer.handled,
        limit=answer.limit,
    )


def _short(value: Any) -> str:
    return str(value)[:RESULT_CHARS]


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def guard_sync(client: MemoryClient, policy: Policy) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """MemoryClient.guard's decorator: for plain (sync) functions."""

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        if inspect.iscoroutinefunction(func):
            raise TypeError(f"{func.__name__} is async: guard it with AsyncMemoryClient(...).guard")
        signature, tool = inspect.signature(func), _tool_name(func, policy.tool)

        @functools.wraps(func)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            key = _key(policy, signature, args, kwargs)
            answer = client.gate.reserve(tool, **_reserve_args(policy, tool, key))
            if not answer.allowed or answer.reservation is None:
                raise _refused(answer)
            try:
                value = func(*args, **kwargs)
            except BaseException as exc:
                try:
                    client.gate.release(answer.reservation, error=_error(exc))
                except MemoryServiceError as lost:
                    log.warning("guard: %s raised, and its release failed too: %s", tool, lost)
                raise
            try:
                client.gate.finish(answer.reservation, result=_short(value))
            except MemoryServiceError as lost:
                log.warning("guard: %s ran but its finish failed (the key frees when its lease ends): %s", tool, lost)
            return value

        return guarded

    return decorate


def guard_async(
    client: AsyncMemoryClient, policy: Policy
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """AsyncMemoryClient.guard's decorator: for async functions."""

    def decorate(func: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        if not inspect.iscoroutinefunction(func):
            raise TypeError(f"{getattr(func, '__name__', func)} is not async: guard it with MemoryClient(...).guard")
        signature, tool = inspect.signature(func), _tool_name(func, policy.tool)

        @functools.wraps(func)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            key = _key(policy, signature, args, kwargs)
            answer = await client.gate.reserve(tool, **_reserve_args(policy, tool, key))
            if not answer.allowed or answer.reservation is None:
                raise _refused(answer)
            try:
                value = await func(*args, **kwargs)
            except BaseException as exc:
                try:
                    await client.gate.release(answer.reservation, error=_error(exc))
                except MemoryServiceError as lost:
                    log.warning("guard: %s raised, and its release failed too: %s", tool, lost)
                raise
            try:
                await client.gate.finish(answer.reservation, result=_short(value))
            except MemoryServiceError as lost:
                log.warning("guard: %s ran but its finish failed (the key frees when its lease ends): %s", tool, lost)
            return value

        return guarded

    return decorate


__all__ = ["Policy", "guard_async", "guard_sync"]
