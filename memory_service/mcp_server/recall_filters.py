"""A recall filter the team never used is a guess: drop it, say so in one line, answer without it.

Small models fill optional arguments with invented values (`agent_id="default"`, the team's name, a tag that
sounds right). Such a filter matches nothing, the recall comes back empty, and the model concludes that
memory holds nothing, or repeats the identical call. Only the caller's own team is looked at: the team view
(`/v1/team`) and the listing are scoped to the key, so no other team's agents or tags are ever named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..client import AsyncMemoryClient

TEAM_VIEW_MAX = 50  # /v1/team lists at most this many agents and tags: past it, absent is not unknown
NAMED_MAX = 10  # how many known agents or tags a note names


@dataclass(frozen=True)
class Kept:
    """The filters worth applying, and the line saying what was dropped ("" when nothing was)."""

    agent_id: str | None
    tags: list[str] | None
    note: str = ""


async def _used(memory: AsyncMemoryClient, listed: list[str], **only: str) -> bool:
    """Whether the team used this agent id or tag: in its team view, or (past the view's cap) in its list."""
    (value,) = only.values()
    return value in listed or (len(listed) >= TEAM_VIEW_MAX and bool((await memory.list(limit=1, **only)).items))


def _named(values: list[str]) -> str:
    return ", ".join(values[:NAMED_MAX]) or "none yet"


async def drop_unknown(memory: AsyncMemoryClient, agent_id: str | None, tags: list[str] | None) -> Kept:
    """The filters without those this team never used (raises the client's `MemoryServiceError`)."""
    team: Any = await memory.team()
    agents = [a.agent_id for a in team.agents]
    known_tags = [t.tag for t in team.tags]
    notes = []
    if agent_id and not await _used(memory, agents, agent_id=agent_id):
        notes.append(
            f"No agent {agent_id!r} has saved anything in this team's memory, so this searched all agents "
            f"(agents: {_named(agents)})."
        )
        agent_id = None
    unknown = [tag for tag in tags or [] if not await _used(memory, known_tags, tag=tag)]
    if unknown:
        said = ("the tag " if len(unknown) == 1 else "the tags ") + ", ".join(repr(tag) for tag in unknown)
        notes.append(
            f"No saved text in this team's memory has {said}, so this searched without it (tags: {_named(known_tags)})."
        )
        tags = [tag for tag in tags or [] if tag not in unknown] or None
    return Kept(agent_id, tags, " ".join(notes))
