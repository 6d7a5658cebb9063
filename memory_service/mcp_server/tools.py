"""The MCP tools: what an agent's model can do with memory, written for a 3-4B model to use right.

Lessons from the field, each kept here:
- every description is one sentence on when to call the tool, with example arguments;
- a failure is a normal tool error that says what to do next (never an exception out of the server);
- an unknown id or limit name says what does exist, so the model can correct itself;
- an empty recall says what could be filtered on, so the model does not conclude memory is broken;
- a filter the team never used (a guessed agent id or tag) is dropped with one line saying so (recall_filters.py);
- a bad argument answers one sentence naming it and what to send (arguments.py), never pydantic's report;
- a text names only tools this server lists (a test greps every text the model can see).

Each tool is an async method of a `Toolbox`, which holds the service client and the agent's identity.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from ..client import AsyncMemoryClient, MemoryServiceError
from ..contract.roles import Role
from .argument_types import (
    RECALL_TOKENS,
    RECALL_TOKENS_MAX,
    AgentId,
    FilterTags,
    ItemKey,
    LimitName,
    MemoryId,
    Query,
    RecallTokens,
    SaveTags,
    Text,
    ToolFailed,
    too_long_to_save,
)
from .recall_filters import drop_unknown


@dataclass(frozen=True)
class ToolSpec:
    """One tool as listed: name, description, and the key role it needs (hidden from keys below it)."""

    name: str
    description: str
    needs: Role

    @property
    def writes(self) -> bool:
        return self.needs != "read"


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("remember", "Save what you did, learned or were told.", needs="write"),
    ToolSpec("recall", "Search memory before you act: what was done or known.", needs="read"),
    ToolSpec("get_memory", "Show one saved text with its status and the facts taken from it.", needs="read"),
    ToolSpec("forget", "Delete one saved text and the facts that came only from it.", needs="admin"),
    ToolSpec(
        "consume_limit",
        "Use a daily limit just before a limited action. If DENIED, do not do it today.",
        needs="write",
    ),
    ToolSpec("check_limit", "See how much of a daily limit is left today, without using any.", needs="read"),
    ToolSpec(
        "mark_handled",
        "Mark an item handled just before handling it; if handled before, skip it.",
        needs="write",
    ),
    ToolSpec("was_handled", "Check whether an item was already handled, without marking it.", needs="read"),
)
TOOL_NAMES = tuple(spec.name for spec in TOOLS)


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC") if hasattr(value, "strftime") else str(value)


ToolFunction = Callable[..., Awaitable[str]]


class Toolbox:
    """The tools, bound to one service (through the client) and one agent id.

    Each tool is a method whose signature is the tool's arguments (the SDK reads it for the schema);
    `visible` is what the model sees, so that an answer points only at tools it can call.
    """

    def __init__(
        self,
        memory: AsyncMemoryClient,
        *,
        url: str,
        agent_id: str,
        visible: frozenset[str] = frozenset(TOOL_NAMES),
    ) -> None:
        self.memory, self.url, self.agent_id, self.visible = memory, url, agent_id, visible

    def bind(self, visible: frozenset[str]) -> dict[str, ToolFunction]:
        """The tool functions by name, for a server that lists only `visible`."""
        listed = Toolbox(self.memory, url=self.url, agent_id=self.agent_id, visible=visible)
        return {name: getattr(listed, name) for name in TOOL_NAMES}

    # -- how failures read ----------------------------------------------------------

    async def _call(self, action: Awaitable[Any]) -> Any:
        try:
            return await action
        except MemoryServiceError as exc:
            raise ToolFailed(self._explain(exc)) from None

    async def _call_on_memory(self, action: Awaitable[Any], memory_id: str) -> Any:
        """Like `_call`, but an unknown id says how to find a current one."""
        try:
            return await action
        except MemoryServiceError as exc:
            if exc.status == 404:
                raise ToolFailed(self._unknown_memory(memory_id)) from None
            raise ToolFailed(self._explain(exc)) from None

    def _explain(self, exc: MemoryServiceError) -> str:
        if exc.status == 0:
            return (
                f"The memory service at {self.url} is not answering ({exc.message}). Try again in a minute; "
                "if it keeps failing, tell the user that the memory service is down."
            )
        if exc.status == 401:
            return (
                f"The memory service refused this server's API key: {exc.message}. "
                "Tell the user to check MEMORY_API_KEY."
            )
        if exc.status == 403:
            return f"This server's key may not do that: {exc.message}. Do not retry; tell the user if it matters."
        if exc.status in (422, 400, 413):
            return f"The arguments were not accepted: {exc.message}. Fix them and call again."
        if exc.status in (429, 503):
            return f"The memory service is busy ({exc.message}). Try again in a few seconds."
        return f"The memory service answered {exc.status}: {exc.message} (request id {exc.request_id})."

    # -- the tools: memories ------------------------------------------------------------

    async def remember(
        self,
        text: Text,
        tags: SaveTags = None,
    ) -> str:
        try:
            saved = await self.memory.remember(text, agent_id=self.agent_id, tags=tags or [])
        except MemoryServiceError as exc:
            raise ToolFailed(too_long_to_save(text, exc.message) if exc.status == 413 else self._explain(exc)) from None
        if not saved.created:
            return f"Already saved as {saved.id}."
        return f"Saved as {saved.id}. Facts are being extracted in the background; recall finds the text now."

    async def recall(
        self,
        query: Query,
        agent_id: AgentId | None = None,
        tags: FilterTags = None,
        max_tokens: RecallTokens = RECALL_TOKENS,
    ) -> str:
        """The service's `context` (dated, attributed lines, one per saved text, within `max_tokens`), pasted as is;
        with memory ids only when a listed tool takes one. A filter the team never used is dropped, and the
        answer's first line says so."""
        tags = tags or None
        found = await self._call(self.memory.recall(query, agent_id=agent_id, tags=tags, max_tokens=max_tokens))
        note = ""
        if not found.items and (agent_id or tags):  # a guessed filter: answer without it, and say so
            kept = await self._call(drop_unknown(self.memory, agent_id, tags))
            if kept.note:
                agent_id, tags, note = kept.agent_id, kept.tags, kept.note
                found = await self._call(self.memory.recall(query, agent_id=agent_id, tags=tags, max_tokens=max_tokens))
        if not found.items:
            empty = await self._empty_recall(query, agent_id, tags, max_tokens, below_floor=found.note is not None)
            return f"{note}\n{empty}" if note else empty
        lines = found.context.split("\n")
        if self.visible & {"get_memory", "forget"}:
            ids = list(dict.fromkeys(item.memory_id for item in found.items))  # a line says one saved text's facts
            lines = (
                [f"{line} (memory_id {i})" for line, i in zip(lines, ids, strict=True)]
                if len(ids) == len(lines)
                else [*lines, "memory_ids: " + ", ".join(ids)]
            )
        head = f"{len(lines)} result(s) for {query!r}, best first:"
        return "\n".join([note, head, *lines] if note else [head, *lines])

    async def get_memory(self, memory_id: MemoryId) -> str:
        saved = await self._call_on_memory(self.memory.get(memory_id), memory_id)
        facts = [f"- {f.text}" for f in saved.facts if f.superseded_by is None]
        lines = [
            f"memory_id {saved.id} by agent {saved.agent_id}, saved {_when(saved.created_at)}, status {saved.status}.",
            f"Text: {saved.text}",
        ]
        if saved.tags:
            lines.append("Tags: " + ", ".join(saved.tags))
        if facts:
            lines += ["Facts:", *facts]
        elif saved.status in ("queued", "extracting"):
            lines.append("Facts: not extracted yet; the text itself is saved.")
        else:
            lines.append("Facts: none were extracted.")
        return "\n".join(lines)

    async def forget(self, memory_id: MemoryId) -> str:
        await self._call_on_memory(self.memory.forget(memory_id), memory_id)
        return f"Forgot {memory_id}: its text and the facts that came only from it are deleted."

    # -- the tools: daily limits and the handled ledger ------------------------------------

    async def consume_limit(
        self,
        name: LimitName,
        amount: Annotated[int, Field(ge=1)] = 1,
    ) -> str:
        answer = await self._limit_call(self.memory.limits.consume(name, agent_id=self.agent_id, amount=amount), name)
        if not answer.allowed:
            return (
                f"DENIED: the daily limit {name!r} is reached ({answer.used} of {answer.limit} used). "
                f"Do not do the action, and say that the limit is reached; it resets at {answer.resets_at}."
            )
        return (
            f"ALLOWED: used {amount} of {name!r}; {answer.remaining} of {answer.limit} left today "
            f"(resets at {answer.resets_at})."
        )

    async def check_limit(self, name: LimitName) -> str:
        view = await self._limit_call(self.memory.limits.get(name, agent_id=self.agent_id), name)
        left = "unknown" if view.remaining is None else str(view.remaining)
        return (
            f"Limit {name!r}: {view.used} of {view.daily_limit} used today, {left} left (resets at {view.resets_at})."
        )

    async def mark_handled(self, key: ItemKey) -> str:
        record = await self._call(self.memory.handled.mark(key))
        if record.first_time:
            return f"Marked {key!r} as handled. Go ahead."
        return f"{key!r} was already handled (first at {record.first_seen_at}). Skip it."

    async def was_handled(self, key: ItemKey) -> str:
        record = await self._call(self.memory.handled.check(key))
        if record is None:
            return f"{key!r} was not handled yet."
        return f"{key!r} was already handled (first at {record.first_seen_at}). Skip it."

    # -- answers that point the model somewhere ------------------------------------------

    def _unknown_memory(self, memory_id: str) -> str:
        hint = " Call recall to find current memory ids." if "recall" in self.visible else ""
        return f"No memory with id {memory_id!r} in this team: the id is mistyped or the memory was deleted.{hint}"

    async def _limit_call(self, action: Awaitable[Any], name: str) -> Any:
        try:
            return await action
        except MemoryServiceError as exc:
            if exc.status != 404:
                raise ToolFailed(self._explain(exc)) from None
        try:
            names = sorted(view.name for view in await self.memory.limits.list())
        except MemoryServiceError as exc:
            raise ToolFailed(self._explain(exc)) from None
        if not names:
            raise ToolFailed(
                f"No limit named {name!r}: this team has no daily limits yet, so nothing is counted. "
                "Ask the user whether one should be set up."
            )
        raise ToolFailed(f"No limit named {name!r}. Limits in this team: {', '.join(names)}.")

    async def _empty_recall(
        self, query: str, agent_id: str | None, tags: list[str] | None, max_tokens: int, *, below_floor: bool = False
    ) -> str:
        """Why nothing came back. `below_floor`: the service's relevance floor left out every hit (the service
        says so in the answer's `note`): memory holds nothing that bears on the query."""
        unbounded = await self._call(self.memory.recall(query, k=1, agent_id=agent_id, tags=tags))
        if unbounded.items:
            return (
                f"What matched {query!r} is longer than max_tokens={max_tokens}. "
                f"Call recall again with a larger max_tokens (at most {RECALL_TOKENS_MAX})."
            )
        team = await self._call(self.memory.team())
        if team.memories == 0:
            return "Nothing found: this team's memory is empty so far (nothing has been saved yet)."
        agents = ", ".join(a.agent_id for a in team.agents[:10]) or "none"
        known_tags = ", ".join(t.tag for t in team.tags[:10]) or "none"
        filters = []
        if agent_id:
            filters.append(f"agent_id={agent_id!r}")
        if tags:
            filters.append(f"tags={tags!r}")
        nothing = f"Nothing matched {query!r}"
        if below_floor:
            nothing = f"Nothing in memory is close to {query!r} (weaker matches were left out as unrelated)"
        lines = [f"{nothing}, but memory is working and holds {team.memories} saved text(s)."]
        if filters:
            lines.append(f"You filtered on {' and '.join(filters)}; try again without the filter.")
        lines.append(f"Agent ids you can filter on: {agents}. Tags: {known_tags}.")
        lines.append("Try other words, e.g. a name, an id or a number from what you are looking for.")
        return "\n".join(lines)
