"""Put passages and facts into the vector store; decide what a new fact is.

Passages: every saved text is embedded as-is (in windows, for long texts)
right after it is acked, so recall finds it whether or not extraction ever
succeeds. Facts: deterministic dedup before anything else — an exact
(normalised) duplicate adds a source to the existing fact; a fact with the same
shape but different numbers supersedes the older one; a near-duplicate by
cosine merges into it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from memory_service.embedding.embedder import Embedder
from memory_service.extraction.grounding import GroundedFact, identifiers, normalize, numbers, shape
from memory_service.storage.journal import Fact, FactPlan, Journal, Memory, NewFact
from memory_service.storage.vectors import VectorItem, VectorStore, tag_key

PASSAGE_WINDOW_CHARS = 1000
PASSAGE_OVERLAP_CHARS = 150


def item_metadata(memory_id: str, agent_id: str, run_id: str | None, created_at: float, tags: list[str]) -> dict:
    """What recall filters and shows: the same for a passage or fact written now or rebuilt after a restore."""
    meta: dict = {"memory_id": memory_id, "agent_id": agent_id, "run_id": run_id or "", "created_at": created_at}
    for tag in tags:
        meta[tag_key(tag)] = True
    return meta


def base_metadata(memory: Memory) -> dict:
    return item_metadata(memory.id, memory.agent_id, memory.run_id, memory.created_at, memory.tags)


def window_starts(length: int) -> list[int]:
    """Where the passage windows of a text of `length` characters start (their vector ids name them)."""
    if length <= PASSAGE_WINDOW_CHARS:
        return [0]
    return list(range(0, length - PASSAGE_OVERLAP_CHARS, PASSAGE_WINDOW_CHARS - PASSAGE_OVERLAP_CHARS))


def passage_windows(text: str) -> list[tuple[int, str]]:
    return [(start, text[start : start + PASSAGE_WINDOW_CHARS]) for start in window_starts(len(text))]


def index_passages(memories: list[Memory], embedder: Embedder, vectors: VectorStore) -> None:
    by_team: dict[str, list[tuple[Memory, int, str]]] = {}
    for memory in memories:
        for start, window in passage_windows(memory.text):
            by_team.setdefault(memory.team, []).append((memory, start, window))
    for team, rows in by_team.items():
        embeddings = embedder.embed([window for _, _, window in rows])
        items = [
            VectorItem(
                id=f"p:{memory.id}:{start}",
                text=window,
                embedding=vec,
                metadata={**base_metadata(memory), "kind": "passage", "start": start},
            )
            for (memory, start, window), vec in zip(rows, embeddings)
        ]
        vectors.upsert(team, items)


def fact_id(team: str, norm: str) -> str:
    return "f:" + hashlib.sha256(f"{team}\x00{norm}".encode()).hexdigest()[:32]


@dataclass
class FactStoreResult:
    plan: FactPlan
    stored: int
    merged: int
    superseded: int


def _borrowed(plan: FactPlan, fact_id: str, fact: GroundedFact) -> None:
    """The earlier saves (given as context) a fact also rests on become its sources too."""
    plan.context_sources += [(fact_id, memory_id, (start, end)) for memory_id, start, end in fact.context]


def decide_facts(
    memory: Memory,
    facts: list[GroundedFact],
    *,
    journal: Journal,
    embedder: Embedder,
    vectors: VectorStore,
    near_duplicate: float,
) -> tuple[FactPlan, list[VectorItem]]:
    """Decide new/merged/superseded for each fact; writes nothing.

    Returns the plan (the caller commits it in one transaction, under `journal.deciding`) and the vectors of
    the new active facts, written only after that commit: a failed commit leaves no vector behind, and a
    stop after it leaves facts marked unindexed, which the indexer picks up.
    """
    plan = FactPlan()
    candidates: list[tuple[GroundedFact, str, str]] = []
    batch: set[str] = set()
    for fact in facts:
        norm = normalize(fact.text)
        if norm in batch:  # twice in one job (chunk overlap): one fact; a duplicate id would also break upsert
            continue
        batch.add(norm)
        exact = journal.active_facts_by_norm(memory.team, norm)
        if exact:
            plan.merged.append((exact[0].id, fact.spans))
            _borrowed(plan, exact[0].id, fact)
            continue
        candidates.append((fact, norm, shape(norm)))
    if not candidates:
        return plan, []
    embeddings = embedder.embed([fact.text for fact, _, _ in candidates])
    new_items: list[VectorItem] = []
    for (fact, norm, fact_shape), vec in zip(candidates, embeddings):
        new_id = fact_id(memory.team, norm)
        retired_row = journal.facts_by_ids(memory.team, [new_id]).get(new_id)
        if retired_row is not None and retired_row.superseded_by is not None:
            # a value that comes back (500 -> 700 -> 500) is a new fact; the old row keeps its history
            new_id = fact_id(memory.team, f"{norm}\x00{memory.id}")
        changed = [f for f in journal.active_facts_by_shape(memory.team, fact_shape) if f.id != new_id]
        if not changed and near_duplicate < 1.0:
            hits = vectors.query(memory.team, vec, 2, kind="fact")
            hit = next((h for h in hits if h.id != new_id and h.similarity >= near_duplicate), None)
            existing = journal.facts_by_ids(memory.team, [hit.id]).get(hit.id) if hit is not None else None
            if existing is not None and identifiers(existing.norm) != identifiers(norm):
                existing = None  # "ticket 1000" and "ticket 1010": look-alikes about different things
            if existing is not None and existing.superseded_by is None:
                if sorted(numbers(existing.text)) == sorted(numbers(fact.text)):
                    plan.merged.append((existing.id, fact.spans))
                    _borrowed(plan, existing.id, fact)
                    continue
                # the same statement with a changed number is an update, not a duplicate to fold away
                changed = [existing]
        if changed:
            older = [f for f in changed if f.created_at <= memory.created_at]
            newer = [f for f in changed if f.created_at > memory.created_at]
            plan.superseded += [(f.id, new_id) for f in older if (f.id, new_id) not in plan.superseded]
            if newer:  # a replayed or late job: this value is already out of date
                plan.born_superseded.append((new_id, newer[0].id))
                plan.new.append(NewFact(new_id, fact.text, norm, fact_shape, fact.spans))
                _borrowed(plan, new_id, fact)
                continue
        plan.new.append(NewFact(new_id, fact.text, norm, fact_shape, fact.spans))
        _borrowed(plan, new_id, fact)
        new_items.append(
            VectorItem(
                id=new_id, text=fact.text, embedding=np.asarray(vec), metadata={**base_metadata(memory), "kind": "fact"}
            )
        )
    return plan, new_items


def fact_items(rows: list[tuple[Fact, str | None]], embedder: Embedder) -> dict[str, list[VectorItem]]:
    """Vectors for facts already in the journal (left unindexed by a stop), by team."""
    embeddings = embedder.embed([fact.text for fact, _ in rows]) if rows else []
    out: dict[str, list[VectorItem]] = {}
    for (fact, run_id), vec in zip(rows, embeddings):
        meta = item_metadata(fact.memory_id, fact.agent_id, run_id, fact.created_at, fact.tags)
        out.setdefault(fact.team, []).append(
            VectorItem(id=fact.id, text=fact.text, embedding=np.asarray(vec), metadata={**meta, "kind": "fact"})
        )
    return out
