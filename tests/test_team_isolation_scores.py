"""Team A's recall answer may not depend on what another team stores: not its ids, order or any score.

Tested like an attacker would: team A's full answer (ids, order, every score, exactly) for a query is taken,
team B saves texts and facts holding the query's words (enough to change any shared word count, row count or
length average), and A's answer is taken again; then B forgets everything and it is taken once more. Real
SQLite and Chroma in a temporary directory; a deterministic bag-of-words embedder stands in for the model.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from memory_service.contract.limits import MAX_QUERY_WORDS
from memory_service.pipeline.forgetting import Forgetter
from memory_service.pipeline.passages import index_passages
from memory_service.recall.floor import OFF
from memory_service.recall.search import RecallQuery, recall
from memory_service.recall.vectors import FilteredVectors
from memory_service.storage.consolidation import ConsolidationStore
from memory_service.storage.forget import mark_forgotten, pending, purge
from memory_service.storage.journal import Journal
from memory_service.storage.keyword import keyword_words
from memory_service.storage.vectors import VectorStore
from tests.word_embedder import WordEmbedder

A, B = "team-a", "team-b"


class Stores:
    def __init__(self, root: Path) -> None:
        self.journal = Journal(root / "journal.sqlite3")
        self.vectors = VectorStore(root / "chroma")
        self.embedder = WordEmbedder(dimensions=64)
        self.search = FilteredVectors(self.journal, self.vectors)
        self.facts = 0

    def save(self, team: str, text: str, agent: str, *, index: bool = True, now: float = 1000.0) -> Any:
        memory, _ = self.journal.insert(
            team=team,
            agent_id=agent,
            text=text,
            run_id=None,
            tags=["t"],
            metadata={},
            idempotency_key=None,
            budget_s=60.0,
            now=now,
        )
        if index:
            index_passages([memory], self.embedder, self.vectors)
            self.journal.mark_indexed([memory.id])
        return memory

    def fact(self, team: str, memory: Any, text: str) -> None:
        """A fact row as the worker stores one (its keyword index is kept by the journal's trigger)."""
        self.facts += 1
        with self.journal.transaction() as conn:
            conn.execute(
                "INSERT INTO facts (id, team, agent_id, memory_id, text, norm, shape, tags, created_at) "
                "VALUES (?,?,?,?,?,?,?,?,?)",
                (f"f{self.facts}", team, memory.agent_id, memory.id, text, text.lower(), text, '["t"]', 1000.0),
            )
            conn.execute(
                "INSERT INTO fact_sources (fact_id, memory_id, span_start, span_end, added_at) VALUES (?,?,0,1,0)",
                (f"f{self.facts}", memory.id),
            )

    def answer(self, query: str, **kw: Any) -> list[tuple[str, str, float, float | None]]:
        hits = recall(
            RecallQuery(team=A, query=query, k=30, **kw),
            journal=self.journal,
            embedder=self.embedder,
            search=self.search,
            floor=OFF,  # every hit's score, however weak (the floor is a cosine: per team by construction)
        ).hits
        return [(h.key, h.kind, h.score, h.similarity) for h in hits]


@pytest.fixture
def stores(tmp_path: Path) -> Any:
    s = Stores(tmp_path)
    yield s
    s.journal.close()


QUERIES = (
    "zorblax launch review with the vendor",
    "who owns the quasar billing migration",
    "zorblax",
)


def _team_a(stores: Stores) -> None:
    topics = ["launch review", "billing migration", "vendor call", "office move", "hiring plan"]
    for i in range(40):
        topic = topics[i % len(topics)]
        extra = " zorblax" if i % 7 == 0 else ""
        agent = "ann" if i % 3 else "bob"
        m = stores.save(A, f"note {i} about the {topic}{extra} with quasar team owner {i % 4}", agent, now=1000.0 + i)
        if i % 4 == 0:
            stores.fact(A, m, f"The {topic} is owned by person {i % 4}{extra}")


def _team_b(stores: Stores) -> list[str]:
    ids = []
    for i in range(1200):
        # more matches than every bound, newer than A's rows, words repeated, long and short texts
        text = "zorblax " * (1 + i % 5) + "launch review vendor quasar billing migration owns " + "x " * (i % 30)
        m = stores.save(B, text, "eve", index=i % 10 == 0, now=5000.0 + i)
        ids.append(m.id)
        if i % 3 == 0:
            stores.fact(B, m, f"zorblax launch {i} review quasar billing")
    return ids


def _answers(stores: Stores) -> dict[str, Any]:
    out = {}
    for query in QUERIES:
        out[query] = stores.answer(query)
        out[query + " /ann"] = stores.answer(query, agent_id="ann")
        out[query + " /since"] = stores.answer(query, since=1010.0)
        out[query + " /passages"] = stores.answer(query, kinds=("passage",))
    return out


def _settled(stores: Stores) -> dict[str, Any]:
    """A's answers once the background work of its first searches is done (its vector directory loaded,
    its hubness scores computed): two rounds a moment apart agree."""
    previous = _answers(stores)
    for _ in range(50):
        time.sleep(0.1)
        current = _answers(stores)
        if current == previous:
            return current
        previous = current
    raise AssertionError("team A's answers never settled")


def test_team_a_answer_is_the_same_whatever_team_b_stores(stores):
    _team_a(stores)
    before = _settled(stores)
    assert all(before.values()) and any(len(v) > 5 for v in before.values())
    ids = _team_b(stores)
    assert _answers(stores) == before
    Forgetter(stores.journal, stores.vectors, ConsolidationStore(stores.journal)).forget(B, memory_ids=ids)
    assert _answers(stores) == before


def _insert(journal: Journal, team: str, text: str, now: float, fact: str | None = None) -> str:
    memory, _ = journal.insert(
        team=team,
        agent_id="ann",
        text=text,
        run_id=None,
        tags=[],
        metadata={},
        idempotency_key=None,
        budget_s=60.0,
        now=now,
    )
    if fact is not None:
        with journal.transaction() as conn:
            conn.execute(
                "INSERT INTO facts (id, team, agent_id, memory_id, text, norm, shape, tags, created_at) "
                "VALUES (?,?,?,?,?,?,?,?,?)",
                ("f-" + memory.id, team, "ann", memory.id, fact, fact.lower(), fact, "[]", now),
            )
    return memory.id


def test_keyword_search_of_a_team_ignores_other_teams_on_both_backends(journal):
    """The keyword leg alone, on SQLite and PostgreSQL: same hits, order and ranks with or without B's rows."""
    for i in range(30):
        extra = " zorblax" if i % 5 == 0 else ""
        _insert(journal, A, f"note {i} on the launch review{extra} and billing {i % 3}", 1000.0 + i, f"fact {i}{extra}")

    def hits() -> list[Any]:
        return [
            [(h.kind, h.item_id, h.rank) for h in journal.keyword_search(A, q, kinds={"passage", "fact"}, limit=90)]
            for q in ("zorblax launch review", "billing review", "zorblax")
        ]

    before = hits()
    assert all(before)
    ids = [
        _insert(
            journal, B, "zorblax " * (1 + i % 4) + "launch review billing " + "x " * (i % 20), 5000.0 + i, "zorblax"
        )
        for i in range(600)
    ]
    assert hits() == before
    mark_forgotten(journal, B, memory_ids=ids)
    purge(journal, pending(journal, limit=10_000))
    assert hits() == before


def test_a_long_query_keeps_a_bounded_number_of_keyword_words():
    words = ["w" + "".join(chr(97 + (i // 26**p) % 26) for p in range(3)) + "long" for i in range(1000)]
    kept = keyword_words(" ".join(words + ["zq81x7"]))
    assert len(kept) == MAX_QUERY_WORDS
    assert "zq81x7" in kept  # an id is among the most informative words
    assert keyword_words("the billing deploy") == ["billing", "deploy"]
