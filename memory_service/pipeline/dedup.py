"""Decide what a new fact is: new, the same as one already stored, or an update of one.

Deterministic before anything else: an exact (normalised) duplicate adds a source to the existing fact;
a fact with the same shape but different numbers supersedes the older one; a near-duplicate by cosine
merges into it (unless it names other identifiers, or its numbers changed: then it is an update).

Only among the facts the save may change (`storage.facts.write_scope`): a pinned key's save decides among
its agent's facts alone, and an unpinned save never touches another agent's pinned facts.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, NamedTuple

from ..embedding.embedder import Embedder
from ..extraction.grounding import GroundedFact, identifiers, normalize, numbers, shape
from ..storage.chroma_process import ChromaProcessFailed
from ..storage.database import storage_unavailable
from ..storage.journal import Fact, FactPlan, Journal, Memory, NewFact
from ..storage.vectors import VectorHit, VectorItem, VectorStore
from .vector_items import memory_fact_item

log = logging.getLogger(__name__)


def fact_id(team: str, norm: str, agent_id: str | None = None) -> str:
    """A fact's id is its team and normalised text: the same statement saved twice is one fact. A pinned
    save's fact also names its agent (`agent_id`): the same text held by another agent is another fact."""
    key = f"{team}\x00{norm}" if agent_id is None else f"{team}\x00{norm}\x00@{agent_id}"
    return "f:" + hashlib.sha256(key.encode()).hexdigest()[:32]


class _Candidate(NamedTuple):
    """A fact that is not an exact duplicate of a stored one: it is embedded and decided on."""

    fact: GroundedFact
    norm: str
    shape: str


def _borrowed(plan: FactPlan, fact_id: str, fact: GroundedFact) -> None:
    """The earlier saves (given as context) a fact also rests on become its sources too."""
    plan.context_sources += [(fact_id, memory_id, (start, end)) for memory_id, start, end in fact.context]


class Probe(NamedTuple):
    """A fact's embedding and the stored facts nearest to it, read before the team's deciding lock."""

    embedding: Any
    near: list[VectorHit]


def probe_facts(
    memory: Memory,
    facts: list[GroundedFact],
    *,
    journal: Journal,
    embedder: Embedder,
    vectors: VectorStore,
    near_duplicate: float,
) -> dict[str, Probe]:
    """The embeddings and near neighbours `decide_facts` needs, by normalised text; called BEFORE taking
    `journal.deciding`: a vector store that hangs (a full disk) must never hold the team's lock, behind
    which its forgets and decisions wait. A neighbour read here that is superseded or forgotten by the time
    the decision is made is checked against the journal then, so reading early changes nothing."""
    texts: dict[str, str] = {}
    for fact in facts:
        norm = normalize(fact.text)
        if norm not in texts and not journal.active_facts_by_norm(memory.team, norm, memory):
            texts[norm] = fact.text
    if not texts:
        return {}
    embeddings = embedder.embed(list(texts.values()))
    probes: dict[str, Probe] = {}
    for norm, vec in zip(texts, embeddings):
        near: list[VectorHit] = []
        if near_duplicate < 1.0:
            try:
                # a pinned save's neighbours are its agent's facts; an unpinned one's are checked in the journal
                where = {"agent_id": memory.agent_id} if memory.pinned else None
                near = vectors.query(memory.team, vec, 2, where, kind="fact")
            except Exception as exc:
                if not (isinstance(exc, ChromaProcessFailed) or storage_unavailable(exc)):
                    raise
                # the store is down or its disk full: decided on the journal alone (exact duplicates and
                # changed numbers still fold); a look-alike stays a fact of its own rather than be lost
                log.warning("job %s: no near-duplicate check, the vector store failed: %s", memory.id, exc)
        probes[norm] = Probe(vec, near)
    return probes


def decide_facts(
    memory: Memory,
    facts: list[GroundedFact],
    *,
    journal: Journal,
    embedder: Embedder,
    vectors: VectorStore | None = None,
    near_duplicate: float,
    probes: dict[str, Probe] | None = None,
) -> tuple[FactPlan, list[VectorItem]]:
    """Decide new/merged/superseded for each fact; writes nothing, and with `probes` (from `probe_facts`)
    calls no vector store (without them it reads `vectors` first: for callers that hold no lock).

    Returns the plan (the caller commits it in one transaction, under `journal.deciding`) and the vectors of
    the new active facts, written only after that commit: a failed commit leaves no vector behind, and a
    stop after it leaves facts marked unindexed, which the indexer picks up.
    """
    if probes is None:
        assert vectors is not None, "decide_facts needs probes or a vector store"
        probes = probe_facts(
            memory, facts, journal=journal, embedder=embedder, vectors=vectors, near_duplicate=near_duplicate
        )
    plan = FactPlan()
    candidates = _merge_exact_duplicates(memory, facts, journal, plan)
    unprobed = [c for c in candidates if c.norm not in probes]
    if unprobed:  # an exact duplicate when probed whose fact went since: embedded now, no neighbour read
        embedded = embedder.embed([c.fact.text for c in unprobed])
        probes = {**probes, **{c.norm: Probe(vec, []) for c, vec in zip(unprobed, embedded)}}
    new_items: list[VectorItem] = []
    for candidate in candidates:
        item = _decide_one(memory, candidate, probes[candidate.norm], plan, journal, near_duplicate)
        if item is not None:
            new_items.append(item)
    return plan, new_items


def _merge_exact_duplicates(
    memory: Memory, facts: list[GroundedFact], journal: Journal, plan: FactPlan
) -> list[_Candidate]:
    """Fold each fact whose normalised text an active fact already has into it; the rest are candidates."""
    candidates: list[_Candidate] = []
    batch: set[str] = set()
    for fact in facts:
        norm = normalize(fact.text)
        if norm in batch:  # twice in one job (chunk overlap): one fact; a duplicate id would also break upsert
            continue
        batch.add(norm)
        exact = journal.active_facts_by_norm(memory.team, norm, memory)
        if exact:
            plan.merged.append((exact[0].id, fact.spans))
            _borrowed(plan, exact[0].id, fact)
            continue
        candidates.append(_Candidate(fact, norm, shape(norm)))
    return candidates


def _decide_one(
    memory: Memory,
    candidate: _Candidate,
    probe: Probe,
    plan: FactPlan,
    journal: Journal,
    near_duplicate: float,
) -> VectorItem | None:
    """Add one candidate to the plan; returns its vector when it becomes a new active fact."""
    fact, norm, fact_shape = candidate
    vec = probe.embedding
    new_id = _new_fact_id(memory, norm, journal)
    changed = [f for f in journal.active_facts_by_shape(memory.team, fact_shape, memory) if f.id != new_id]
    if not changed and near_duplicate < 1.0:
        existing = _near_duplicate(memory, probe.near, new_id, norm, journal, near_duplicate)
        if existing is not None:
            if sorted(numbers(existing.text)) == sorted(numbers(fact.text)):
                plan.merged.append((existing.id, fact.spans))
                _borrowed(plan, existing.id, fact)
                return None
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
            return None
    plan.new.append(NewFact(new_id, fact.text, norm, fact_shape, fact.spans))
    _borrowed(plan, new_id, fact)
    return memory_fact_item(memory, new_id, fact.text, vec)


def _new_fact_id(memory: Memory, norm: str, journal: Journal) -> str:
    """The id a new fact gets: its text's (and its agent's, for a pinned save), unless a fact with that id
    was superseded already."""
    agent_id = memory.agent_id if memory.pinned else None
    new_id = fact_id(memory.team, norm, agent_id)
    retired_row = journal.facts_by_ids(memory.team, [new_id]).get(new_id)
    if retired_row is not None and retired_row.superseded_by is not None:
        # a value that comes back (500 -> 700 -> 500) is a new fact; the old row keeps its history
        new_id = fact_id(memory.team, f"{norm}\x00{memory.id}", agent_id)
    return new_id


def _near_duplicate(
    memory: Memory, hits: list[VectorHit], new_id: str, norm: str, journal: Journal, threshold: float
) -> Fact | None:
    """The active fact whose vector is at least `threshold` close and that names the same identifiers (one
    the save may change: another agent's pinned fact, or any other agent's for a pinned save, is left be)."""
    hit = next((h for h in hits if h.id != new_id and h.similarity >= threshold), None)
    existing = journal.facts_by_ids(memory.team, [hit.id], memory).get(hit.id) if hit is not None else None
    if existing is not None and identifiers(existing.norm) != identifiers(norm):
        return None  # "ticket 1000" and "ticket 1010": look-alikes about different things
    if existing is not None and existing.superseded_by is not None:
        return None
    return existing
