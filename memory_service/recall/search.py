"""Recall: vector search and keyword search, fused by rank. Never touches the model.

Vector search (Chroma, one collection per team) finds paraphrases; keyword
search (SQLite FTS5) finds exact names, ids and numbers, and covers texts saved
a moment ago whose passage embedding is not written yet. Reciprocal-rank fusion
(`rank`) merges both without having to calibrate their scores against each other. The relevance floor
(`floor`) then leaves out what does not bear on the question, before the top k are picked.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial

import numpy as np

from ..embedding.embedder import Embedder
from ..storage.consolidation import Item, store_for
from ..storage.journal import Journal
from ..storage.occurred import occurred_times
from ..storage.records import KeywordHit
from .floor import DEFAULT_FLOOR, Cut
from .floor import note as floor_note
from .query_embeddings import QueryEmbeddings
from .rank import (
    Found,
    Hit,
    ItemRow,
    KeywordWeights,
    add_keyword_ranks,
    add_vector_ranks,
    diversify,
    passage_memory,
)
from .vectors import FilteredVectors, VectorFilter, rerank_by_hubness
from .when import TimeQuestion, boost, item_dates

__all__ = ["Hit", "RecallQuery", "Recalled", "recall", "to_epoch"]

KEYWORD_KINDS = ("passage", "fact")  # the kinds with a keyword index (consolidated items: vector leg only)
# the vector leg takes this many times the pool by cosine, then keeps the pool's best once each item's
# hubness is discounted (`vectors.hubness`): a specific answer just below a generic item's cosine moves up
HUB_CANDIDATES_FACTOR = 2
# a window on occurred_at is applied after both legs (they index created_at): they look this much deeper
OCCURRED_POOL_FACTOR = 4

KeywordLeg = Callable[[], list[KeywordHit]]


@dataclass
class RecallQuery:
    team: str
    query: str
    k: int = 10
    kinds: tuple[str, ...] = ("fact", "passage")  # "consolidated" only when asked for (see the README)
    agent_id: str | None = None  # only items of this agent
    tags: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None
    min_score: float | None = None  # the caller's own cut on similarity (-1: none); None: the relevance floor
    time_field: str = "created_at"  # what since/until compare: the save time, or "occurred_at"
    as_of: float | None = None  # when the question is asked: "last week" counts from it (None: now)


@dataclass(frozen=True)
class Recalled:
    """A recall's hits, best first, and how many more the relevance floor kept out of the top k."""

    hits: list[Hit]
    below_floor: int = 0
    floor: float = DEFAULT_FLOOR

    @property
    def note(self) -> str | None:
        """One line for the answer when the floor dropped hits, else None."""
        return floor_note(self.below_floor, len(self.hits), self.floor) if self.below_floor > 0 else None


@dataclass(frozen=True)
class _Legs:
    """What both legs search: how many candidates each keeps, and the window they apply (on created_at,
    the time they index; a window on occurred_at is applied after them, so they look deeper instead)."""

    by_occurred: bool
    since: float | None
    until: float | None
    pool: int

    @classmethod
    def of(cls, q: RecallQuery) -> _Legs:
        by_occurred = q.time_field == "occurred_at" and (q.since is not None or q.until is not None)
        since, until = (None, None) if by_occurred else (q.since, q.until)
        pool = max(q.k * 3, 30) * (OCCURRED_POOL_FACTOR if by_occurred else 1)
        return cls(by_occurred, since, until, pool)


def recall(
    q: RecallQuery,
    *,
    journal: Journal,
    embedder: Embedder,
    search: FilteredVectors,
    legs: Executor | None = None,
    queries: QueryEmbeddings | None = None,
    floor: float = DEFAULT_FLOOR,
) -> Recalled:
    """Vector and keyword search with the filters inside each, fused by rank; blocking (one thread hop).

    With `legs`, the keyword leg runs there, one task per kind, while this thread embeds the query and
    searches vectors: all spend their time outside the GIL (SQLite, onnxruntime), so they overlap.
    `queries`: the service's cache of query vectors (of `embedder`); without it, this recall makes its own.
    `floor`: the relevance floor (`floor`) when the query sets no min_score of its own.
    """
    plan = _Legs.of(q)
    keyword_legs = _keyword_legs(q, plan, journal)
    pending = [legs.submit(leg) for leg in keyword_legs] if legs is not None else []
    try:
        vector = (queries if queries is not None else QueryEmbeddings(embedder)).vector(q.team, q.query)
        found = _vector_leg(q, plan, vector, search)
        # every item either leg found is read from the journal (a forgotten text or fact, its vector not
        # removed yet, is simply not there): the vector leg's first, while the keyword legs still run
        fact_rows, text_rows = _read_found(q.team, journal, found)
    except BaseException:
        wait(pending)  # not left running behind an error: each holds a database connection
        raise
    keyword = _keyword_results(pending, keyword_legs)
    # consolidated items: vector leg only; a dropped item (a source forgotten) has no row and is not shown
    consolidated = store_for(journal).items_by_ids(q.team, [i for i, _ in found.get("consolidated", [])])
    rows = _candidate_rows(fact_rows, text_rows, keyword, consolidated)
    question = TimeQuestion.of(q.query, q.as_of)
    if plan.by_occurred or question.windows:
        _read_occurred(journal, q.team, rows, consolidated)
    hits = _fuse(q, found, keyword, rows)
    if question.matters:
        _time_boost(hits, rows, question)
    candidates = list(hits.values())
    cut = Cut.of(q.min_score, floor)
    ranked = diversify([h for h in candidates if cut.keeps(h)], q.k)
    _attach_sources(ranked, journal, consolidated)
    # the hits the floor kept out of the k the caller asked for (a caller's own min_score is no news to it)
    dropped = min(q.k, len(candidates)) - len(ranked) if cut.is_floor and not cut.off else 0
    return Recalled(ranked, dropped, cut.threshold)


def _keyword_legs(q: RecallQuery, plan: _Legs, journal: Journal) -> list[KeywordLeg]:
    """One keyword search per kind asked for, the filters inside it."""
    return [
        partial(
            journal.keyword_search,
            q.team,
            q.query,
            kinds={kind},
            limit=plan.pool,
            agent_id=q.agent_id,
            tags=q.tags,
            since=plan.since,
            until=plan.until,
        )
        for kind in KEYWORD_KINDS
        if kind in q.kinds
    ]


def _keyword_results(pending: list[Future[list[KeywordHit]]], keyword_legs: list[KeywordLeg]) -> list[KeywordHit]:
    """The keyword hits, legs in order: waited for when they ran beside the vector leg, else run here."""
    if not pending:
        return [hit for leg in keyword_legs for hit in leg()]
    wait(pending)  # every leg done before any error is raised: no connection left in use
    return [hit for leg in pending for hit in leg.result()]


def _vector_leg(q: RecallQuery, plan: _Legs, vector: np.ndarray, search: FilteredVectors) -> dict[str, Found]:
    """Per kind, the pool's nearest that pass the filters, hubs discounted (`rerank_by_hubness`)."""
    flt = VectorFilter(q.agent_id, q.tags, plan.since, plan.until)
    found = {}
    for kind in q.kinds:
        near = search.search(q.team, kind, vector, plan.pool * HUB_CANDIDATES_FACTOR, flt)
        found[kind] = rerank_by_hubness(near, search.hubness(q.team, kind, [i for i, _ in near]), plan.pool)
    return found


def _read_found(team: str, journal: Journal, found: dict[str, Found]) -> tuple[dict[str, ItemRow], dict[str, ItemRow]]:
    """The facts and saved texts the vector leg found, as the journal has them: by fact id, by `p:<memory id>`."""
    fact_ids = {i for i, _ in found.get("fact", [])}
    memory_ids = {passage_memory(i) for i, _ in found.get("passage", [])}
    facts = {
        fid: ItemRow(memory_id, agent_id, created_at, tags, text)
        for fid, (memory_id, agent_id, created_at, tags, text) in journal.fact_recall_rows(team, list(fact_ids)).items()
    }
    texts = {
        "p:" + mid: ItemRow(mid, agent_id, created_at, tags, text)
        for mid, (agent_id, created_at, tags, text) in journal.recall_rows(team, list(memory_ids)).items()
    }
    return facts, texts


def _candidate_rows(
    facts: dict[str, ItemRow], texts: dict[str, ItemRow], keyword: list[KeywordHit], consolidated: dict[str, Item]
) -> dict[str, ItemRow]:
    """Every candidate's row by hit key: what the keyword legs added they read with the match, from the
    same journal rows."""
    for h in keyword:
        row = ItemRow(h.memory_id, h.agent_id, h.created_at, h.tags, h.text)
        if h.kind == "fact":
            facts.setdefault(h.item_id, row)
        else:
            texts.setdefault("p:" + h.memory_id, row)
    items = {
        iid: ItemRow(item.memory_id, item.agent_id, item.created_at, item.tags, item.text, item.occurred_at)
        for iid, item in consolidated.items()
    }
    return {**facts, **items, **texts}


def _read_occurred(journal: Journal, team: str, rows: dict[str, ItemRow], consolidated: dict[str, Item]) -> None:
    """Each fact's and text's occurred_at, for a window on it (a consolidated item carries its own)."""
    of_memories = {key: row for key, row in rows.items() if key not in consolidated}
    occurred = occurred_times(journal, team, [row.memory_id for row in of_memories.values()])
    for row in of_memories.values():
        row.occurred_at = occurred.get(row.memory_id)


def _passes(row: ItemRow, q: RecallQuery) -> bool:
    """The filters again on the journal's row: a stale cache can never widen what a filter lets through."""
    if q.agent_id and row.agent_id != q.agent_id:
        return False
    if any(t not in row.tags for t in q.tags):
        return False
    when = row.created_at
    if q.time_field == "occurred_at":
        when = row.occurred_at if row.occurred_at is not None else row.created_at
    return not ((q.since is not None and when < q.since) or (q.until is not None and when > q.until))


def _fuse(
    q: RecallQuery, found: dict[str, Found], keyword: list[KeywordHit], rows: dict[str, ItemRow]
) -> dict[str, Hit]:
    """Both legs' ranks fused into one hit per item the filters let through (`rank`)."""
    weights = KeywordWeights(q.query, rows)  # over every candidate, filtered out or not
    shown = {key: row for key, row in rows.items() if _passes(row, q)}
    hits: dict[str, Hit] = {}
    add_vector_ranks(hits, found, shown)
    add_keyword_ranks(hits, keyword, shown, weights)
    return hits


def _time_boost(hits: dict[str, Hit], rows: dict[str, ItemRow], question: TimeQuestion) -> None:
    """A question that names dates or asks "when": each item's score times its factor (`when.boost`)."""
    keys = list(hits)
    factors = boost(question, (item_dates(rows[key].text, rows[key].occurred_at) for key in keys))
    for key, factor in zip(keys, factors, strict=True):
        hits[key].score *= factor


def _attach_sources(ranked: list[Hit], journal: Journal, consolidated: dict[str, Item]) -> None:
    """Each hit's source texts: a fact's (deduplicated facts have several), a consolidated item's, a passage's own."""
    sources = journal.fact_sources([h.fact_id for h in ranked if h.kind == "fact" and h.fact_id])
    for hit in ranked:
        if hit.kind == "consolidated":
            hit.source_memory_ids = consolidated[hit.key].memory_ids
        elif hit.fact_id:
            from_sources = dict.fromkeys(m for m, _, _ in sources.get(hit.fact_id, []))
            hit.source_memory_ids = list(from_sources) or [hit.memory_id]
        else:
            hit.source_memory_ids = [hit.memory_id]


def to_epoch(value: datetime | None) -> float | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()
