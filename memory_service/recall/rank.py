"""How the two legs' results become one ranked list: reciprocal-rank fusion, keyword weighting, spreading.

Each leg ranks its own candidates; an item scores 1 / (RRF_K + rank) per list it is in, so the legs'
scores never have to be calibrated against each other. Facts and passages are ranked in lists of their
own (one kind does not crowd the other out). Then `diversify` lets siblings (a passage and the facts drawn
from the same saved text) support each other and spreads the top k over saved texts.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..pipeline.passages import PASSAGE_WINDOW_CHARS
from ..storage.records import KeywordHit
from .words import QueryWords, term_weights

RRF_K = 60.0
# A keyword hit weighs 0.5 plus the share of the query's words it contains: an item holding every
# word of the query (an id, a name, "email quota") outranks vector noise; a one-word overlap does not.
KEYWORD_BASE_WEIGHT = 0.5
SIBLING_SUPPORT = 0.5  # share of the scores of items from the same saved text added to an item
REPEAT_DECAY = 0.5  # each further item from an already-shown saved text keeps this share of its score

Found = list[tuple[str, float]]  # a vector leg's (item id, cosine similarity), best first


@dataclass
class ItemRow:
    """What recall shows of a fact, a saved text or a consolidated item, as the journal has it now."""

    memory_id: str
    agent_id: str
    created_at: float
    tags: Sequence[str]
    text: str
    occurred_at: float | None = None  # read only for a window on occurred_at


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
    coverage: float | None = None  # share of the query's word weight it holds, when the keyword leg found it
    source_memory_ids: list[str] = field(default_factory=list)


def passage_memory(vector_id: str) -> str:
    """`p:<memory id>:<window start>` -> the memory id."""
    return vector_id[2:].rsplit(":", 1)[0]


def window_start(vector_id: str) -> int:
    try:
        return int(vector_id.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return 0


def _new_hit(key: str, kind: str, text: str, row: ItemRow, fact_id: str | None) -> Hit:
    return Hit(
        key=key,
        kind=kind,
        text=text,
        memory_id=row.memory_id,
        fact_id=fact_id,
        agent_id=row.agent_id,
        created_at=row.created_at,
        tags=list(row.tags),
    )


def add_vector_ranks(hits: dict[str, Hit], found: dict[str, Found], shown: dict[str, ItemRow]) -> None:
    """Score the vector leg's lists into `hits`: a saved text counts once, by its best window so far.
    `shown`: the rows the query's filters let through (by hit key: a passage's is `p:<memory id>`)."""
    for kind, ranked in found.items():
        rank = 0
        for item_id, similarity in ranked:
            key = "p:" + passage_memory(item_id) if kind == "passage" else item_id
            row = shown.get(key)
            if row is None:
                continue
            hit = hits.get(key)
            if hit is None:
                text = row.text
                if kind == "passage":
                    start = window_start(item_id)
                    text = text[start : start + PASSAGE_WINDOW_CHARS]
                hit = hits[key] = _new_hit(key, kind, text, row, None if kind == "passage" else item_id)
                hit.similarity = similarity
            elif hit.similarity is not None and hit.similarity >= similarity:
                continue  # another window of a passage already ranked
            hit.similarity = max(hit.similarity or -1.0, similarity)
            hit.score += 1.0 / (RRF_K + rank + 1)
            rank += 1


class KeywordWeights:
    """What a keyword hit adds beyond its rank: the weights (`term_weights`) of the query words it holds.

    The words each candidate holds are found once, over every row either leg found (filtered out or not):
    in a long text, in its head (a word's spread, cheaply)."""

    def __init__(self, query: str, rows: dict[str, ItemRow]) -> None:
        self.words = QueryWords(query)
        self.held = {key: self.words.held(row.text[:PASSAGE_WINDOW_CHARS]) for key, row in rows.items()}
        self.weights = term_weights(self.words.terms, list(self.held.values()))

    def coverage(self, key: str, text: str) -> float:
        held = self.held[key] if len(text) <= PASSAGE_WINDOW_CHARS else self.words.held(text)
        return sum(self.weights[t] for t in held)


def add_keyword_ranks(
    hits: dict[str, Hit], keyword: list[KeywordHit], shown: dict[str, ItemRow], weights: KeywordWeights
) -> None:
    """Score the keyword leg's hits into `hits`, ranked per kind, each by KEYWORD_BASE_WEIGHT plus its coverage."""
    ranks = {"passage": 0, "fact": 0}
    for kh in keyword:
        key = "p:" + kh.memory_id if kh.kind == "passage" else kh.item_id
        row = shown.get(key)
        if row is None:
            continue
        rank = ranks[kh.kind]
        ranks[kh.kind] += 1
        hit = hits.get(key)
        text = row.text
        if hit is None:
            if kh.kind == "passage":
                text = text[:PASSAGE_WINDOW_CHARS]
            hit = hits[key] = _new_hit(key, kh.kind, text, row, kh.item_id if kh.kind == "fact" else None)
        coverage = weights.coverage(key, text)
        hit.coverage = max(hit.coverage or 0.0, coverage)
        hit.score += (KEYWORD_BASE_WEIGHT + coverage) / (RRF_K + rank + 1)


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
