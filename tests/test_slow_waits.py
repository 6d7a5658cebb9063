"""A busy machine delays extraction, never fails it.

When even the smallest piece of a text cannot be read and answered within MEMORY_EXTRACT_BUDGET_S (three
llama-servers sharing two cores, a laptop compiling), the job waits a doubling pause instead of spending
its attempts, shows so on the job and in /ready, and is extracted once the machine is free again, with no
Retry pressed. The fake llama-server is "slow" (1 token/s) for its first calls, then answers at full speed.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import httpx
from conftest import eventually, wait_status

from memory_service.extraction.throughput import Throughput
from tests.fakes.fake_llama_server import FakeLlamaServer

FACT = "The Heron archive moved to vault 12."
ENV = {"MEMORY_EXTRACT_BUDGET_S": "1", "MEMORY_MAX_ATTEMPTS": "2"}
WAITING = "waiting for the model to be fast enough"


def save(client: httpx.Client, text: str) -> str:
    response = client.post("/v1/remember", json={"text": text, "agent_id": "busy"})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_a_machine_busy_for_a_while_delays_the_save_and_its_facts_come_without_a_retry(inprocess_service) -> None:
    # two calls too slow for the 1 s window (even for this one short sentence), then the machine is free
    with FakeLlamaServer("ok", n_ctx=2048, tokens_per_s=5000, facts=[FACT]) as fake:
        fake.set_mode("slow", recover_after=2)
        svc = inprocess_service(fake.url, env={**ENV, "MEMORY_SLOW_PAUSE_S": "1"})
        with svc.client("key-a") as client:
            memory_id = save(client, FACT)

            def deferred_in_ready() -> dict[str, Any] | None:
                ready = client.get("/ready").json()
                return ready if ready["jobs"].get("deferred") == 1 else None

            ready = eventually("/ready to count the deferred job", deferred_in_ready)
            waiting = client.get(f"/v1/memories/{memory_id}").json()
            done = wait_status(client, memory_id, timeout=30)
            after = client.get("/ready").json()
    # while the machine was busy: waiting, not failed, and no attempt spent
    assert ready["throughput"]["slower_than_budget_since"] is not None
    assert waiting["attempts"] == 0 and WAITING in (waiting["last_error"] or ""), waiting
    # once it was free: extracted with no Retry, on the first attempt, after two waits
    assert done["status"] == "done" and done["attempts"] == 1 and done["deferrals"] == 2, done
    assert [f["text"] for f in done["facts"]] == [FACT]
    assert after["jobs"]["deferred"] == 0 and after["throughput"]["slower_than_budget_since"] is None
    assert len(fake.recorded()) == 3  # two cut at their deadline, one answered


def test_a_call_that_fits_elsewhere_ends_the_wait_before_the_pause_does(inprocess_service) -> None:
    # a pool: the first server stays too slow, the second comes up a moment later; a save it extracts
    # shows the model fits the budget again, so the waiting job goes at once, not after its 60 s pause
    with (
        FakeLlamaServer("slow", n_ctx=2048, tokens_per_s=5000, facts=[FACT]) as busy,
        FakeLlamaServer("loading", n_ctx=2048, tokens_per_s=5000, facts=[FACT]) as free,
    ):
        free_url = free.url
        svc = inprocess_service(f"{busy.url},{free_url}", env={**ENV, "MEMORY_SLOW_PAUSE_S": "60"})
        with svc.client("key-a") as client:
            first = save(client, FACT)
            waiting = eventually(
                "the job to wait",
                lambda: (
                    (m := client.get(f"/v1/memories/{first}").json())["deferrals"] and m["status"] == "queued" and m
                ),
            )
            free.set_mode("ok")
            eventually(
                "the second server to be up",
                lambda: all(s["reachable"] for s in client.get("/ready").json()["model_servers"]),
            )
            second = wait_status(client, save(client, "The Heron archive is audited every March."), timeout=20)
            started = time.monotonic()
            done = wait_status(client, first, timeout=20)
    assert waiting["attempts"] == 0 and WAITING in waiting["last_error"]
    assert second["status"] == "done"
    assert done["status"] == "done" and done["attempts"] == 1 and done["deferrals"] == 1, done
    assert done["timings"]["attempt"]["server"] == free_url
    assert time.monotonic() - started < 20  # well before the 60 s pause: resumed by the call that fitted


def test_the_pause_doubles_up_to_its_cap_and_ends_with_a_call_that_fits() -> None:
    throughput = Throughput()
    assert throughput.snapshot()["slower_than_budget_since"] is None
    pauses = [throughput.too_slow(1000.0 + i, 60.0, 300.0) for i in range(5)]
    assert pauses == [60.0, 120.0, 240.0, 300.0, 300.0]
    # the model is tried again (with any due job) after the first pause, whatever the job's own pause
    assert throughput.paused_for(1004.0) == 60.0 and throughput.slow_for(1010.0) == 10.0
    assert throughput.snapshot()["slower_than_budget_since"] == 1000.0
    throughput.observe({"prompt_per_second": 50.0, "prompt_n": 40, "predicted_per_second": 10.0, "predicted_n": 8})
    assert throughput.slow_for(1010.0) is None and throughput.paused_for(1004.0) == 0.0
    assert throughput.too_slow(2000.0, 60.0, 300.0) == 60.0  # a new busy spell starts from the first pause


def test_the_wait_is_stored_on_the_job_and_kept_across_a_restart(inprocess_service, tmp_path) -> None:
    data = tmp_path / "data"
    with FakeLlamaServer("slow", n_ctx=2048, tokens_per_s=5000, facts=[FACT]) as fake:
        env = {**ENV, "MEMORY_SLOW_PAUSE_S": "3"}
        first = inprocess_service(fake.url, data_dir=data, env=env)
        with first.client("key-a") as client:
            memory_id = save(client, FACT)
            waiting = eventually(
                "the job to wait",
                lambda: (m := client.get(f"/v1/memories/{memory_id}").json())["deferrals"] and m,
            )
        first.stop()
        fake.set_mode("ok")
        again = inprocess_service(fake.url, data_dir=data, env=env)
        with again.client("key-a") as client:
            done = wait_status(client, memory_id, timeout=30)
    assert waiting["status"] == "queued" and waiting["attempts"] == 0, waiting
    assert done["status"] == "done" and done["attempts"] == 1 and done["deferrals"] == 1, done
    # the restarted service kept the pause written on the job: it took the job no sooner
    resumed_at = datetime.fromisoformat(waiting["next_attempt_at"]).timestamp()
    assert done["timings"]["attempt"]["started_at"] >= resumed_at - 0.01
