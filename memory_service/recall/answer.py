"""A recall's finished answer: the hits it says, the context to paste (within a budget) and the note.

The last third of a recall, after the search: every path that answers one (`/v1/recall`, Hindsight's
recall, and the MCP tools through `/v1/recall`) ends here, so the budget is applied one way everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, cast

from ..contract.models import RecallItem, RecallResponse
from .context import Context, Tokenizer, fitted, pieces_of, unbudgeted
from .rank import Hit
from .search import Recalled

ItemKind = Literal["fact", "passage", "consolidated"]
Counter = Literal["model", "estimate"]
Narrow = Callable[[list[Hit]], list[Hit]]  # a path's own filter of the hits, before the context is built


@dataclass
class RecallAnswer:
    hits: list[Hit]  # in rank order; with a budget, only those its context says
    context: Context
    note: str | None  # what the relevance floor left out, if anything

    def response(self) -> RecallResponse:
        """The answer on the wire of `/v1/recall`."""
        return RecallResponse(
            context=self.context.text,
            tokens=self.context.tokens,
            token_counter=cast(Counter | None, self.context.counter),
            note=self.note,
            items=[
                RecallItem(
                    kind=cast(ItemKind, h.kind),  # the search names only these kinds; pydantic checks it
                    text=h.text,
                    score=round(h.score, 6),
                    similarity=round(h.similarity, 4) if h.similarity is not None else None,
                    memory_id=h.memory_id,
                    source_memory_ids=h.source_memory_ids,
                    fact_id=h.fact_id,
                    agent_id=h.agent_id,
                    created_at=datetime.fromtimestamp(h.created_at, tz=UTC),
                    tags=h.tags,
                )
                for h in self.hits
            ],
        )


async def answer(
    found: Recalled,
    occurred: dict[str, float],
    query: str,
    max_tokens: int | None,
    tokenize: Tokenizer,
    timeout_s: float,
) -> RecallAnswer:
    """Without a budget, every hit and its context; with one, the context `fitted` assembles and the hits
    it says. `occurred`: when each hit's text tells it happened, for the lines' dates."""
    hits = found.hits
    if max_tokens is None:
        return RecallAnswer(hits, unbudgeted(pieces_of(hits, occurred, query)), found.note)
    context = await fitted(hits, occurred, query, max_tokens, tokenize, timeout_s)
    return RecallAnswer([hits[rank] for rank in context.kept], context, found.note)
