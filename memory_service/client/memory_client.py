"""Python client for memory-service: `MemoryClient` (sync) and `AsyncMemoryClient` (asyncio), on httpx.

    from . import MemoryClient
    with MemoryClient("http://127.0.0.1:8700", api_key="...") as memory:
        saved = memory.remember("Sent the digest to 40 users.", agent_id="mailer", wait_s=10)
        hits = memory.recall("digest", k=5).items
        prompt_part = memory.recall("digest", max_tokens=300).context  # dated lines, within 300 tokens

Both share one implementation (client_core.Requests builds every call and reads every answer); the
classes here only send. `remember` adds an idempotency key, so a resend never saves twice. A 429 or 503
with `Retry-After` is retried while the wait fits `retry_budget_s`; a refused connection raises `Unavailable`
at once; every other failure raises the `MemoryServiceError` subclass of its status (errors.py) with the
server's message and the request id.
"""

from __future__ import annotations

import asyncio
import builtins
import time
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import httpx

from .core import Call, Requests, finish, lost, retry_delay
from .errors import MemoryServiceError

__all__ = ["AsyncMemoryClient", "MemoryClient", "MemoryServiceError"]

T = TypeVar("T")
Owner = TypeVar("Owner", bound="_Surface")


class _Limits(Generic[Owner]):
    """`client.limits`: daily limits (set, get, list, consume, delete)."""

    def __init__(self, owner: Owner) -> None:
        self._owner = owner

    def set(self, name: str, *, daily_limit: int, timezone: str = "UTC", per: str = "team") -> Any:
        return self._owner._run(
            self._owner._requests.limits_set(name, daily_limit=daily_limit, timezone=timezone, per=per)
        )

    def get(self, name: str, *, agent_id: str | None = None, days: int | None = None) -> Any:
        return self._owner._run(self._owner._requests.limits_get(name, agent_id=agent_id, days=days))

    def list(self, *, agent_id: str | None = None) -> Any:
        return self._owner._run(self._owner._requests.limits_list(agent_id=agent_id))

    def consume(self, name: str, *, agent_id: str, amount: int = 1, idempotency_key: str | None = None) -> Any:
        """A ConsumeAnswer; `allowed` is False when the limit is reached (not an exception)."""
        return self._owner._run(
            self._owner._requests.limits_consume(
                name, agent_id=agent_id, amount=amount, idempotency_key=idempotency_key
            )
        )

    def delete(self, name: str) -> Any:
        return self._owner._run(self._owner._requests.limits_delete(name))


class _Handled(Generic[Owner]):
    """`client.handled`: the ledger of items already handled (mark, check)."""

    def __init__(self, owner: Owner) -> None:
        self._owner = owner

    def mark(self, key: str, *, agent_id: str | None = None, ttl_days: int | None = None) -> Any:
        """A HandledOut; `first_time` says whether this is the first mark of the key."""
        return self._owner._run(self._owner._requests.handled_mark(key, agent_id=agent_id, ttl_days=ttl_days))

    def check(self, key: str, *, agent_id: str | None = None) -> Any:
        """The HandledOut of a key seen before, or None."""
        return self._owner._run(self._owner._requests.handled_check(key, agent_id=agent_id))


class _Surface:
    """Every method once. Each builds a call and hands it to `_run`: the sync client returns the result,
    the async client a coroutine of it. Results are the API's models (memory_service.contract.models)."""

    _requests = Requests()

    def __init__(self) -> None:
        self.limits = _Limits(self)
        self.handled = _Handled(self)

    def _run(self, call: Call[T]) -> Any:
        raise NotImplementedError

    def remember(
        self,
        text: str,
        *,
        agent_id: str,
        run_id: str | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        wait_s: float = 0.0,
    ) -> Any:
        """RememberResponse. `wait_s` waits (≤ 120 s) for extraction before answering."""
        return self._run(
            self._requests.remember(
                text,
                agent_id=agent_id,
                run_id=run_id,
                tags=tags,
                metadata=metadata,
                idempotency_key=idempotency_key,
                wait_s=wait_s,
            )
        )

    def get(self, memory_id: str) -> Any:
        """MemoryOut: status, facts with spans, errors, timings."""
        return self._run(self._requests.get(memory_id))

    def recall(self, query: str, **options: Any) -> Any:
        """RecallResponse (its `context`: the items as lines to paste); options: k, agent_id (searches only that
        agent), kinds, tags, since, until, min_score, time_field, max_tokens (the best items that fit it), as_of (when asked)."""
        return self._run(self._requests.recall(query, **options))

    def list(self, **filters: Any) -> Any:
        """MemoryPage; filters: agent_id, run_id, status, tag, since, until, limit, cursor."""
        return self._run(self._requests.list(**filters))

    def forget(
        self,
        memory_id: str | None = None,
        *,
        agent_id: str | None = None,
        run_id: str | None = None,
        confirm: bool = False,
    ) -> Any:
        """ForgetResponse. One id, or all of an agent/run (which needs confirm=True)."""
        return self._run(self._requests.forget(memory_id, agent_id=agent_id, run_id=run_id, confirm=confirm))

    def export(self) -> Any:
        """list[ExportedMemory]: the team's memories with their facts, oldest first."""
        return self._run(self._requests.export())

    def team(self) -> Any:
        """TeamOut: this key's team and role, the memory count, the busiest agent ids and tags."""
        return self._run(self._requests.team())

    def import_memories(self, records: builtins.list[Any], *, re_extract: bool = False) -> Any:  # not the method
        """ImportResponse; records as `export` returns them."""
        return self._run(self._requests.import_(records, re_extract=re_extract))


def _http_options(base_url: str, api_key: str | None, timeout_s: float) -> dict[str, Any]:
    if urlsplit(base_url).scheme not in ("http", "https"):
        raise ValueError(
            f"the memory service's URL {base_url!r} needs a scheme: e.g. http://127.0.0.1:8700 "
            "(http:// or https:// in front of the host and port)"
        )
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return {"base_url": base_url, "headers": headers, "timeout": timeout_s, "trust_env": False}


class MemoryClient(_Surface):
    """Blocking client. `retry_budget_s`: the most time spent waiting to resend one call."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8700",
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        retry_budget_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__()
        self._http = httpx.Client(**_http_options(base_url, api_key, timeout_s), transport=transport)
        self._timeout_s, self.retry_budget_s = timeout_s, retry_budget_s

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


class AsyncMemoryClient(_Surface):
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
        super().__init__()
        self._http = httpx.AsyncClient(**_http_options(base_url, api_key, timeout_s), transport=transport)
        self._timeout_s, self.retry_budget_s = timeout_s, retry_budget_s

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
