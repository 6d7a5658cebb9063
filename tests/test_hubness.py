"""Hubness scores and the vector leg's CSLS ranking: the arithmetic, then a generic item demoted in a real
recall (real embedding model, real Chroma and SQLite)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from memory_service.embedding.embedder import load_embedder
from memory_service.recall.vectors import VectorFilter, hub_scores, hubness
from tests.test_recall_filters import TEAM, Stores


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def test_exact_scores_are_the_mean_cosine_to_the_ten_nearest_others():
    vectors = unit(np.random.default_rng(0).normal(size=(1500, 32)))  # more rows than one block
    got = hubness.exact(vectors)
    sims = vectors @ vectors.T
    np.fill_diagonal(sims, -np.inf)
    expected = np.sort(sims, axis=1)[:, -10:].mean(axis=1)
    assert np.allclose(got, expected, atol=1e-5)
    assert hubness.exact(vectors[:1]).tolist() == [0.0]  # no neighbour: no discount
    assert np.allclose(hubness.exact(vectors[:3]), np.sort(sims[:3, :3], axis=1)[:, -2:].mean(axis=1), atol=1e-5)


def test_clustered_scores_look_for_neighbours_inside_each_cluster_only():
    vectors = unit(np.random.default_rng(1).normal(size=(60, 16)))
    offsets = np.array([0, 25, 25, 59, 60])  # an empty cluster and a lone row too
    got = hubness.clustered(vectors, offsets)
    assert np.allclose(got[:25], hubness.exact(vectors[:25]))
    assert np.allclose(got[25:59], hubness.exact(vectors[25:59]))
    assert got[59] == 0.0


def test_rerank_discounts_hubs_keeps_cosines_and_gives_unscored_items_the_median():
    found = [("hub", 0.80), ("answer", 0.70), ("new", 0.69), ("other", 0.50)]
    scores = np.array([0.80, 0.45, np.nan, 0.40], dtype=np.float32)
    ranked = hubness.rerank(found, scores, keep=3)
    # hub 0.40, answer 0.475, new 0.69 - 0.5 * median(0.80, 0.45, 0.40) = 0.465, other 0.30
    assert ranked == [("answer", 0.70), ("new", 0.69), ("hub", 0.80)]
    assert hubness.rerank(found, np.full(4, np.nan, dtype=np.float32), keep=2) == found[:2]  # none yet: as found
    assert hubness.rerank([], np.zeros(0, dtype=np.float32), keep=2) == []


GENERIC = [
    "Maria is a family member.",
    "Maria is a great friend.",
    "Maria is so important.",
    "Maria made a difference.",
    "Maria loves her family.",
    "Maria is grateful for her family.",
    "Maria is a kind person.",
    "Maria has a big family.",
    "Maria talks about her family a lot.",
    "Maria values family time.",
    "Maria is close to her family.",
    "Maria is a good friend to John.",
]
OTHERS = [
    "John went on a road trip to Oregon.",
    "The shelter needs blankets before winter.",
    "John is running for city council.",
    "Maria took a solo trip to Spain last year.",
    "John's car broke down on the highway.",
    "Maria joined a gym last week.",
]
ANSWER = "An aunt lent Maria's parents money years ago."
QUESTION = "Who helped Maria's family financially when she was a child?"


@pytest.fixture(scope="module")
def embedder():
    return load_embedder("onnx")


def test_the_vector_leg_ranks_the_answer_above_generic_items_near_everything(tmp_path, embedder):
    # the vector leg as recall composes it (the keyword leg is fused afterwards, whatever this ranking)
    stores = Stores(tmp_path)
    stores.embedder = embedder
    try:
        saved = {text: stores.save(text, "agent") for text in GENERIC + [ANSWER] + OTHERS}
        answer = f"p:{saved[ANSWER].id}:0"
        vector = embedder.embed_one(QUESTION)
        near = stores.search.search(TEAM, "passage", vector, 10, VectorFilter())
        assert [i for i, _ in near].index(answer) >= 3  # the premise: by cosine, generic texts about Maria first
        ids = [item_id for item_id, _ in near]
        deadline = time.monotonic() + 30
        while np.isnan(stores.search.hubness(TEAM, "passage", ids)).any() and time.monotonic() < deadline:
            time.sleep(0.02)  # computed on a thread of its own after the first look-up
        scores = stores.search.hubness(TEAM, "passage", ids)
        assert not np.isnan(scores).any()
        ranked = hubness.rerank(near, scores, keep=5)
        assert ranked[0] == (answer, dict(near)[answer])  # first, its cosine unchanged
        assert len(ranked) == 5
    finally:
        stores.journal.close()


def test_scores_are_computed_again_once_the_team_has_grown(tmp_path, embedder, monkeypatch):
    monkeypatch.setattr(hub_scores, "HUB_REFRESH_MIN", 5)
    stores = Stores(tmp_path)
    stores.embedder = embedder
    try:
        for text in OTHERS:
            stores.save(text, "agent")
        stores.recall("road trip", k=3, kinds=("passage",))  # loads the team, starts the first pass

        def settled_ids() -> list[str]:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                state = stores.search.hub_scores.states.get((TEAM, "passage"))
                if state is not None and not state.running and state.live_at >= 0:
                    return list(stores.search.view.directories[(TEAM, "passage")].row)  # live ids
                time.sleep(0.02)
            raise AssertionError("no hubness pass finished")

        first = settled_ids()
        assert not np.isnan(stores.search.hubness(TEAM, "passage", first)).any()
        later = [stores.save(text, "agent") for text in GENERIC]  # 12 more: past the refresh bound
        stores.search.hubness(TEAM, "passage", first)  # due: starts the next pass
        ids = settled_ids()
        assert len(ids) == len(OTHERS) + len(later)
        assert not np.isnan(stores.search.hubness(TEAM, "passage", ids)).any()
    finally:
        stores.journal.close()
