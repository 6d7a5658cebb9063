"""A slow machine makes extraction take longer, never fail.

The fake llama-server here reads prompts and writes tokens at a paced rate,
with a prompt cache like llama.cpp's. The rates are those measured on a slow
2-core VM (40 tokens/s prompt, 12 tokens/s generation, 20 s budget), scaled up
by MEMORY_TEST_SPEED_SCALE (default 10, with the budget scaled down to match)
so the suite stays quick; MEMORY_TEST_SPEED_SCALE=1 runs it at the real rates.
"""

from __future__ import annotations

import os
import time

import pytest
from conftest import wait_status

from tests.fakes.fake_llama_server import FakeLlamaServer

pytestmark = pytest.mark.process  # serve subprocesses on a slow model, one killed mid-text

SCALE = float(os.environ.get("MEMORY_TEST_SPEED_SCALE", "10"))
PROMPT_TPS, GEN_TPS, BUDGET_S = 40 * SCALE, 12 * SCALE, 20 / SCALE

# ~3,000 characters of distinct, checkable sentences
SENTENCES = [
    f"Locker {n} in the Puffin depot holds {n * 7} crates of {kind}."
    for n, kind in zip(range(1, 60), ["rope", "salt", "tar", "nails", "canvas", "oil"] * 10)
]
LONG_TEXT = " ".join(SENTENCES)


@pytest.fixture
def slow_fake():
    with FakeLlamaServer("ok", n_ctx=4096, tokens_per_s=GEN_TPS, prompt_tokens_per_s=PROMPT_TPS) as fake:
        yield fake


def test_a_long_text_on_a_slow_model_is_split_by_time_and_done_without_spending_attempts(
    slow_fake, service_factory
) -> None:
    assert 2800 <= len(LONG_TEXT) <= 3500
    svc = service_factory(slow_fake.url, env={"MEMORY_EXTRACT_BUDGET_S": f"{BUDGET_S:g}", "MEMORY_MAX_ATTEMPTS": "2"})
    with svc.client("key-a", timeout=60) as client:
        saved = client.post("/v1/remember", json={"text": LONG_TEXT, "agent_id": "slow"}).json()
        # nothing measured yet, and the service did not start this model: it says so instead of guessing
        assert saved["estimated_extraction_s"] is None and saved["estimate_basis"].startswith("unknown")
        memory = wait_status(client, saved["id"], timeout=600 / SCALE + 60)
    assert memory["status"] == "done", memory["last_error"]
    print(
        f"\n[scale {SCALE:g}] {len(LONG_TEXT)} chars: chunks={memory['extraction']['chunks']} "
        f"calls={len(memory['extraction']['calls'])} deferrals={memory['deferrals']} attempts={memory['attempts']} "
        f"elapsed_s={memory['timings']['attempt']['elapsed_s']} facts={len(memory['facts'])}"
    )
    # the first call, sized by the context alone, could not fit the budget: that cost a deferral, not an attempt
    assert memory["attempts"] == 1 and memory["deferrals"] >= 1
    assert "slower than" in memory["extraction"]["slow"]
    extraction = memory["extraction"]
    assert extraction["chunks"] >= 3 and extraction["time_budget_tokens"] < extraction["text_budget_tokens"]
    # every call after the first measurement fitted its own window
    answered = [c for c in extraction["calls"] if "error" not in c]
    assert len(answered) == extraction["chunks"]
    # facts come from the beginning and the end of the text: every chunk was extracted
    facts = " ".join(f["text"] for f in memory["facts"])
    assert "Locker 1 " in facts and "Locker 59 " in facts

    # Now the speed is measured: a second long save is sized right away, with no timeout at all.
    with svc.client("key-a", timeout=60) as client:
        saved = client.post(
            "/v1/remember", json={"text": LONG_TEXT.replace("Puffin", "Gannet"), "agent_id": "slow"}
        ).json()
        assert saved["estimate_basis"] == "measured" and saved["estimated_extraction_s"] > BUDGET_S
        second = wait_status(client, saved["id"], timeout=600 / SCALE + 60)
    assert second["status"] == "done" and second["attempts"] == 1 and second["deferrals"] == 0
    assert all("error" not in c for c in second["extraction"]["calls"])


def test_a_bulk_import_waits_its_turn_without_churn(slow_fake, service_factory) -> None:
    svc = service_factory(slow_fake.url, env={"MEMORY_EXTRACT_BUDGET_S": f"{BUDGET_S:g}"})
    texts = [f"Batch note {n}: the Tern shipment {n} left dock {n + 10} on time." for n in range(12)]
    with svc.client("key-a", timeout=60) as client:
        ids = [client.post("/v1/remember", json={"text": t, "agent_id": "bulk"}).json()["id"] for t in texts]
        deadline = time.monotonic() + 600 / SCALE + 60
        memories = [wait_status(client, i, timeout=max(1.0, deadline - time.monotonic())) for i in ids]
    for memory in memories:
        assert memory["status"] == "done" and memory["attempts"] == 1 and memory["deferrals"] == 0
    # they ran in the order they were saved
    started = [m["timings"]["attempt"]["started_at"] for m in memories]
    assert started == sorted(started)
    assert memories[-1]["timings"]["attempt"]["queue_wait_s"] > memories[0]["timings"]["attempt"]["queue_wait_s"]


def test_the_estimate_before_any_measurement_comes_from_the_proven_build(service_factory, tmp_path) -> None:
    """`serve` that starts its own llama-server starts from the bootstrap's smoke-test speed, not a guess."""
    if os.environ.get("MEMORY_LLAMA_BIN"):
        pytest.skip("MEMORY_LLAMA_BIN: no proven record to start from")
    svc = service_factory(None, env={"MEMORY_MODEL": "default", "MEMORY_LLAMA_THREADS": "1"})
    with svc.client("key-a") as client:
        body = client.post("/v1/remember", json={"text": "The Skua report is due on 4 May.", "agent_id": "a"}).json()
    assert body["estimate_basis"] == "bootstrap smoke test"
    assert body["estimated_extraction_s"] is not None and body["estimated_extraction_s"] > 0


def test_a_long_text_cut_off_by_a_crash_resumes_after_the_chunks_already_done(
    slow_fake, service_factory, tmp_path
) -> None:
    env = {"MEMORY_EXTRACT_BUDGET_S": f"{BUDGET_S:g}"}
    data = tmp_path / "crash-data"
    svc = service_factory(slow_fake.url, data_dir=data, env=env)
    with svc.client("key-a", timeout=60) as client:
        memory_id = client.post("/v1/remember", json={"text": LONG_TEXT, "agent_id": "slow"}).json()["id"]
        deadline = time.monotonic() + 600 / SCALE + 60
        while True:
            body = client.get(f"/v1/memories/{memory_id}").json()
            if (body.get("progress") or {}).get("chunks_done", 0) >= 2:
                break
            assert body["status"] != "done" and time.monotonic() < deadline, body
            time.sleep(0.05)
    svc.kill()  # SIGKILL mid-text
    slow_fake.clear_requests()
    again = service_factory(slow_fake.url, data_dir=data, env=env)
    with again.client("key-a", timeout=60) as client:
        memory = wait_status(client, memory_id, timeout=600 / SCALE + 60)
    assert memory["status"] == "done" and memory["progress"] is None
    # the chunks extracted before the crash were not sent again, and their facts were kept
    resent = [r for r in slow_fake.recorded() if "Locker 1 in the" in str(r.get("messages"))]
    assert resent == []
    facts = " ".join(f["text"] for f in memory["facts"])
    assert "Locker 1 " in facts and "Locker 59 " in facts
