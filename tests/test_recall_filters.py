"""Recall filters inside both legs, the bounded keyword leg, and forgetting through every search path.

Real SQLite and Chroma in a temporary directory; a deterministic bag-of-words embedder stands in for the
model so the tests need no weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memory_service.pipeline.forgetting import Forgetter
from memory_service.pipeline.passages import index_passages
from memory_service.recall.floor import OFF
from memory_service.recall.search import RecallQuery, recall
from memory_service.recall.vectors import FilteredVectors
from memory_service.recall.vectors import filtered as vector_search
from memory_service.storage.consolidation import ConsolidationStore
from memory_service.storage.forget import mark_forgotten
from memory_service.storage.journal import Journal
from memory_service.storage.vectors import VectorStore
from tests.word_embedder import WordEmbedder

TEAM = "team-filters"


def forget(journal: Journal, vectors: VectorStore, team: str, **selector: Any) -> list[str]:
    """What the service's forget does, on these stores."""
    return Forgetter(journal, vectors, ConsolidationStore(journal)).forget(team, **selector)


class Stores:
    def __init__(self, root: Path) -> None:
        self.journal = Journal(root / "journal.sqlite3")
        self.vectors = VectorStore(root / "chroma")
        self.embedder = WordEmbedder()
        self.search = FilteredVectors(self.journal, self.vectors)

    def save(self, text: str, agent: str, tags: list[str] | None = None, *, index: bool = True, now: float = 1000.0):
        memory, _ = self.journal.insert(
            team=TEAM,
            agent_id=agent,
            text=text,
            run_id=None,
            tags=tags or [],
            metadata={},
            idempotency_key=None,
            budget_s=60.0,
            now=now,
        )
        if index:
            index_passages([memory], self.embedder, self.vectors)
            self.journal.mark_indexed([memory.id])
        return memory

    def recall(self, query: str, **kw) -> list:
        return recall(
            RecallQuery(team=TEAM, query=query, **kw),
            journal=self.journal,
            embedder=self.embedder,
            search=self.search,
            floor=OFF,  # these tests are about filters: every hit, however weak (the floor: test_relevance_floor)
        ).hits


@pytest.fixture
def stores(tmp_path) -> Stores:
    s = Stores(tmp_path)
    yield s
    s.journal.close()


def test_agent_scope_finds_a_minority_agents_exact_id_by_keyword(stores):
    # the majority agent's short texts rank first team-wide for the id; the minority's text is not embedded yet
    for i in range(120):
        stores.save(f"order 4417 note {i}", "big", index=False)
    mine = stores.save(
        "Customer called about order 4417 and asked for a refund by Friday afternoon", "small", index=False
    )
    items = stores.recall("order 4417", k=5, kinds=("passage",), agent_id="small")
    assert items and items[0].memory_id == mine.id


def test_tag_and_time_filters_apply_inside_the_keyword_leg(stores):
    for i in range(120):
        stores.save(f"invoice 9921 copy {i}", "big", ["noise"], index=False, now=2000.0)
    tagged = stores.save(
        "The invoice 9921 for Globex was paid twice and needs a credit note",
        "big",
        ["billing"],
        index=False,
        now=1000.0,
    )
    assert [h.memory_id for h in stores.recall("invoice 9921", k=3, tags=("billing",))][:1] == [tagged.id]
    assert [h.memory_id for h in stores.recall("invoice 9921", k=3, until=1500.0)][:1] == [tagged.id]


def test_keyword_tag_filter_matches_whole_tags_of_any_spelling(stores):
    # the keyword leg tests a tag as a substring of the stored JSON before json_each confirms it: a tag that
    # is a prefix of another, or one with quotes or non-ASCII letters, must still match exactly
    tags = ["p-1", "p-10", 'say "hi"', "caf\u00e9", "a\\b", "p-1 x"]
    saved = {
        tag: stores.save(f"ticket zq{i}00 escalated for tag {i}", "big", [tag, "common"], index=False)
        for i, tag in enumerate(tags)
    }
    for i, tag in enumerate(tags):
        found = stores.recall(f"ticket zq{i}00 escalated", k=10, kinds=("passage",), tags=(tag,))
        assert [h.memory_id for h in found] == [saved[tag].id], tag
        everyone = stores.recall("ticket escalated", k=10, kinds=("passage",), tags=(tag,))
        assert [h.memory_id for h in everyone] == [saved[tag].id], tag
    assert len(stores.recall("ticket escalated", k=10, kinds=("passage",), tags=("common",))) == len(tags)
    assert stores.recall("ticket escalated", k=10, kinds=("passage",), tags=("p",)) == []


def test_exact_id_ranks_first_among_many_common_words(stores):
    for i in range(300):
        stores.save(f"the billing service deploy finished for customer number {i}", f"a{i % 3}", index=False)
    target = stores.save("billing service deploy id zq81x7 failed", "a1", index=False)
    assert stores.recall("billing service deploy zq81x7", k=3, kinds=("passage",))[0].memory_id == target.id
    assert stores.recall("zq81x7", k=3)[0].memory_id == target.id


def test_agent_scope_vector_leg_finds_minority_items(stores):
    for i in range(60):
        stores.save(f"weekly report number {i} about harbour logistics and cranes", "big")
    mine = stores.save("crane maintenance window moved to Tuesday", "small")
    other = stores.save("crane maintenance window moved to Monday", "third")
    items = stores.recall("when is the crane maintenance window", k=5, agent_id="small")
    assert items and items[0].memory_id == mine.id
    assert all(h.agent_id == "small" for h in items) and other.id not in {h.memory_id for h in items}


def test_forgotten_items_never_come_back_through_any_path(stores):
    for i in range(40):
        stores.save(f"routine log line {i} for the nightly batch", "big", ["ops"])
    gone = stores.save("the vault password hint is pelican 7731", "small", ["secret"])
    kept = stores.save("the vault is in room 12", "small", ["secret"])
    query = "vault password hint pelican 7731"
    for kw in ({}, {"agent_id": "small"}, {"tags": ("secret",)}):
        assert gone.id in {h.memory_id for h in stores.recall(query, k=5, **kw)}  # warms every cache
    forget(stores.journal, stores.vectors, TEAM, memory_ids=[gone.id])
    for kw in ({}, {"agent_id": "small"}, {"tags": ("secret",)}, {"agent_id": "small", "since": 0.0}):
        items = stores.recall(query, k=5, **kw)
        assert gone.id not in {h.memory_id for h in items}
        assert all("pelican" not in h.text for h in items)
    assert kept.id in {h.memory_id for h in stores.recall("vault room", k=5, agent_id="small")}


def test_a_forget_cut_off_before_its_vectors_went_still_hides_the_item(stores):
    gone = stores.save("launch code is heron 5512", "small")
    assert stores.recall("launch code heron 5512", k=3, agent_id="small")[0].memory_id == gone.id
    mark_forgotten(stores.journal, TEAM, memory_ids=[gone.id])  # the crash: vectors still there
    for kw in ({}, {"agent_id": "small"}):
        assert gone.id not in {h.memory_id for h in stores.recall("launch code heron 5512", k=3, **kw)}


@pytest.mark.parametrize(
    "exact_max, overfetch_max, fallback_max, plan",
    [
        (5000, 1000, 50_000, "exact"),
        (5, 1000, 50_000, "overfetch"),
        (5, 1, 50_000, "exact"),
        (5, 1, 5, "where"),
    ],
)
def test_every_vector_plan_keeps_only_the_filtered_items(
    stores, monkeypatch, exact_max, overfetch_max, fallback_max, plan
):
    monkeypatch.setattr(vector_search, "EXACT_MAX_ROWS", exact_max)
    monkeypatch.setattr(vector_search, "OVERFETCH_MAX", overfetch_max)
    monkeypatch.setattr(vector_search, "EXACT_FALLBACK_ROWS", fallback_max)
    for i in range(30):
        stores.save(
            f"shipment {i} left the harbour with spare crane parts",
            "big" if i % 4 else "small",
            ["cargo"] if i % 2 else [],
        )
    items = stores.recall("crane parts shipment", k=5, kinds=("passage",), agent_id="big", tags=("cargo",))
    assert stores.search.last_plan == plan
    assert items and all(h.agent_id == "big" and "cargo" in h.tags for h in items)
    assert all(h.similarity is not None for h in items)  # found by the vector leg too


def test_directory_follows_writes_and_forgets_after_it_is_loaded(stores):
    first = stores.save("the boiler room key hangs by the door", "small")
    assert stores.recall("boiler room key", k=3, agent_id="small")[0].memory_id == first.id  # loads, caches
    later = stores.save("the boiler room key moved to the locker", "small")
    assert later.id in {
        h.memory_id for h in stores.recall("boiler room key locker", k=3, agent_id="small") if h.similarity is not None
    }
    forget(stores.journal, stores.vectors, TEAM, agent_id="small")
    assert stores.recall("boiler room key", k=3, agent_id="small") == []


def test_since_until_can_filter_on_when_it_happened(stores):
    # saved the same second, told of different days: occurred_at decides; absent, the save time counts
    may = stores.journal.insert(
        team=TEAM,
        agent_id="a",
        text="Caroline went to the support group meeting",
        run_id=None,
        tags=[],
        metadata={},
        idempotency_key=None,
        budget_s=60.0,
        now=5000.0,
        occurred_at=1000.0,
        occurred_day="1970-01-01",
    )[0]
    june = stores.journal.insert(
        team=TEAM,
        agent_id="a",
        text="Caroline went to the adoption agency meeting",
        run_id=None,
        tags=[],
        metadata={},
        idempotency_key=None,
        budget_s=60.0,
        now=5000.0,
        occurred_at=3000.0,
        occurred_day="1970-01-01",
    )[0]
    plain = stores.save("Caroline went to the pottery class meeting", "a", now=5000.0)
    index_passages([may, june], stores.embedder, stores.vectors)
    stores.journal.mark_indexed([may.id, june.id])
    ids = lambda **kw: {h.memory_id for h in stores.recall("Caroline meeting", k=10, **kw)}  # noqa: E731
    assert ids(since=2000.0, until=4000.0, time_field="occurred_at") == {june.id}
    assert ids(until=2000.0, time_field="occurred_at") == {may.id}
    assert ids(since=4000.0, time_field="occurred_at") == {plain.id}
    assert ids(since=2000.0, until=4000.0) == set()  # the save time: all three were saved at 5000
    assert ids(since=4000.0) == {may.id, june.id, plain.id}
