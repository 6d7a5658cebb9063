"""A reply cut short because the machine is slow is slowness, not bad output.

On a busy machine the output cap of a call shrinks with the measured generation speed (what the model can
write within MEMORY_EXTRACT_BUDGET_S). A reply cut at that lowered cap before any complete fact says
nothing about the model: the job waits like one whose smallest piece missed its window (no attempt spent)
and its facts come once the machine is fast again, with no Retry pressed. A reply cut at the full
configured cap (a model rambling or looping) stays a bad reply and spends an attempt.

The fake llama-server really writes at the speed it reports (40 tokens/s here, then 5000 tokens/s), and
cuts its reply at the request's max_tokens with finish_reason "length", as llama-server does.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
from conftest import eventually, wait_status

from tests.fakes.fake_llama_server import FakeLlamaServer, count_tokens

WARM = "The Heron archive moved to vault 12."
# one sentence of 62 tokens (by the fake's tokenizer, which the service counts with): as small as a text
# gets split, and its one fact, restated whole, needs about 72 tokens of reply
LONG = (
    "The Heron archive moved from the old basement store on Quay Street to vault 12 of the new records "
    "building, where the conservators keep the maps, the ledgers and the harbour master's letters at a "
    "steady cool temperature."
)
# At 40 tokens/s a 2 s window fits this text in one call (the expected answer is sized at half the text)
# but caps the reply at about 67 tokens: the fact is cut before its closing quote.
SLOW_TPS, FAST_TPS = 40.0, 5000.0
ENV = {
    "MEMORY_EXTRACT_BUDGET_S": "2",
    "MEMORY_MAX_ATTEMPTS": "2",
    "MEMORY_RETRY_BASE_S": "0.2",
    "MEMORY_EXTRACT_CONTEXT_SAVES": "0",
}
WAITING = "waiting for the model to be fast enough"
PAUSE_S = 8  # the first slowness pause (MEMORY_SLOW_PAUSE_S); the next one is twice as long
FULL_CAP = 384


def save(client: httpx.Client, text: str, agent: str) -> str:
    response = client.post("/v1/remember", json={"text": text, "agent_id": agent})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_a_reply_cut_at_the_cap_the_slow_machine_allows_waits_and_its_fact_comes_without_a_retry(
    inprocess_service,
) -> None:
    assert count_tokens(LONG) == 62
    with FakeLlamaServer("ok", n_ctx=2048, tokens_per_s=SLOW_TPS, prompt_tokens_per_s=20000) as fake:
        svc = inprocess_service(fake.url, env={**ENV, "MEMORY_SLOW_PAUSE_S": str(PAUSE_S)})
        with svc.client("key-a") as client:
            # a first save measures the machine: 40 tokens/s
            warm = wait_status(client, save(client, WARM, "warm"), timeout=30)
            assert warm["status"] == "done", warm
            fake.set_mode("ok", facts=[LONG])
            memory_id = save(client, LONG, "busy")

            def waiting_job() -> dict[str, Any] | None:
                memory = client.get(f"/v1/memories/{memory_id}").json()
                return memory if memory["deferrals"] or memory["attempts"] else None

            waiting = eventually("the job to wait (or fail)", waiting_job)
            ready = client.get("/ready").json()
            fake.set_mode("ok", tokens_per_s=FAST_TPS)  # the machine is free again
            recovered = time.monotonic()
            done = wait_status(client, memory_id, timeout=30)
            took = time.monotonic() - recovered
    cut = fake.recorded()[1]
    assert cut["max_tokens"] < FULL_CAP  # the cap was lowered to what 40 tokens/s writes in 2 s
    # while the machine was slow: waiting, not a bad reply, and no attempt spent
    assert waiting["status"] == "queued" and waiting["attempts"] == 0, waiting
    assert WAITING in (waiting["last_error"] or "") and "cut" in waiting["last_error"], waiting
    assert ready["jobs"]["deferred"] == 1 and ready["throughput"]["slower_than_budget_since"] is not None
    # once it was fast: extracted with no Retry, on the first attempt
    assert done["status"] == "done" and done["attempts"] == 1, done
    assert [f["text"] for f in done["facts"]] == [LONG]
    # the call that measured the machine fast again (still cut at the old cap) resumed the job at once: at
    # most the first pause went by, not also the doubled one (3 pauses); the margin either side is a pause,
    # so a busy machine's slower polling does not decide it
    assert took < 2 * PAUSE_S, took


def test_a_reply_cut_at_the_full_cap_is_a_bad_reply_and_spends_an_attempt(inprocess_service) -> None:
    # a fast machine: the cap is the configured one, and the model still writes past it (a loop, rambling)
    with FakeLlamaServer("ok", n_ctx=2048, tokens_per_s=FAST_TPS, facts=[LONG]) as fake:
        env = {**ENV, "MEMORY_MAX_OUTPUT_TOKENS": "50"}
        svc = inprocess_service(fake.url, env=env)
        with svc.client("key-a") as client:
            failed = wait_status(client, save(client, LONG, "rambling"), timeout=30)
    assert [r["max_tokens"] for r in fake.recorded()] == [50, 50]
    assert failed["status"] == "failed" and failed["attempts"] == 2 and failed["deferrals"] == 0, failed
    assert failed["last_error"].startswith("TruncatedReply"), failed


def test_a_machine_slow_for_longer_than_the_give_up_spends_attempts_again(inprocess_service) -> None:
    # slow for good: the cut replies wait doubling pauses (0.5 s, 1 s) while the model has been too slow for
    # less than MEMORY_SLOW_GIVE_UP_S; after that a cut spends an attempt, as a timeout does
    with FakeLlamaServer("ok", n_ctx=2048, tokens_per_s=SLOW_TPS, prompt_tokens_per_s=20000) as fake:
        env = {**ENV, "MEMORY_SLOW_PAUSE_S": "0.5", "MEMORY_SLOW_GIVE_UP_S": "4"}
        svc = inprocess_service(fake.url, env=env)
        with svc.client("key-a") as client:
            assert wait_status(client, save(client, WARM, "warm"), timeout=30)["status"] == "done"
            fake.set_mode("ok", facts=[LONG])
            failed = wait_status(client, save(client, LONG, "busy"), timeout=40)
    # a cut call measured the machine, but did not end the slow spell: the pauses grew and the give-up came
    assert failed["status"] == "failed" and failed["attempts"] == 2 and failed["deferrals"] == 2, failed
    assert failed["last_error"].startswith("CutBySpeed") and "MEMORY_EXTRACT_BUDGET_S=2" in failed["last_error"]
    assert all(r["max_tokens"] < FULL_CAP for r in fake.recorded()[1:])
