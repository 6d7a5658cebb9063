"""Recall: vector search and keyword search, fused by rank. Never touches the model.

Vector search (Chroma, one collection per team) finds paraphrases; keyword
search (SQLite FTS5) finds exact names, ids and numbers, and covers texts saved
a moment ago whose passage embedding is not written yet. Reciprocal-rank fusion
merges both without having to calibrate their scores against each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .text import STOPWORDS, normalize
from .storage.embedder import Embedder
from .storage.journal import Journal
from .storage.vectors import VectorStore, tag_key

RRF_K = 60.0
# A keyword hit weighs 0.5 plus the share of the query's words it contains: an item holding every
# word of the query (an id, a name, "email quota") outranks vector noise; a one-word overlap does not.
KEYWORD_BASE_WEIGHT = 0.5
SIBLING_SUPPORT = 0.5  # share of the scores of items from the same saved text added to an item
REPEAT_DECAY = 0.5  # each further item from an already-shown saved text keeps this share of its score


def _terms(text: str) -> set[str]:
    return {w[:5] for w in normalize(text).split() if len(w) > 1 and w not in STOPWORDS}


@dataclass
class RecallQuery:
    team: str
    query: str
    k: int = 10
    kinds: tuple[str, ...] = ("fact", "passage")
    agent_id: str | None = None  # only items of this agent
    tags: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None
    min_score: float | None = None


@dataclass
class Hit:
    key: str
    kind: str
    text: str
    memory_id: str
    fact_id: str | None
    agent_id: str = ""
    created_at: float = 0.0
    tags: list[str] = field(default_factory=list)
    similarity: float | None = None
    score: float = 0.0
    source_memory_ids: list[str] = field(default_factory=list)


def _where(q: RecallQuery) -> dict[str, Any] | None:
    clauses: list[dict[str, Any]] = []
    if q.agent_id:
        clauses.append({"agent_id": q.agent_id})
    for tag in q.tags:
        clauses.append({tag_key(tag): True})
    if q.since is not None:
        clauses.append({"created_at": {"$gte": q.since}})
    if q.until is not None:
        clauses.append({"created_at": {"$lte": q.until}})
    if not clauses:
        return None
    return clauses[0] if len(clauses) == 1 else {"$and": clauses}


def _tags_of(meta: dict[str, Any]) -> list[str]:
    return sorted(key[4:] for key, value in meta.items() if key.startswith("tag:") and value)


def recall(q: RecallQuery, *, journal: Journal, vectors: VectorStore, embedder: Embedder) -> list[Hit]:
    pool = max(q.k * 3, 30)
    hits: dict[str, Hit] = {}

    vector = embedder.embed_one(q.query)
    where = _where(q)
    for kind in q.kinds:  # one ranked list per kind: facts and passages don't crowd each other out
        rank = 0
        for vh in vectors.query(q.team, vector, pool, where=where, kind=kind):
            meta = vh.metadata
            memory_id = meta.get("memory_id", "")
            key = vh.id if kind == "fact" else "p:" + memory_id
            hit = hits.get(key)
            if hit is None:
                hit = hits[key] = Hit(
                    key=key, kind=kind, text=vh.text, memory_id=memory_id, fact_id=vh.id if kind == "fact" else None,
                    agent_id=meta.get("agent_id", ""), created_at=float(meta.get("created_at", 0.0)),
                    tags=_tags_of(meta), similarity=vh.similarity,
                )
            elif hit.similarity is not None and hit.similarity >= vh.similarity:
                continue  # another window of a passage already ranked
            hit.similarity = max(hit.similarity or -1.0, vh.similarity)
            hit.score += 1.0 / (RRF_K + rank + 1)
            rank += 1

    _drop_forgotten(hits, q.team, journal)
    query_terms = _terms(q.query)
    keyword = journal.keyword_search(q.team, q.query, kinds=set(q.kinds), limit=pool)
    memories = journal.get_many(q.team, list({h.memory_id for h in keyword if h.kind == "passage"}))
    facts = journal.facts_by_ids(q.team, [h.item_id for h in keyword if h.kind == "fact"])
    ranks = {"passage": 0, "fact": 0}
    for kh in keyword:
        if kh.kind == "passage":
            m = memories.get(kh.memory_id)
            if m is None:
                continue
            agent_id, created_at, tags, text = m.agent_id, m.created_at, m.tags, m.text
            key = "p:" + kh.memory_id
        else:
            f = facts.get(kh.item_id)
            if f is None:
                continue
            agent_id, created_at, tags, text = f.agent_id, f.created_at, f.tags, f.text
            key = kh.item_id
        if q.agent_id and agent_id != q.agent_id:
            continue
        if any(t not in tags for t in q.tags):
            continue
        if (q.since is not None and created_at < q.since) or (q.until is not None and created_at > q.until):
            continue
        rank = ranks[kh.kind]
        ranks[kh.kind] += 1
        hit = hits.get(key)
        if hit is None:
            if kh.kind == "passage" and len(text) > 1000:
                text = text[:1000]
            hit = hits[key] = Hit(
                key=key, kind=kh.kind, text=text, memory_id=kh.memory_id,
                fact_id=kh.item_id if kh.kind == "fact" else None, agent_id=agent_id, created_at=created_at,
                tags=list(tags),
            )
        coverage = len(query_terms & _terms(text)) / len(query_terms) if query_terms else 0.0
        hit.score += (KEYWORD_BASE_WEIGHT + coverage) / (RRF_K + rank + 1)

    candidates = list(hits.values())
    if q.min_score is not None:
        candidates = [h for h in candidates if h.similarity is not None and h.similarity >= q.min_score]
    ranked = diversify(candidates, q.k)
    sources = journal.fact_sources([h.fact_id for h in ranked if h.fact_id])
    for hit in ranked:
        if hit.fact_id:
            hit.source_memory_ids = list(dict.fromkeys(m for m, _, _ in sources.get(hit.fact_id, []))) or [hit.memory_id]
        else:
            hit.source_memory_ids = [hit.memory_id]
    return ranked


def _drop_forgotten(hits: dict[str, Hit], team: str, journal: Journal) -> None:
    """Vector hits are checked against the journal: a forgotten text or fact whose vector is not
    removed yet (a forget cut off by a crash, a job that raced it) is never returned. A surviving
    fact is named after a source that still exists."""
    passages = journal.get_many(team, list({h.memory_id for h in hits.values() if h.kind == "passage"}))
    facts = journal.facts_by_ids(team, [h.fact_id for h in hits.values() if h.fact_id])
    for key, hit in list(hits.items()):
        if hit.fact_id:
            fact = facts.get(hit.fact_id)
            if fact is None or fact.superseded_by is not None:
                del hits[key]
            else:
                hit.memory_id = fact.memory_id
        elif hit.memory_id not in passages:
            del hits[key]


def diversify(hits: list[Hit], k: int) -> list[Hit]:
    """Rank by evidence per source, then spread the top k over sources.

    A passage and the facts drawn from it are evidence for the same saved text: each item gets a share
    of its siblings' scores. Then items are picked greedily, and every further item from a text
    already shown keeps only part of its score, so the top k are not three rewordings of one note.
    """
    per_memory: dict[str, float] = {}
    for hit in hits:
        per_memory[hit.memory_id] = per_memory.get(hit.memory_id, 0.0) + hit.score
    for hit in hits:
        hit.score += SIBLING_SUPPORT * (per_memory[hit.memory_id] - hit.score)
    remaining = sorted(hits, key=lambda h: (h.score, h.similarity or 0.0), reverse=True)
    shown: dict[str, int] = {}
    picked: list[Hit] = []
    while remaining and len(picked) < k:
        best_index, best_score = 0, float("-inf")
        for index, hit in enumerate(remaining):
            effective = hit.score * REPEAT_DECAY ** shown.get(hit.memory_id, 0)
            if effective > best_score:
                best_index, best_score = index, effective
        hit = remaining.pop(best_index)
        hit.score = best_score
        shown[hit.memory_id] = shown.get(hit.memory_id, 0) + 1
        picked.append(hit)
    return picked


def to_epoch(value: datetime | None) -> float | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.timestamp()
