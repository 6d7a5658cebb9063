"""What the Hindsight routes read from the journal: a bank's documents and operations, found by listing the
bank's (agent's) memories. Blocking: call these in a thread.

A document is a run: its memories share `run_id` = the document id (one saved without a document id is a
document of its own, named by its memory id). An operation is found by the id its memories carry in their
metadata; it is looked for among the bank's newest memories, since a client polls it soon after the retain.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Path

from ...contract.hindsight import SEGMENT_PATTERN, SEGMENT_RULE
from ...contract.ids import MAX_ID_LEN, MEMORY_ID_PATTERN
from ...services import Listed, ListFilter, Memory

if TYPE_CHECKING:
    from ...services import Services

PREFIX = "/v1/default"
META = "hindsight"  # the metadata key holding what a Hindsight retain said beside the text
SCAN_CAP = 10_000  # memories a document listing reads at most (past it, total is a lower bound)
OPERATION_SCAN = 2_000  # newest memories of the bank an operation is looked for among
PAGE = 500
_MEMORY_ID = re.compile(MEMORY_ID_PATTERN)

BankId = Annotated[str, Path(min_length=1, max_length=MAX_ID_LEN, pattern=SEGMENT_PATTERN, description=SEGMENT_RULE)]
DocumentId = Annotated[
    str, Path(min_length=1, max_length=MAX_ID_LEN, pattern=SEGMENT_PATTERN, description=SEGMENT_RULE)
]


def iso_of(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, tz=UTC).isoformat()


def hs_meta(memory: Memory) -> dict[str, Any]:
    value = memory.metadata.get(META)
    return value if isinstance(value, dict) else {}


def document_id_of(memory: Memory) -> str:
    return memory.run_id or memory.id


def memories_of(services: Services, team: str, flt: ListFilter, cap: int) -> Iterator[Listed]:
    """The team's memories matching `flt`, newest first, at most `cap`."""
    after = None
    seen = 0
    while seen < cap:
        page, after = services.list_memories(team, flt, limit=min(PAGE, cap - seen), after=after)
        yield from page
        seen += len(page)
        if after is None or not page:
            return


@dataclass
class Document:
    id: str
    parts: list[Listed] = field(default_factory=list)  # newest first, as listed

    @property
    def memories(self) -> list[Memory]:
        return [p.memory for p in reversed(self.parts)]  # oldest first: the order they were retained

    @property
    def facts(self) -> int:
        return sum(p.facts for p in self.parts)

    @property
    def text(self) -> str:
        return "\n\n".join(m.text for m in self.memories)

    @property
    def tags(self) -> list[str]:
        return list(dict.fromkeys(t for m in self.memories for t in m.tags))

    def metadata(self) -> dict[str, Any]:
        first = hs_meta(self.memories[0])
        return {k: v for k, v in {"context": first.get("context"), **(first.get("metadata") or {})}.items() if v}


def documents(services: Services, team: str, bank: str) -> tuple[list[Document], bool]:
    """The bank's documents, the most recently written first, and whether the scan stopped at its cap."""
    found: dict[str, Document] = {}
    count = 0
    for listed in memories_of(services, team, ListFilter(agent_id=bank), SCAN_CAP):
        count += 1
        doc_id = document_id_of(listed.memory)
        found.setdefault(doc_id, Document(doc_id)).parts.append(listed)
    return list(found.values()), count >= SCAN_CAP


def document(services: Services, team: str, bank: str, doc_id: str) -> Document | None:
    """One document of the bank: its run's memories, or the memory of that id saved without a run."""
    doc = Document(doc_id)
    if _MEMORY_ID.fullmatch(doc_id):
        memory = services.memory(team, doc_id)
        if memory is not None and memory.agent_id == bank and memory.run_id is None:
            facts = len(services.facts_of_memory(team, doc_id))
            doc.parts.append(Listed(memory, facts))
            return doc
    doc.parts.extend(memories_of(services, team, ListFilter(agent_id=bank, run_id=doc_id), SCAN_CAP))
    return doc if doc.parts else None


def operation(services: Services, team: str, bank: str, operation_id: str) -> list[Memory]:
    """The memories an async retain stored under `operation_id`, among the bank's newest."""
    flt = ListFilter(agent_id=bank)
    return [
        listed.memory
        for listed in memories_of(services, team, flt, OPERATION_SCAN)
        if hs_meta(listed.memory).get("operation_id") == operation_id
    ]


def legacy_replays(services: Services, team: str, bank: str, keys: dict[str, str]) -> set[str]:
    """Which of these pre-v2 document keys (key -> its document id) the bank holds already: a document retained
    before derived keys changed is still found on a retry. Only the document's own rows (this bank, run = the
    document) are read, so the old keys' ambiguity cannot make another bank's or document's row a replay."""
    found: set[str] = set()
    for doc in set(keys.values()):
        flt = ListFilter(agent_id=bank, run_id=doc)
        found.update(p.memory.idempotency_key or "" for p in memories_of(services, team, flt, SCAN_CAP))
    return found & set(keys)
