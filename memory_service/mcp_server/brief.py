"""The `session_brief` prompt: what the team's memory holds that bears on a task, for a client to put at the
start of a session.

Agent benchmarks (STATE-Bench, MemoryArena) found that recalling into every prompt made agents worse, while a
brief at session start plus recall as a tool helped. The brief is one recall of the task's text: a few dated,
attributed lines, best first, short enough for a small model's context.
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver.prompts import Prompt
from pydantic import Field

from ..client import AsyncMemoryClient, MemoryServiceError
from .argument_types import MAX_QUERY_LEN

NAME = "session_brief"
BRIEF_ITEMS = 5  # lines of the brief: the best matches, not a dump of memory
BRIEF_TOKENS = 300  # of the service's counter: a few lines a 4B model reads at no real cost


async def brief(memory: AsyncMemoryClient, task: str) -> str:
    """The brief's text; a service that cannot answer is said in words (a prompt has no tool error)."""
    try:
        found = await memory.recall(task[:MAX_QUERY_LEN], k=BRIEF_ITEMS, max_tokens=BRIEF_TOKENS)
    except MemoryServiceError as exc:
        return f"Your team's memory could not be read for a brief ({exc.message}); it may hold more than this says."
    if not found.items:
        return "Your team's memory holds nothing yet that bears on this task."
    return "\n".join(["What your team's memory holds that bears on this task, best first:", found.context])


def brief_prompt(memory: AsyncMemoryClient) -> Prompt:
    """The prompt, bound to this server's service client (so to its key's team, and no other)."""

    async def session_brief(
        task: Annotated[str, Field(description="The session's task, as the agent will be given it.")],
    ) -> str:
        return await brief(memory, task)

    return Prompt.from_function(
        session_brief,
        name=NAME,
        description="What the team's memory holds that bears on a task: a few dated lines to start a session with.",
    )
