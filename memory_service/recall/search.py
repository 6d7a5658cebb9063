"""Recall: vector search and keyword search, fused by rank. Never touches the model.

Vector search (Chroma, one collection per team) finds paraphrases; keyword
search (SQLite FTS5) finds exact names, ids and numbers, and covers texts saved
a moment ago whose passage embedding is not written yet. Reciprocal-rank fusion
merges both without having to calibrate their scores against each other.
"""

from __future__ import annotations

import heapq
import math
import re
import threading
import unicodedata
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Executor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial

import numpy as np

from memory_service.contract.text import STOPWORDS, normalize
from memory_service.embedding.embedder import Embedder
from memory_service.pipeline.passages import PASSAGE_WINDOW_CHARS
from memory_service.recall import hubness
from memory_service.recall.filtered_vectors import FilteredVectors, VectorFilter
from memory_service.storage.consolidation import store_for
from memory_service.storage.journal import Journal
from memory_service.storage.occurred import occurred_times
from memory_service.storage.vectors import VectorStore

RRF_K = 60.0
# A keyword hit weighs 0.5 plus the share of the query's words it contains: an item holding every
# word of the query (an id, a name, "email quota") outranks vector noise; a one-word overlap does not.
KEYWORD_BASE_WEIGHT = 0.5
KEYWORD_KINDS = ("passage", "fact")  # the kinds with a keyword index (consolidated items: vector leg only)
SIBLING_SUPPORT = 0.5  # share of the scores of items from the same saved text added to an item
REPEAT_DECAY = 0.5  # each further item from an already-shown saved text keeps this share of its score
QUERY_CACHE_SIZE = 1024
# the vector leg takes this many times the pool by cosine, then keeps the pool's best once each item's
# hubness is discounted (`hubness`): a specific answer just below a generic item's cosine moves up
HUB_CANDIDATES_FACTOR = 2
# a window on occurred_at is applied after both legs (they index created_at): they look this much deeper
OCCURRED_POOL_FACTOR = 4
_QUERY_CACHE: weakref.WeakKeyDictionary[Embedder, OrderedDict[str, np.ndarray]] = weakref.WeakKeyDictionary()
_QUERY_CACHE_LOCK = threading.Lock()


def _stem(word: str) -> str | None:
    """A normalized word's stem (its first five letters), or None for a stopword or a single character."""
    return word[:5] if len(word) > 1 and word not in STOPWORDS else None


def _terms(text: str) -> frozenset[str]:
    """Word stems of a text: the content words a query asks for."""
    return frozenset(s for s in map(_stem, normalize(text).split()) if s is not None)


class QueryWords:
    """Which of one query's word stems a text holds, found by one regex per recall.

    The stems `_terms` would find in the text, without splitting every candidate into words: a recall
    looks at ~100 texts, and stemming each cost ~10 us (1.15 ms for 120 texts, against 0.46 ms searching
    them for the query's few stems).
    """

    def __init__(self, query: str) -> None:
        self.terms = _terms(query)
        # a word (as `normalize` splits them) that starts with one of the stems; checked whole below
        stems = "|".join(sorted((re.escape(t) for t in self.terms), key=len, reverse=True))
        self._pattern = re.compile(rf"(?<![0-9a-z])(?:{stems})[0-9a-z]*(?:'[a-z]+)?") if stems else None

    def held(self, text: str) -> frozenset[str]:
        if self._pattern is None:
            return frozenset()
        lowered = (text if text.isascii() else unicodedata.normalize("NFKC", text).replace("’", "'")).lower()
        return frozenset(s for s in map(_stem, self._pattern.findall(lowered)) if s in self.terms)


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
    min_score: float | None = None
    time_field: str = "created_at"  # what since/until compare: the save time, or "occurred_at"


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


def _embed_query(embedder: Embedder, text: str) -> np.ndarray:
    """The query's vector, from a small LRU by text: agents repeat queries, and embedding is ~5 ms."""
    with _QUERY_CACHE_LOCK:
        cache = _QUERY_CACHE.get(embedder)
        if cache is None:
            cache = _QUERY_CACHE[embedder] = OrderedDict()
        vector = cache.get(text)
        if vector is not None:
            cache.move_to_end(text)
            return vector
    vector = embedder.embed_one(text)
    vector.flags.writeable = False  # shared by every recall of the same text
    with _QUERY_CACHE_LOCK:
        cache[text] = vector
        while len(cache) > QUERY_CACHE_SIZE:
            cache.popitem(last=False)
    return vector


@dataclass
class _Row:
    """What recall shows of a fact or a saved text, read from the journal in one batch per kind."""

    memory_id: str
    agent_id: str
    created_at: float
    tags: Sequence[str]
    text: str
    occurred_at: float | None = None  # read only for a window on occurred_at


def _passes(row: _Row, q: RecallQuery) -> bool:
    """The filters again on the journal's row: a stale cache can never widen what a filter lets through."""
    if q.agent_id and row.agent_id != q.agent_id:
        return False
    if any(t not in row.tags for t in q.tags):
        return False
    when = row.created_at
    if q.time_field == "occurred_at":
        when = row.occurred_at if row.occurred_at is not None else row.created_at
    return not ((q.since is not None and when < q.since) or (q.until is not None and when > q.until))


def recall(
    q: RecallQuery,
    *,
    journal: Journal,
    vectors: VectorStore,
    embedder: Embedder,
    search: FilteredVectors,
    legs: Executor | None = None,
) -> list[Hit]:
    """Vector and keyword search with the filters inside each, fused by rank; blocking (one thread hop).

    With `legs`, the keyword leg runs there, one task per kind, while this thread embeds the query and
    searches vectors: all spend their time outside the GIL (SQLite, onnxruntime), so they overlap.
    """
    by_occurred = q.time_field == "occurred_at" and (q.since is not None or q.until is not None)
    since, until = (None, None) if by_occurred else (q.since, q.until)
    pool = max(q.k * 3, 30) * (OCCURRED_POOL_FACTOR if by_occurred else 1)
    flt = VectorFilter(q.agent_id, q.tags, since, until)
    keyword_legs = [
        partial(
            journal.keyword_search,
            q.team,
            q.query,
            kinds={kind},
            limit=pool,
            agent_id=q.agent_id,
            tags=q.tags,
            since=since,
            until=until,
        )
        for kind in KEYWORD_KINDS
        if kind in q.kinds
    ]
    pending = [legs.submit(leg) for leg in keyword_legs] if legs is not None else []
    try:
        vector = _embed_query(embedder, q.query)
        found = {}
        for kind in q.kinds:
            near = search.search(q.team, kind, vector, pool * HUB_CANDIDATES_FACTOR, flt)
            found[kind] = hubness.rerank(near, search.hubness(q.team, kind, [i for i, _ in near]), pool)
        # every item either leg found is read from the journal (a forgotten text or fact, its vector not
        # removed yet, is simply not there): the vector leg's first, while the keyword legs still run
        fact_ids = {i for i, _ in found.get("fact", [])}
        memory_ids = {_passage_memory(i) for i, _ in found.get("passage", [])}
        facts = journal.fact_recall_rows(q.team, list(fact_ids))
        texts = journal.recall_rows(q.team, list(memory_ids))
    except BaseException:
        wait(pending)  # not left running behind an error: each holds a database connection
        raise
    if pending:
        wait(pending)  # every leg done before any error is raised: no connection left in use
        keyword = [hit for leg in pending for hit in leg.result()]
    else:
        keyword = [hit for leg in keyword_legs for hit in leg()]
    # what the keyword legs added: they read it with the match, from the same journal rows
    for h in keyword:
        if h.kind == "fact":
            facts.setdefault(h.item_id, (h.memory_id, h.agent_id, h.created_at, h.tags, h.text))
        else:
            texts.setdefault(h.memory_id, (h.agent_id, h.created_at, h.tags, h.text))
    rows: dict[str, _Row] = {
        fid: _Row(memory_id, agent_id, created_at, tags, text)
        for fid, (memory_id, agent_id, created_at, tags, text) in facts.items()
    }
    # consolidated items: vector leg only; a dropped item (a source forgotten) has no row and is not shown
    items = store_for(journal).items_by_ids(q.team, [i for i, _ in found.get("consolidated", [])])
    for iid, item in items.items():
        rows[iid] = _Row(item.memory_id, item.agent_id, item.created_at, item.tags, item.text, item.occurred_at)
    for mid, (agent_id, created_at, tags, text) in texts.items():
        rows["p:" + mid] = _Row(mid, agent_id, created_at, tags, text)
    if by_occurred:
        occurred = occurred_times(journal, q.team, [row.memory_id for key, row in rows.items() if key not in items])
        for key, row in rows.items():
            if key not in items:
                row.occurred_at = occurred.get(row.memory_id)

    hits: dict[str, Hit] = {}
    for kind, ranked in found.items():  # one ranked list per kind: facts and passages don't crowd each other out
        rank = 0
        for item_id, similarity in ranked:
            key = "p:" + _passage_memory(item_id) if kind == "passage" else item_id
            row = rows.get(key)
            if row is None or not _passes(row, q):
                continue
            hit = hits.get(key)
            if hit is None:
                text = row.text
                if kind == "passage":
                    start = _window_start(item_id)
                    text = text[start : start + PASSAGE_WINDOW_CHARS]
                hit = hits[key] = Hit(
                    key=key,
                    kind=kind,
                    text=text,
                    memory_id=row.memory_id,
                    fact_id=None if kind == "passage" else item_id,
                    agent_id=row.agent_id,
                    created_at=row.created_at,
                    tags=list(row.tags),
                    similarity=similarity,
                )
            elif hit.similarity is not None and hit.similarity >= similarity:
                continue  # another window of a passage already ranked
            hit.similarity = max(hit.similarity or -1.0, similarity)
            hit.score += 1.0 / (RRF_K + rank + 1)
            rank += 1

    words = QueryWords(q.query)
    # the query words each candidate holds, found once: in a long text, its head (a word's spread, cheaply)
    held = {key: words.held(row.text[:PASSAGE_WINDOW_CHARS]) for key, row in rows.items()}
    weights = _term_weights(words.terms, list(held.values()))
    ranks = {"passage": 0, "fact": 0}
    for kh in keyword:
        key = "p:" + kh.memory_id if kh.kind == "passage" else kh.item_id
        row = rows.get(key)
        if row is None or not _passes(row, q):
            continue
        rank = ranks[kh.kind]
        ranks[kh.kind] += 1
        hit = hits.get(key)
        text = row.text
        if hit is None:
            if kh.kind == "passage":
                text = text[:PASSAGE_WINDOW_CHARS]
            hit = hits[key] = Hit(
                key=key,
                kind=kh.kind,
                text=text,
                memory_id=row.memory_id,
                fact_id=kh.item_id if kh.kind == "fact" else None,
                agent_id=row.agent_id,
                created_at=row.created_at,
                tags=list(row.tags),
            )
        coverage = sum(weights[t] for t in (held[key] if len(text) <= PASSAGE_WINDOW_CHARS else words.held(text)))
        hit.score += (KEYWORD_BASE_WEIGHT + coverage) / (RRF_K + rank + 1)

    candidates = list(hits.values())
    if q.min_score is not None:
        candidates = [h for h in candidates if h.similarity is not None and h.similarity >= q.min_score]
    ranked = diversify(candidates, q.k)
    sources = journal.fact_sources([h.fact_id for h in ranked if h.kind == "fact" and h.fact_id])
    for hit in ranked:
        if hit.kind == "consolidated":
            hit.source_memory_ids = items[hit.key].memory_ids
        elif hit.fact_id:
            hit.source_memory_ids = list(dict.fromkeys(m for m, _, _ in sources.get(hit.fact_id, []))) or [
                hit.memory_id
            ]
        else:
            hit.source_memory_ids = [hit.memory_id]
    return ranked


def _passage_memory(vector_id: str) -> str:
    """`p:<memory id>:<window start>` -> the memory id."""
    return vector_id[2:].rsplit(":", 1)[0]


def _window_start(vector_id: str) -> int:
    try:
        return int(vector_id.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return 0


def _term_weights(query_terms: frozenset[str], held: list[frozenset[str]]) -> dict[str, float]:
    """Each query word's share of the query's weight, by how rare it is among the items both legs found
    (`held`: the query words each of them holds).

    A word most candidates hold (in a chat, the name of the person asked about) says little about which
    one answers; the rarer words do. Inverse frequency among this recall's candidates, so the weights
    follow the team's own words and cost nothing to keep."""
    if not query_terms:
        return {}
    n = len(held)
    raw = {t: math.log((n + 1) / (sum(1 for h in held if t in h) + 0.5)) for t in query_terms}
    total = sum(raw.values())
    return {t: w / total for t, w in raw.items()} if total > 0 else {t: 1.0 / len(raw) for t in raw}


def diversify(hits: list[Hit], k: int) -> list[Hit]:
    """Rank by evidence per source, then spread the top k over sources.

    A passage and the facts drawn from it are evidence for the same saved text: each item gets a share
    of its siblings' scores. Then items are picked greedily, and every further item from a text
    already shown keeps only part of its score, so the top k are not three rewordings of one note.
    The greedy pick is lazy (a heap whose stale entries are re-scored when they come up): scores are
    positive, so a repeat only lowers one, and a full scan per pick cost ~1 ms a recall.
    """
    per_memory: dict[str, float] = {}
    for hit in hits:
        per_memory[hit.memory_id] = per_memory.get(hit.memory_id, 0.0) + hit.score
    for hit in hits:
        hit.score += SIBLING_SUPPORT * (per_memory[hit.memory_id] - hit.score)
    ordered = sorted(hits, key=lambda h: (h.score, h.similarity or 0.0), reverse=True)
    # (-effective score, position in `ordered`: ties go to the earlier, the repeats seen when scored)
    heap = [(-hit.score, position, 0) for position, hit in enumerate(ordered)]
    shown: dict[str, int] = {}
    picked: list[Hit] = []
    while heap and len(picked) < k:
        negative, position, seen = heapq.heappop(heap)
        hit = ordered[position]
        repeats = shown.get(hit.memory_id, 0)
        if repeats != seen:  # another item of its text was picked since: score it again
            heapq.heappush(heap, (-(hit.score * REPEAT_DECAY**repeats), position, repeats))
            continue
        hit.score = -negative
        shown[hit.memory_id] = repeats + 1
        picked.append(hit)
    return picked


def to_epoch(value: datetime | None) -> float | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()
