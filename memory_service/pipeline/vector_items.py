"""The one builder of the vector store's items: passages, facts and consolidated items, their ids and metadata.

Every path that writes a vector (the passage indexer, a job's commit, the sweep after a stop, an import,
consolidation, a reindex after a restore) builds it here, so recall's filters and a forget's deletes
find the same ids and metadata whichever path wrote it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..storage.consolidation import Item
from ..storage.journal import Fact, Memory
from ..storage.vectors import VectorItem, tag_key


def item_metadata(memory_id: str, agent_id: str, run_id: str | None, created_at: float, tags: list[str]) -> dict:
    """What recall filters and shows: the same for a passage or fact written now or rebuilt after a restore."""
    meta: dict = {"memory_id": memory_id, "agent_id": agent_id, "run_id": run_id or "", "created_at": created_at}
    for tag in tags:
        meta[tag_key(tag)] = True
    return meta


def base_metadata(memory: Memory) -> dict:
    """The metadata of an item that comes from one saved text."""
    return item_metadata(memory.id, memory.agent_id, memory.run_id, memory.created_at, memory.tags)


def passage_id(memory_id: str, start: int) -> str:
    """A passage window's id names its text and where the window starts, so a forget can name it again."""
    return f"p:{memory_id}:{start}"


def passage_item(memory: Memory, start: int, window: str, embedding: Any) -> VectorItem:
    return VectorItem(
        id=passage_id(memory.id, start),
        text=window,
        embedding=np.asarray(embedding),
        metadata={**base_metadata(memory), "kind": "passage", "start": start},
    )


def fact_item(fact_id: str, text: str, embedding: Any, metadata: dict) -> VectorItem:
    """A fact's vector; `metadata` is `item_metadata` of the memory it is stored under."""
    return VectorItem(id=fact_id, text=text, embedding=np.asarray(embedding), metadata={**metadata, "kind": "fact"})


def memory_fact_item(memory: Memory, fact_id: str, text: str, embedding: Any) -> VectorItem:
    """A fact's vector, written beside the saved text it comes from (a job's commit, an import)."""
    return fact_item(fact_id, text, embedding, base_metadata(memory))


def journal_fact_item(fact: Fact, run_id: str | None, embedding: Any) -> VectorItem:
    """A fact's vector rebuilt from its journal row (and its memory's run id)."""
    meta = item_metadata(fact.memory_id, fact.agent_id, run_id, fact.created_at, fact.tags)
    return fact_item(fact.id, fact.text, embedding, meta)


def consolidated_item(item: Item, embedding: Any) -> VectorItem:
    """A consolidated item's vector: dated and filed under its newest source memory, with no run."""
    meta = item_metadata(item.memory_id, item.agent_id, None, item.created_at, item.tags)
    return VectorItem(
        id=item.id, text=item.text, embedding=np.asarray(embedding), metadata={**meta, "kind": "consolidated"}
    )
