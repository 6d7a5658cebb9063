"""Python client for memory-service: `MemoryClient` (sync) and `AsyncMemoryClient` (asyncio), on httpx.

    from memory_service.client import MemoryClient
    with MemoryClient("http://127.0.0.1:8700") as memory:       # api_key="..." once keys exist
        saved = memory.remember("Sent the digest to 40 users.", agent_id="mailer", wait_s=10)
        hits = memory.recall("digest", k=5).items
        prompt_part = memory.recall("digest", max_tokens=300).context  # dated lines, within 300 tokens

Every method is written once, in core.Requests, with its keyword parameters and its result type (the wire's
pydantic models); the classes here bind each one to their way of sending (`_blocking`, `_awaited`), so the
sync and async clients cannot drift apart and a type checker sees both signatures. `remember` adds an
idempotency key, so a resend never saves twice. A 429 or 503 with `Retry-After` is retried while the wait
fits `retry_budget_s`; a refused connection raises `Unavailable` at once; every other failure raises the
`MemoryServiceError` subclass of its status (errors.py) with the server's message and the request id.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import urlsplit

import httpx

from ..contract.gate import DEFAULT_LEASE_S
from .core import Call, Requests, finish, lost, retry_delay
from .errors import MemoryServiceError
from .guard import Policy, guard_async, guard_sync

__all__ = ["AsyncMemoryClient", "MemoryClient", "MemoryServiceError"]

T = TypeVar("T")
P = ParamSpec("P")


class _Sends:
    """What a method bound by `_blocking` needs: the calls' builder and a `_run` that sends one."""

    _requests = Requests()

    def _run(self, call: Call[T]) -> T:
        raise NotImplementedError


class _AwaitsSends:
    """The same for `_awaited`: its `_run` is a coroutine."""

    _requests = Requests()

    async def _run(self, call: Call[T]) -> T:
        raise NotImplementedError


def _blocking(
    build: Callable[Concatenate[Requests, P], Call[T]],
) -> Callable[Concatenate[_Sends, P], T]:
    """`build`'s parameters and docstring, answering its result: a method of the blocking client."""

    def method(self: _Sends, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(build(self._requests, *args, **kwargs))

    functools.update_wrapper(method, build)
    return method


def _awaited(
    build: Callable[Concatenate[Requests, P], Call[T]],
) -> Callable[Concatenate[_AwaitsSends, P], Coroutine[Any, Any, T]]:
    """The same, as a coroutine: a method of the asyncio client."""

    async def method(self: _AwaitsSends, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._run(build(self._requests, *args, **kwargs))

    functools.update_wrapper(method, build)
    return method


class _SentBy(_Sends):
    """`client.limits` and `client.handled` of the blocking client: sent through their owner."""

    def __init__(self, owner: _Sends) -> None:
        self._owner = owner

    def _run(self, call: Call[T]) -> T:
        return self._owner._run(call)


class _AwaitedBy(_AwaitsSends):
    def __init__(self, owner: _AwaitsSends) -> None:
        self._owner = owner

    async def _run(self, call: Call[T]) -> T:
        return await self._owner._run(call)


class _Limits(_SentBy):
    """`client.limits`: daily limits (set, get, list, consume, delete)."""

    set = _blocking(Requests.limits_set)
    get = _blocking(Requests.limits_get)
    list = _blocking(Requests.limits_list)
    consume = _blocking(Requests.limits_consume)
    delete = _blocking(Requests.limits_delete)


class _Handled(_SentBy):
    """`client.handled`: the ledger of items already handled (mark, check)."""

    mark = _blocking(Requests.handled_mark)
    check = _blocking(Requests.handled_check)


class _Gate(_SentBy):
    """`client.gate`: reserve -> finish (or release) a guarded tool call; `client.guard` wraps a function."""

    reserve = _blocking(Requests.gate_reserve)
    finish = _blocking(Requests.gate_finish)
    release = _blocking(Requests.gate_release)


class _AsyncLimits(_AwaitedBy):
    """`client.limits`, awaited."""

    set = _awaited(Requests.limits_set)
    get = _awaited(Requests.limits_get)
    list = _awaited(Requests.limits_list)
    consume = _awaited(Requests.limits_consume)
    delete = _awaited(Requests.limits_delete)


class _AsyncHandled(_AwaitedBy):
    """`client.handled`, awaited."""

    mark = _awaited(Requests.handled_mark)
    check = _awaited(Requests.handled_check)


class _AsyncGate(_AwaitedBy):
    """`client.gate`, awaited."""

    reserve = _awaited(Requests.gate_reserve)
    finish = _awaited(Requests.gate_finish)
    release = _awaited(Requests.gate_release)


def _http_options(base_url: str, api_key: str | None, timeout_s: float) -> dict[str, Any]:
    if urlsplit(base_url).scheme not in ("http", "https"):
        raise ValueError(
            f"the memory service's URL {base_url!r} needs a scheme: e.g. http://127.0.0.1:8700 "
            "(http:// or https:// in front of the host and port)"
        )
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return {"base_url": base_url, "headers": headers, "timeout": timeout_s, "trust_env": False}


class MemoryClient(_Sends):
    """Blocking client. `api_key`: none for a keyless service (the `local` team); `retry_budget_s`: the most
    time spent waiting to resend one call."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8700",
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        retry_budget_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(**_http_options(base_url, api_key, timeout_s), transport=transport)
        self._timeout_s, self.retry_budget_s = timeout_s, retry_budget_s
        self.limits = _Limits(self)
        self.handled = _Handled(self)
        self.gate = _Gate(self)

    remember = _blocking(Requests.remember)
    get = _blocking(Requests.get)
    recall = _blocking(Requests.recall)
    list = _blocking(Requests.list)
    forget = _blocking(Requests.forget)
    export = _blocking(Requests.export)
    team = _blocking(Requests.team)
    import_memories = _blocking(Requests.import_)

    def guard(
        self,
        once: str | None = None,
        *,
        limit: str | None = None,
        units: int = 1,
        scope: str = "team",
        agent_id: str | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        tool: str | None = None,
    ) -> Callable[[Callable[P, T]], Callable[P, T]]:
        """A decorator: the function runs at most once per key rendered from `once` (e.g. "ticket:{item_id}",
        from the call's arguments) and within `units` of the daily `limit`; a refused call raises `Refused`
        (hand `exc.message` to the model) without running it, an exception releases the key and the units.
        `tool` names it in the ledger (default: the function's name). See client/guard.py."""
        return guard_sync(self, Policy(once, limit, units, scope, agent_id, lease_s, tool))

    def _run(self, call: Call[T]) -> T:
        started, attempt = time.monotonic(), 0
        while True:
            response: httpx.Response | None = None
            failure: Exception | None = None
            try:
                response = self._http.request(
                    call.method,
                    call.path,
                    params=call.params,
                    json=call.json,
                    content=call.content,
                    headers=call.headers,
                    timeout=self._timeout_s + call.extra_timeout_s,
                )
            except httpx.TransportError as exc:
                failure = exc
            delay = retry_delay(call, response, time.monotonic() - started, self.retry_budget_s, attempt, failure)
            if delay is None:
                if response is None:
                    assert failure is not None
                    raise lost(call, failure, str(self._http.base_url)) from failure
                return finish(call, response)
            attempt += 1
            time.sleep(delay)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncMemoryClient(_AwaitsSends):
    """asyncio client: the same methods, awaited. `retry_budget_s`: the most time spent waiting to resend."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8700",
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        retry_budget_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(**_http_options(base_url, api_key, timeout_s), transport=transport)
        self._timeout_s, self.retry_budget_s = timeout_s, retry_budget_s
        self.limits = _AsyncLimits(self)
        self.handled = _AsyncHandled(self)
        self.gate = _AsyncGate(self)

    remember = _awaited(Requests.remember)
    get = _awaited(Requests.get)
    recall = _awaited(Requests.recall)
    list = _awaited(Requests.list)
    forget = _awaited(Requests.forget)
    export = _awaited(Requests.export)
    team = _awaited(Requests.team)
    import_memories = _awaited(Requests.import_)

    def guard(
        self,
        once: str | None = None,
        *,
        limit: str | None = None,
        units: int = 1,
        scope: str = "team",
        agent_id: str | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        tool: str | None = None,
    ) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
        """MemoryClient.guard for async functions: the same policy, awaited."""
        return guard_async(self, Policy(once, limit, units, scope, agent_id, lease_s, tool))

    async def _run(self, call: Call[T]) -> T:
        started, attempt = time.monotonic(), 0
        while True:
            response: httpx.Response | None = None
            failure: Exception | None = None
            try:
                response = await self._http.request(
                    call.method,
                    call.path,
                    params=call.params,
                    json=call.json,
                    content=call.content,
                    headers=call.headers,
                    timeout=self._timeout_s + call.extra_timeout_s,
                )
            except httpx.TransportError as exc:
                failure = exc
            delay = retry_delay(call, response, time.monotonic() - started, self.retry_budget_s, attempt, failure)
            if delay is None:
                if response is None:
                    assert failure is not None
                    raise lost(call, failure, str(self._http.base_url)) from failure
                return finish(call, response)
            attempt += 1
            await asyncio.sleep(delay)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
