"""Storage under hostile timing and on a shared machine: forget racing fact decisions and saves, a restore cut
off between its two renames, and who may read the data dir.

Real journal (SQLite and PostgreSQL), real embedder and Chroma, the in-process service over HTTP against the
fake llama-server; the restore's crash window is a real process killed between the renames.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest

from memory_service.embedding.embedder import Embedder, load_embedder
from memory_service.extraction.grounding import GroundedFact
from memory_service.pipeline.dedup import decide_facts
from memory_service.pipeline.forgetting import Forgetter
from memory_service.storage.consolidation import ConsolidationStore
from memory_service.storage.journal import Journal, Memory
from memory_service.storage.vectors import VectorStore
from tests.fakes.fake_llama_server import FakeLlamaServer

TEXT = "The Q3 marketing budget is 500 euros"


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return load_embedder("onnx")


def _claimed(journal: Journal, text: str) -> Memory:
    journal.insert(
        team="a", agent_id="bot", text=text, run_id=None, tags=[], metadata={}, idempotency_key=None, budget_s=20
    )
    job = journal.claim_next("w", 60)
    assert job is not None
    return job


def _decide_and_complete(journal: Journal, vectors: VectorStore, embedder: Embedder, job: Memory) -> None:
    plan, _ = decide_facts(
        job,
        [GroundedFact(job.text, [(0, len(job.text))])],
        journal=journal,
        embedder=embedder,
        vectors=vectors,
        near_duplicate=0.92,
    )
    assert journal.complete(job, plan, raw_reply=None, timings=None, report={})


# ---------------------------------------------------------------- forget vs. fact decisions


def test_a_forget_racing_a_merge_leaves_the_new_saves_fact(
    journal: Journal, tmp_path: Path, embedder: Embedder
) -> None:
    """Save B repeats save A's fact (a merge into A's fact) while A is forgotten: B's fact must survive.

    The forget starts while B's decision is made but not yet committed. Without the team's deciding lock the
    forget deletes A's fact (its only source) and B's commit then adds a source to a fact that no longer exists.
    """
    vectors = VectorStore(tmp_path / "chroma")
    forgetter = Forgetter(journal, vectors, ConsolidationStore(journal))
    first = _claimed(journal, TEXT)
    with journal.deciding("a"):
        _decide_and_complete(journal, vectors, embedder, first)
    second = _claimed(journal, TEXT)
    forgetting = threading.Thread(target=forgetter.forget, args=("a",), kwargs={"memory_ids": [first.id]})
    with journal.deciding("a"):
        plan, _ = decide_facts(
            second,
            [GroundedFact(TEXT, [(0, len(TEXT))])],
            journal=journal,
            embedder=embedder,
            vectors=vectors,
            near_duplicate=0.92,
        )
        assert plan.merged and not plan.new  # B's fact is A's fact
        forgetting.start()
        forgetting.join(1.0)  # a forget that does not wait for the decision is done by now
        assert journal.complete(second, plan, raw_reply=None, timings=None, report={})
    forgetting.join(30)
    assert not forgetting.is_alive()
    assert journal.get("a", first.id) is None
    facts = journal.facts_of_memory("a", second.id)
    assert [f.text for f in facts] == [TEXT]
    assert journal.fact_recall_rows("a", [facts[0].id])[facts[0].id][0] == second.id
    vectors.close()


# ---------------------------------------------------------------- forget vs. a save with the same key


@pytest.fixture(scope="module")
def fake_llama() -> FakeLlamaServer:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        yield fake


def _race_round(svc, body: dict, memory_id: str, statuses: list[int], fresh: list[str]) -> None:
    """Five clients save `body` three times each while a sixth forgets `memory_id`, all released at once."""
    barrier = threading.Barrier(6)

    def save() -> None:
        with svc.client() as own:
            barrier.wait()
            for _ in range(3):
                answer = own.post("/v1/remember", json=body)
                statuses.append(answer.status_code)
                if answer.status_code == 202 and answer.json()["created"]:
                    fresh.append(answer.json()["id"])

    def forget() -> None:
        with svc.client() as own:
            barrier.wait()
            statuses.append(own.delete(f"/v1/memories/{memory_id}").status_code)

    threads = [threading.Thread(target=save) for _ in range(5)] + [threading.Thread(target=forget)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def test_saves_racing_the_forget_of_their_idempotency_key_never_answer_5xx(inprocess_service, fake_llama) -> None:
    """A save whose key belongs to a memory being forgotten is a replay (before the forget) or a fresh save
    (after it): never a 500, and every save acknowledged as fresh can be read back."""
    svc = inprocess_service(fake_llama.url)
    statuses: list[int] = []
    fresh: list[str] = []
    forgotten: set[str] = set()
    with svc.client() as client:
        for round_ in range(8):
            key = f"race-{round_}-{uuid.uuid4().hex[:6]}"
            body = {
                "agent_id": "bot",
                "text": f"Round {round_}: the printer code is 88{round_}",
                "idempotency_key": key,
            }
            first = client.post("/v1/remember", json=body)
            assert first.status_code == 202
            forgotten.add(first.json()["id"])
            _race_round(svc, body, first.json()["id"], statuses, fresh)
        assert [s for s in statuses if s >= 500] == []
        assert set(statuses) <= {202, 204, 409}
        assert fresh, "no save came after a forget: the race was not exercised"
        for memory_id in fresh:
            assert memory_id not in forgotten
            assert client.get(f"/v1/memories/{memory_id}").status_code == 200, memory_id
