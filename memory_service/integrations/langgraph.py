"""`MemoryServiceStore`: LangGraph's `BaseStore` over the service's HTTP API, through our Python client.

    from langgraph.graph import StateGraph
    from memory_service.integrations.langgraph import MemoryServiceStore

    store = MemoryServiceStore("http://127.0.0.1:8700", api_key=KEY, agent_id="support-bot")
    graph = builder.compile(store=store)     # nodes reach it as `store` (put, get, search, delete)

The team is the API key's; every item is a saved text of `agent_id`; a namespace is a set of tags (the
mapping: store_mapping.py, docs/langgraph.md). Each operation is written once, as a plan: a generator that
yields client calls and receives their answers; `batch` runs plans on `MemoryClient`, `abatch` on
`AsyncMemoryClient` (the GETs of one search concurrently), so the sync and async stores cannot drift apart.
Replacing or deleting an item forgets saved texts, which takes an admin key (one pinned to `agent_id` will do).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..client import AsyncMemoryClient, MemoryClient, NotFound
from .store_mapping import (
    PARTIAL,
    Stored,
    check_namespace,
    envelope_text,
    equality_tags,
    fixed_prefix,
    idempotency_key,
    item_tag,
    matches,
    namespace_matches,
    prefix_tag,
    read_envelope,
    tags_for,
)

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        Item,
        ListNamespacesOp,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
    )
except ImportError as exc:  # the extra is not installed
    raise ImportError(
        "memory_service.integrations.langgraph needs LangGraph: pip install 'memory-service[langgraph]'"
    ) from exc

__all__ = ["MemoryServiceStore"]

PAGE = 500  # the listing's largest page
MAX_K = 100  # recall's largest k


@dataclass(frozen=True)
class _Ask:
    """One client call a plan needs: the method's name and arguments; `missing_ok`: a 404 answers None."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    missing_ok: bool = False


# a plan yields one call or a list of calls (sent together by the async store) and is sent their answers
Plan = Generator["_Ask | list[_Ask]", Any, Any]


def _item(stored: Stored, at: datetime) -> Item:
    return Item(value=stored.value, key=stored.key, namespace=stored.namespace, created_at=at, updated_at=at)


def _hit(stored: Stored, at: datetime, score: float | None) -> SearchItem:
    return SearchItem(stored.namespace, stored.key, stored.value, at, at, score)


def _check(op: Op) -> None:
    """Ops handed to `batch` directly skip BaseStore's checks: the same rules, before anything is sent."""
    if isinstance(op, GetOp | PutOp):
        check_namespace(op.namespace, allow_empty=False)
        if not isinstance(op.key, str):
            raise ValueError(f"item key {op.key!r}: keys are strings")
    elif isinstance(op, SearchOp):
        check_namespace(op.namespace_prefix)
        if op.limit < 0 or op.offset < 0:
            raise ValueError("search limit and offset are zero or more")
    elif isinstance(op, ListNamespacesOp):
        for condition in op.match_conditions or ():
            check_namespace(tuple(label for label in condition.path if label != "*"))
    else:
        raise ValueError(f"unknown store operation {type(op).__name__}")


class MemoryServiceStore(BaseStore):
    """A LangGraph store kept in memory-service. `agent_id`: the agent every item is saved for (a key pinned
    to an agent needs its own); `wait_s`: how long a put waits for the facts (0: recall finds the text at
    once by its words, and by meaning a moment later); `min_score`: recall's cut (None: the service's floor)."""

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8700",
        *,
        api_key: str | None = None,
        agent_id: str = "langgraph",
        wait_s: float = 0.0,
        min_score: float | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.agent_id, self.wait_s, self.min_score = agent_id, wait_s, min_score
        self._options: dict[str, Any] = {"base_url": base_url, "api_key": api_key, "timeout_s": timeout_s}
        self._client = MemoryClient(**self._options)
        self._aclient: AsyncMemoryClient | None = None
        self._aloop: asyncio.AbstractEventLoop | None = None

    # -- running plans ---------------------------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Each op in order (a put before a get of the same item is seen by it)."""
        ops = list(ops)
        for op in ops:
            _check(op)
        return [self._drive(self._plan(op)) for op in ops]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        for op in ops:
            _check(op)
        return [await self._adrive(self._plan(op)) for op in ops]

    def _call(self, ask: _Ask) -> Any:
        try:
            return getattr(self._client, ask.method)(*ask.args, **ask.kwargs)
        except NotFound:
            if ask.missing_ok:
                return None
            raise

    async def _acall(self, client: AsyncMemoryClient, ask: _Ask) -> Any:
        try:
            return await getattr(client, ask.method)(*ask.args, **ask.kwargs)
        except NotFound:
            if ask.missing_ok:
                return None
            raise

    def _drive(self, plan: Plan) -> Any:
        try:
            asked = next(plan)
            while True:
                answer = [self._call(a) for a in asked] if isinstance(asked, list) else self._call(asked)
                asked = plan.send(answer)
        except StopIteration as done:
            return done.value

    async def _adrive(self, plan: Plan) -> Any:
        client = self._async_client()
        try:
            asked = next(plan)
            while True:
                if isinstance(asked, list):
                    answer: Any = await asyncio.gather(*(self._acall(client, a) for a in asked))
                else:
                    answer = await self._acall(client, asked)
                asked = plan.send(answer)
        except StopIteration as done:
            return done.value

    def _async_client(self) -> AsyncMemoryClient:
        """One per event loop: httpx's async connections belong to the loop that opened them."""
        loop = asyncio.get_running_loop()
        if self._aclient is None or self._aloop is not loop:
            self._aclient, self._aloop = AsyncMemoryClient(**self._options), loop
        return self._aclient

    def close(self) -> None:
        self._client.close()

    async def aclose(self) -> None:
        self._client.close()
        if self._aclient is not None:
            await self._aclient.aclose()
            self._aclient = None

    def __enter__(self) -> MemoryServiceStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> MemoryServiceStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- plans -------------------------------------------------------------------------------------------------

    def _plan(self, op: Op) -> Plan:
        if isinstance(op, GetOp):
            return self._get(op)
        if isinstance(op, PutOp):
            return self._put(op)
        if isinstance(op, SearchOp):
            return self._search(op)
        assert isinstance(op, ListNamespacesOp)
        return self._list_namespaces(op)

    def _listing(self, tag: str, cursor: str | None, limit: int = PAGE) -> _Ask:
        return _Ask("list", kwargs={"agent_id": self.agent_id, "tag": tag, "limit": limit, "cursor": cursor})

    def _versions(self, namespace: tuple[str, ...], key: str) -> Plan:
        """The saved texts holding this item, newest first (more than one only while a put replaces it)."""
        found, cursor = [], None
        while True:
            page = yield self._listing(item_tag(namespace, key), cursor, limit=100)
            for summary in page.items:
                stored = read_envelope(summary.text)
                if stored is not None and stored.namespace == namespace and stored.key == key:
                    found.append((summary, stored))
            cursor = page.next_cursor
            if not cursor:
                return found

    def _get(self, op: GetOp) -> Plan:
        found = yield from self._versions(op.namespace, op.key)
        if not found:
            return None
        summary, stored = found[0]
        return _item(stored, summary.created_at)

    def _put(self, op: PutOp) -> Plan:
        """Save the new text, then forget the older ones: the item is never missing in between, and a put of
        the value already there sends nothing more (nor does a delete of an item not there)."""
        found = yield from self._versions(op.namespace, op.key)
        if op.value is None:
            if found:
                yield [_Ask("forget", (summary.id,), missing_ok=True) for summary, _ in found]
            return None
        text = envelope_text(op.namespace, op.key, op.value)
        if len(found) == 1 and found[0][0].text == text:
            return None
        saved = yield _Ask(
            "remember",
            (text,),
            {
                "agent_id": self.agent_id,
                "tags": tags_for(op.namespace, op.key, op.value),
                "idempotency_key": idempotency_key(self.agent_id, text),
                "wait_s": self.wait_s,
            },
        )
        stale = [summary.id for summary, _ in found if summary.id != saved.id]
        if stale:
            yield [_Ask("forget", (memory_id,), missing_ok=True) for memory_id in stale]
        return None

    def _search(self, op: SearchOp) -> Plan:
        want = op.offset + op.limit
        if want == 0:
            return []
        if op.query:
            hits = yield from self._recalled(op, want, equality_tags(op.filter))
        else:  # the prefix's listing holds every item under it: the filter is matched here
            hits = yield from self._listed(op.namespace_prefix, op.filter, want)
        return hits[op.offset : want]

    def _listed(self, prefix: tuple[str, ...], flt: dict[str, Any] | None, want: int) -> Plan:
        """Items under `prefix` matching `flt`, newest first."""
        hits: list[SearchItem] = []
        seen: set[tuple[tuple[str, ...], str]] = set()
        cursor = None
        while len(hits) < want:
            page = yield self._listing(prefix_tag(prefix), cursor)
            for summary in page.items:
                stored = read_envelope(summary.text)
                if stored is None or stored.namespace[: len(prefix)] != prefix:
                    continue
                if (stored.namespace, stored.key) in seen:  # an older version, while a put replaces it
                    continue
                seen.add((stored.namespace, stored.key))
                if matches(stored.value, flt):
                    hits.append(_hit(stored, summary.created_at, None))
            cursor = page.next_cursor
            if not cursor:
                break
        return hits

    def _recalled(self, op: SearchOp, want: int, equal: list[str]) -> Plan:
        """Recall under the prefix's tag (and the filter's equality tags), best first; each hit's item read
        from its saved text, then checked against the whole filter."""
        base = [prefix_tag(op.namespace_prefix)]
        scores: dict[str, float] = {}
        for tags in [base + equal] + ([base + [PARTIAL]] if equal else []):
            answer = yield _Ask(
                "recall",
                (op.query,),
                {"k": min(MAX_K, 2 * want + 10), "agent_id": self.agent_id, "tags": tags, "min_score": self.min_score},
            )
            for item in answer.items:
                for memory_id in item.source_memory_ids or [item.memory_id]:
                    scores[memory_id] = max(scores.get(memory_id, -math.inf), item.score)
        ranked = sorted(scores, key=lambda memory_id: -scores[memory_id])
        hits: list[SearchItem] = []
        seen: set[tuple[tuple[str, ...], str]] = set()
        prefix = op.namespace_prefix
        while ranked and len(hits) < want:
            batch, ranked = ranked[:want], ranked[want:]
            memories = yield [_Ask("get", (memory_id,), missing_ok=True) for memory_id in batch]
            for memory_id, memory in zip(batch, memories, strict=True):
                stored = None if memory is None or memory.agent_id != self.agent_id else read_envelope(memory.text)
                if stored is None or stored.namespace[: len(prefix)] != prefix:
                    continue
                if (stored.namespace, stored.key) in seen:
                    continue
                seen.add((stored.namespace, stored.key))
                if matches(stored.value, op.filter):
                    hits.append(_hit(stored, memory.created_at, scores[memory_id]))
        return hits

    def _list_namespaces(self, op: ListNamespacesOp) -> Plan:
        """Every namespace holding an item, read from the listing under the conditions' fixed prefix."""
        conditions = op.match_conditions or ()
        fixed = next((fixed_prefix(tuple(c.path)) for c in conditions if c.match_type == "prefix"), ())
        namespaces: set[tuple[str, ...]] = set()
        cursor = None
        while True:
            page = yield self._listing(prefix_tag(fixed), cursor)
            for summary in page.items:
                stored = read_envelope(summary.text)
                if stored is not None and stored.namespace[: len(fixed)] == fixed:
                    namespaces.add(stored.namespace)
            cursor = page.next_cursor
            if not cursor:
                break
        kept = {ns for ns in namespaces if all(namespace_matches(ns, c.match_type, tuple(c.path)) for c in conditions)}
        if op.max_depth is not None:
            kept = {ns[: op.max_depth] for ns in kept}
        return sorted(kept)[op.offset : op.offset + op.limit]
