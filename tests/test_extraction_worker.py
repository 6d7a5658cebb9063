"""The extraction worker built by hand, in this process, against the fake llama-server on a thread.

Everything else reaches `ExtractionWorker` through `Services` or a served app; here it is constructed from
the real stores and one model handle, runs its loop as an asyncio task, claims the saved job, extracts, and
commits its facts: no subprocess, no served app.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from memory_service.app import create_app
from memory_service.config import Settings
from memory_service.pipeline.worker import ExtractionWorker
from memory_service.services import Services
from memory_service.storage.journal import DONE
from tests.fakes.fake_llama_server import FakeLlamaServer

TEXT = "Rosa Diaz closed the payments incident on Tuesday. The gateway now retries twice."
FACTS = ["Rosa Diaz closed the payments incident on Tuesday.", "The gateway now retries twice."]


@pytest.fixture
def fake() -> Iterator[FakeLlamaServer]:
    with FakeLlamaServer("ok", tokens_per_s=20_000, facts=FACTS) as server:
        yield server


@pytest.fixture
def services(fake: FakeLlamaServer, tmp_path: Path) -> Iterator[Services]:
    """The stores only: `start()` is never called, so no worker runs but the one the test builds."""
    settings = Settings(data_dir=tmp_path / "data", llm_url=fake.url, chroma_process=False, retry_base_s=0.2)
    opened = Services.open(settings)
    yield opened
    opened.close()


def worker_for(services: Services, settled: asyncio.Event) -> ExtractionWorker:
    return ExtractionWorker(
        services.settings,
        services.journal,
        services.models.handles[0],
        services.embedder,
        services.vectors,
        metrics=services.metrics,
        forgetter=services.forgetter,
        settled=lambda memory_id: settled.set(),
    )


def test_a_worker_built_in_process_takes_a_saved_job_to_done_with_its_facts(
    services: Services, fake: FakeLlamaServer
) -> None:
    memory, created, _ = services.remember(
        team="team-a", agent_id="oncall", text=TEXT, run_id=None, tags=[], metadata={}, idempotency_key=None
    )
    assert created and memory.status == "queued"

    async def scenario() -> None:
        settled = asyncio.Event()
        worker = worker_for(services, settled)
        loop = asyncio.create_task(worker.run(0))
        try:
            await asyncio.wait_for(settled.wait(), 60)
        finally:
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
            await services.models.aclose()

    asyncio.run(scenario())
    done = services.journal.get("team-a", memory.id)
    assert done is not None and done.status == DONE and done.attempts == 1, done
    assert [f.text for f in services.journal.facts_of_memory("team-a", memory.id)] == FACTS
    assert any(TEXT in str(request["messages"]) for request in fake.recorded())  # the model was asked
    assert services.journal.counts()[DONE] == 1


def test_the_app_runs_the_workers_in_its_lifespan_when_asked(services: Services) -> None:
    """`create_app(..., run_workers=True)` through TestClient: the save is done before the answer comes back,
    and the stores stay open to their owner after the lifespan ends."""
    app = create_app(services.settings, services=services, run_workers=True)
    with TestClient(app, base_url="http://127.0.0.1") as client:  # keyless: answers loopback names only
        saved = client.post("/v1/remember", json={"text": TEXT, "agent_id": "oncall", "wait_s": 30})
        assert saved.status_code == 202 and saved.json()["status"] == "done", saved.text
        memory = client.get(f"/v1/memories/{saved.json()['id']}").json()
        assert [f["text"] for f in memory["facts"]] == FACTS
    assert services.journal.counts()[DONE] == 1  # still open after the lifespan's shutdown
