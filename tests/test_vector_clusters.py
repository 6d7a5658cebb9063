"""The in-process clustered index that serves a large team's unfiltered recall instead of Chroma's query.

Unit tests on vectors with real cluster structure (noisy copies of a few hundred centres, as sentence
embeddings of one team's facts are), then the index behind `FilteredVectors` on real SQLite and Chroma:
built in the background, kept current by writes, blind to what was forgotten.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from memory_service.recall.vectors import filtered as vector_search
from memory_service.recall.vectors.clusters import ClusteredVectors
from tests.test_recall_filters import Stores, forget

DIMS = 384


def blobs(n: int, centres: int = 300, noise: float = 0.04, seed: int = 1) -> np.ndarray:
    """Noisy copies of `centres` fixed random directions; `seed` picks the copies, not the centres."""
    base = np.random.default_rng(0).normal(size=(centres, DIMS)).astype(np.float32)
    rng = np.random.default_rng(seed)
    vectors = base[rng.integers(0, centres, n)] + rng.normal(0, noise, (n, DIMS)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def exact_top(vectors: np.ndarray, query: np.ndarray, k: int) -> set[int]:
    return set(np.argsort(-(vectors @ query))[:k].tolist())


def test_finds_nearly_all_of_the_exact_top_k():
    vectors = blobs(20_000)
    index = ClusteredVectors.build(np.arange(len(vectors)), vectors)
    alive = np.ones(len(vectors), dtype=bool)
    queries = blobs(50, noise=0.06, seed=7)  # near what the team holds, as a query about it is
    overlap = [len({r for r, _ in index.search(q, 30, alive)} & exact_top(vectors, q, 30)) / 30 for q in queries]
    assert np.mean(overlap) >= 0.9
    hits = index.search(queries[0], 30, alive)
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    assert np.isclose(hits[0][1], float(vectors[hits[0][0]] @ queries[0]), atol=1e-5)


def test_dead_rows_are_never_returned_and_new_rows_are_found_before_and_after_a_fold():
    vectors = blobs(6_000)
    index = ClusteredVectors.build(np.arange(len(vectors)), vectors)
    alive = np.ones(12_000, dtype=bool)
    query = vectors[42]
    assert index.search(query, 1, alive)[0][0] == 42
    alive[42] = False  # forgotten, or rewritten under a new row
    assert 42 not in {r for r, _ in index.search(query, 30, alive)}
    index.add(6_000, query)  # a write after the build: scanned exactly until folded
    assert index.search(query, 1, alive)[0][0] == 6_000
    for row in range(6_001, 6_001 + 2_100):  # copies of other rows, none of row 42: the top hit is not a tie
        index.add(row, vectors[row - 6_001 + 100])
    assert index.needs_fold()
    folded = index.folded(alive)
    assert not folded.added and len(folded) == 6_000 - 1 + 1 + 2_100
    assert folded.search(query, 1, alive)[0][0] == 6_000
    assert 42 not in folded.rows
    # stored vectors keep their clusters and only pending ones are assigned: the same grouping as assigning all
    again = ClusteredVectors._grouped(folded.centroids, folded.rows, folded.vectors)
    assert np.array_equal(again.offsets, folded.offsets)


def test_a_filter_mask_returns_only_allowed_rows_and_nearly_all_of_their_exact_top_k():
    # 100 centres: the allowed top 30 sit near the query's centre (with 300, they are noise-level vectors
    # of other centres, which no probe of a few clusters finds, masked or over-fetched: 0.75 both)
    vectors = blobs(20_000, centres=100)
    index = ClusteredVectors.build(np.arange(len(vectors)), vectors)
    allowed = np.random.default_rng(3).random(len(vectors)) < 0.1  # a tag on 10% of the rows
    queries = blobs(50, centres=100, noise=0.06, seed=7)
    overlap = []
    for q in queries:
        hits = index.search(q, 30, allowed)
        assert len(hits) == 30 and all(allowed[r] for r, _ in hits)
        exact = np.flatnonzero(allowed)[np.argsort(-(vectors[allowed] @ q))[:30]]
        overlap.append(len({r for r, _ in hits} & set(exact.tolist())) / 30)
    assert np.mean(overlap) >= 0.9
    # a wider probe scores more clusters: never fewer of the allowed rows
    few = np.zeros(len(vectors), dtype=bool)
    few[::997] = True
    assert len(index.search(queries[0], 30, few, widen=4)) >= len(index.search(queries[0], 30, few))


def test_a_large_team_is_searched_in_process_once_its_index_is_built(tmp_path, monkeypatch):
    monkeypatch.setattr(vector_search, "UNFILTERED_EXACT_MAX_ROWS", 20)
    stores = Stores(tmp_path)
    try:
        for i in range(40):
            stores.save(f"weekly report {i} on harbour logistics, crane {i} and berth {i % 7}", "big")
        target = stores.save("the pilot boat Selkie docks at berth nine", "small")
        first = stores.recall("pilot boat Selkie berth", k=5, kinds=("passage",))
        assert stores.search.last_plan == "hnsw"  # the index is being built: Chroma meanwhile
        deadline = time.monotonic() + 60
        while stores.search.clustered_indexes() < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stores.search.clustered_indexes() == 1  # the passages (these saves were not extracted)
        again = stores.recall("pilot boat Selkie berth", k=5, kinds=("passage",))
        assert stores.search.last_plan == "clusters"
        assert first[0].memory_id == again[0].memory_id == target.id
        # hubness scores of a large team come from its clusters, on a thread of their own
        ids = [
            item_id
            for item_id, _ in stores.search.search(
                "team-filters",
                "passage",
                stores.embedder.embed_one("harbour logistics"),
                10,
                vector_search.VectorFilter(),
            )
        ]
        while np.isnan(stores.search.hubness("team-filters", "passage", ids)).any() and time.monotonic() < deadline:
            time.sleep(0.05)
        scores = stores.search.hubness("team-filters", "passage", ids)
        assert not np.isnan(scores).any() and (scores > 0).all()
        later = stores.save("the tug Orca replaced the pilot boat Selkie", "small")
        found = stores.recall("tug Orca pilot boat Selkie", k=5, kinds=("passage",))
        assert later.id in {h.memory_id for h in found if h.similarity is not None}  # found by the vector leg
        forget(stores.journal, stores.vectors, team="team-filters", memory_ids=[target.id])
        gone = stores.search.search(
            "team-filters",
            "passage",
            stores.embedder.embed_one("pilot boat Selkie berth"),
            10,
            vector_search.VectorFilter(),
        )
        assert stores.search.last_plan == "clusters"
        assert all(target.id not in item_id for item_id, _ in gone)
        filtered = stores.recall("harbour logistics crane", k=5, kinds=("passage",), agent_id="big")
        assert filtered and all(h.agent_id == "big" for h in filtered)
    finally:
        stores.journal.close()


@pytest.mark.parametrize("size", [1, 2, 5])
def test_tiny_inputs(size):
    vectors = blobs(size)
    index = ClusteredVectors.build(np.arange(size), vectors)
    hits = index.search(vectors[0], 10, np.ones(size, dtype=bool))
    assert len(hits) == size and hits[0][0] == 0


def test_a_filtered_recall_on_a_large_team_masks_the_clustered_index_and_follows_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(vector_search, "UNFILTERED_EXACT_MAX_ROWS", 20)
    monkeypatch.setattr(vector_search, "EXACT_MAX_ROWS", 5)  # a filter keeping more rows than this is "many"
    monkeypatch.setattr(vector_search, "TIME_ONLY_EXACT_MAX_ROWS", 5)
    stores = Stores(tmp_path)
    try:
        for i in range(60):
            stores.save(
                f"weekly report {i} on harbour logistics, crane {i} and berth {i % 7}",
                "big" if i % 3 else "other",
                ["ops"] if i % 2 else [],
                now=1000.0 + i,
            )
        stores.recall("harbour logistics", k=5, kinds=("passage",))  # starts the index build
        deadline = time.monotonic() + 60
        while stores.search.clustered_indexes() < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stores.search.clustered_indexes() == 1
        for kw in ({"agent_id": "big"}, {"tags": ("ops",)}, {"since": 1030.0}, {"agent_id": "big", "tags": ("ops",)}):
            items = stores.recall("harbour logistics crane berth", k=5, kinds=("passage",), **kw)
            assert stores.search.last_plan == "clusters+mask", kw
            assert len(items) == 5
            assert all(h.similarity is not None for h in items)
            assert all(h.agent_id == "big" for h in items) or "agent_id" not in kw
            assert all("ops" in h.tags for h in items) or "tags" not in kw
            assert all(h.created_at >= 1030.0 for h in items) or "since" not in kw
        # written after the tag's mask was made: found through it; forgotten: never returned
        later = stores.save("the pilot boat Selkie docks at berth nine", "big", ["ops"], now=2000.0)
        found = stores.recall("pilot boat Selkie berth nine", k=5, kinds=("passage",), tags=("ops",))
        assert stores.search.last_plan == "clusters+mask"
        assert found[0].memory_id == later.id and found[0].similarity is not None
        untagged = stores.save("the pilot boat Selkie left berth nine", "big", [], now=2001.0)
        found = stores.recall("pilot boat Selkie berth nine", k=5, kinds=("passage",), tags=("ops",))
        assert untagged.id not in {h.memory_id for h in found}
        forget(stores.journal, stores.vectors, team="team-filters", memory_ids=[later.id])
        gone = stores.search.search(
            "team-filters",
            "passage",
            stores.embedder.embed_one("pilot boat Selkie"),
            10,
            vector_search.VectorFilter(tags=("ops",)),
        )
        assert stores.search.last_plan == "clusters+mask"
        assert all(later.id not in item_id for item_id, _ in gone)
    finally:
        stores.journal.close()
