"""The brief: one recall at a session's start, for the conversation's opening, under a time limit.

Recall does the work a brief needs: items under the relevance floor are left out, the context's lines are
dated and attributed, a source is said once, and `max_tokens` keeps the lines within the budget. Recalling
into every turn is what made agents worse in the benchmarks (and stalls a turn on every recall); one brief at
the start, re-sent unchanged, keeps the prompt's prefix cached.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from ..client import AsyncMemoryClient, MemoryServiceError

log = logging.getLogger("memory_service.proxy")

BRIEF_ITEMS = 10  # the best matches only; the token budget usually binds first
MAX_QUERY_CHARS = 4096  # recall's own bound on a query
HEAD = (
    "Memory: what your team's memory held at the start of this conversation that bears on it "
    "(dated lines, best first; it may be out of date):"
)


@dataclass(frozen=True)
class Recalled:
    """A brief's text (None when nothing bore on the opening), or why there is none this time (`failure`)."""

    text: str | None
    lines: int = 0
    tokens: int | None = None
    failure: str | None = None


def opening_query(user: str, system: str) -> str:
    """The first user message, then the system task: a long system prompt must not crowd out the request."""
    return "\n".join(part.strip() for part in (user, system) if part.strip())[:MAX_QUERY_CHARS]


async def recall_brief(memory: AsyncMemoryClient, query: str, *, budget_tokens: int, limit_s: float) -> Recalled:
    """The brief for `query` within `limit_s`; a slow, refused or failing recall is a `failure`, never raised."""
    began = time.monotonic()
    try:
        found = await asyncio.wait_for(memory.recall(query, k=BRIEF_ITEMS, max_tokens=budget_tokens), limit_s)
    except TimeoutError:
        return Recalled(None, failure=f"the recall took over {limit_s * 1000:.0f} ms")
    except MemoryServiceError as exc:
        return Recalled(None, failure=f"the recall failed ({exc.message})")
    log.debug("brief recall answered in %.1f ms", (time.monotonic() - began) * 1000)
    if not found.items or not found.context.strip():
        return Recalled(None, tokens=found.tokens)
    return Recalled(f"{HEAD}\n{found.context}", lines=len(found.context.splitlines()), tokens=found.tokens)
