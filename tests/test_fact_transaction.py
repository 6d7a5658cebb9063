"""Storing a job's facts: decided under a per-team lock, committed in one transaction, vectors after the commit.

Real journal (SQLite and PostgreSQL), real embedder, real Chroma. Chroma is derived state: what it holds
follows the journal, never the other way round.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from memory_service.embedding.embedder import Embedder, load_embedder
from memory_service.extraction.grounding import GroundedFact
from memory_service.pipeline.dedup import decide_facts
from memory_service.pipeline.forgetting import Forgetter
from memory_service.pipeline.passages import PassageIndexer, write_fact_vectors
from memory_service.storage.consolidation import ConsolidationStore
from memory_service.storage.journal import DONE, Journal, Memory
from memory_service.storage.vectors import VectorStore


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return load_embedder("onnx")


@pytest.fixture
def vectors(tmp_path: Path) -> VectorStore:
    return VectorStore(tmp_path / "chroma")


def claimed(journal: Journal, text: str, worker: str = "w") -> Memory:
    journal.insert(
        team="a", agent_id="bot", text=text, run_id=None, tags=[], metadata={}, idempotency_key=None, budget_s=20
    )
    job = journal.claim_next(worker, 60)
    assert job is not None and job.text == text
    return job


def store(journal: Journal, vectors: VectorStore, embedder: Embedder, job: Memory, text: str) -> bool:
    """What a worker does once the model answered: decide and commit under the team's lock, then vectors."""
    with journal.deciding(job.team):
        plan, items = decide_facts(
            job,
            [GroundedFact(text, [(0, len(text))])],
            journal=journal,
            embedder=embedder,
            vectors=vectors,
            near_duplicate=0.92,
        )
        stored = journal.complete(job, plan, raw_reply=None, timings=None, report={})
    if stored:
        write_fact_vectors(journal, vectors, job.team, items)
        forgetter(journal, vectors).finish_pending()  # the superseded facts' vectors go
    return stored


def forgetter(journal: Journal, vectors: VectorStore) -> Forgetter:
    return Forgetter(journal, vectors, ConsolidationStore(journal))


def fact_vectors(vectors: VectorStore) -> set[str]:
    return {hit.id for hit in vectors.query("a", [0.0] * 383 + [1.0], 50, kind="fact")}


def test_two_workers_deciding_at_once_leave_one_active_value(
    journal: Journal, vectors: VectorStore, embedder: Embedder
) -> None:
    first = claimed(journal, "The Q3 marketing budget is 500 euros", "w1")
    second = claimed(journal, "The Q3 marketing budget is 700 euros", "w2")
    barrier = threading.Barrier(2)
    results: list[bool] = []

    def work(job: Memory) -> None:
        barrier.wait()
        results.append(store(journal, vectors, embedder, job, job.text))

    threads = [threading.Thread(target=work, args=(job,)) for job in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True, True]
    facts = [f for job in (first, second) for f in journal.facts_of_memory("a", job.id)]
    active = [f for f in facts if f.superseded_by is None]
    assert len(facts) == 2 and len(active) == 1  # the later decision saw the earlier one and superseded it
    deadline = time.monotonic() + 10
    while fact_vectors(vectors) != {active[0].id} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fact_vectors(vectors) == {active[0].id}  # the superseded value's vector is gone, the active one there


def test_a_job_that_lost_its_memory_writes_no_vector(
    journal: Journal, vectors: VectorStore, embedder: Embedder
) -> None:
    from memory_service.storage.forget import mark_forgotten

    job = claimed(journal, "Dmitri's locker code is 4471")
    mark_forgotten(journal, "a", memory_ids=[job.id])
    assert store(journal, vectors, embedder, job, job.text) is False
    assert fact_vectors(vectors) == set() and journal.counts()["facts"] == 0


def test_vectors_cut_off_by_a_stop_are_written_by_the_indexer(
    journal: Journal, vectors: VectorStore, embedder: Embedder
) -> None:
    old = claimed(journal, "Priya's team has 4 engineers")
    store(journal, vectors, embedder, old, old.text)
    job = claimed(journal, "Priya's team has 6 engineers")
    # the process stops right after the commit: the new fact has no vector, the old one's is still there
    with journal.deciding("a"):
        plan, _items = decide_facts(
            job,
            [GroundedFact(job.text, [(0, len(job.text))])],
            journal=journal,
            embedder=embedder,
            vectors=vectors,
            near_duplicate=0.92,
        )
        assert journal.complete(job, plan, raw_reply=None, timings=None, report={})
    new_id = plan.new[0].id
    old_id = plan.superseded[0][0]
    assert fact_vectors(vectors) == {old_id}
    # keyword search already has the truth: the new value only
    hits = journal.keyword_search("a", "Priya engineers", kinds={"fact"}, limit=5)
    assert [(h.item_id, h.memory_id, h.text, h.agent_id) for h in hits] == [(new_id, job.id, job.text, job.agent_id)]
    PassageIndexer(journal, embedder, vectors, forgetter(journal, vectors).finish_pending)._sweep_facts()
    assert fact_vectors(vectors) == {new_id}
    assert journal.unindexed_facts(10) == [] and journal.get("a", job.id).status == DONE
