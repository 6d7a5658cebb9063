"""Every field failure, injected: the real service (in this process, over HTTP) against the fault-injecting fake.

One test per failure mode seen running agents on small local models. Each asserts behaviour the service
shows on the job (`GET /v1/memories/{id}`: status, attempts, last_error, raw_reply, timings,
extraction report) or on what the fake received — never the test's own wall-clock.

One fake and one service are shared by the module (starting the service loads the embedder): each
test sets the fake's mode first and leaves no job running behind it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import wait_status
from inprocess import InProcessService

from memory_service.extraction.errors import BadReply
from memory_service.extraction.parsing import parse_facts
from memory_service.extraction.prompt import SYSTEM_PROMPT
from tests.fakes.fake_llama_server import FakeLlamaServer, count_tokens, render_chatml

BUDGET_S = 3.0
MAX_ATTEMPTS = 2
N_CTX = 2048
FAST = 5000.0  # fake tokens/s when speed is not the point
DEFAULTS: dict[str, Any] = {
    "tokens_per_s": FAST,
    "think_tokens": 8000,
    "facts": None,
    "reasoning_tokens": 200,
    "empty_think": False,
    "tool_style": "hermes",
    "drop_style": "close",
    "content": None,
    "fail_count": 2,
    "prompt_tokens_per_s": None,
}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLlamaServer]:
    with FakeLlamaServer("ok", n_ctx=N_CTX, tokens_per_s=FAST) as server:
        yield server


@pytest.fixture(scope="module")
def service(fake: FakeLlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    env = {
        "MEMORY_EXTRACT_BUDGET_S": str(BUDGET_S),
        "MEMORY_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
        "MEMORY_RETRY_BASE_S": "0.2",
        # a model too slow for the budget fails here as an error would (tests/test_slow_waits.py: it waits)
        "MEMORY_SLOW_GIVE_UP_S": "0",
    }
    svc = InProcessService(tmp_path_factory.mktemp("faults") / "data", fake.url, env).start()
    yield svc
    svc.stop()


@pytest.fixture
def client(service: InProcessService) -> Iterator[httpx.Client]:
    with service.client("key-a") as c:
        yield c


def set_fake(fake: FakeLlamaServer, mode: str, **options: Any) -> None:
    """Switch mode with every option reset, so no test inherits another's settings."""
    fake.set_mode(mode, **{**DEFAULTS, **options})


def save(client: httpx.Client, text: str, agent_id: str = "faults") -> str:
    response = client.post("/v1/remember", json={"text": text, "agent_id": agent_id})
    assert response.status_code == 202, response.text
    body = response.json()
    # the save is acked with an estimate of when it will be extracted, or says honestly that none exists yet
    if body["estimated_extraction_s"] is None:
        assert body["estimate_basis"].startswith("unknown")
    else:
        assert body["estimated_extraction_s"] > 0 and body["estimate_basis"] in ("measured", "lowered after a timeout")
    return body["id"]


def requests_for(fake: FakeLlamaServer, marker: str) -> list[dict[str, Any]]:
    """The chat requests the fake received whose text contains `marker`."""
    return [r for r in fake.recorded() if marker in json.dumps(r.get("messages"))]


def fact_texts(memory: dict[str, Any]) -> list[str]:
    return [f["text"] for f in memory["facts"]]


def recall(client: httpx.Client, query: str, **body: Any) -> list[dict[str, Any]]:
    response = client.post("/v1/recall", json={"query": query, "k": 10, **body})
    assert response.status_code == 200, response.text
    return response.json()["items"]


def wait_until(client: httpx.Client, memory_id: str, check, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        body = client.get(f"/v1/memories/{memory_id}").json()
        if check(body):
            return body
        time.sleep(0.05)
    raise AssertionError(f"condition not reached for {memory_id}: {body}")


# --------------------------------------------------------------------------- thinking


def test_thinking_model_without_the_kwarg_exceeds_the_budget_and_with_it_completes(
    fake: FakeLlamaServer, client: httpx.Client
) -> None:
    set_fake(fake, "thinking", tokens_per_s=400, think_tokens=8000)
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "Text:\nThe Kestrel report is due on Monday."},
    ]
    # Without the kwarg, as the field's bridge sent it: capped, the whole output is thinking ...
    capped = httpx.post(
        f"{fake.url}/v1/chat/completions", json={"messages": messages, "max_tokens": 384}, timeout=BUDGET_S
    ).json()["choices"][0]
    assert capped["finish_reason"] == "length" and capped["message"]["content"].startswith("<think>")
    with pytest.raises(BadReply, match="still thinking"):
        parse_facts(capped["message"]["content"], capped["finish_reason"])
    # ... and uncapped, 8,000 thinking tokens do not fit the budget at all.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{fake.url}/v1/chat/completions", json={"messages": messages}, timeout=BUDGET_S)

    memory_id = save(client, "The Kestrel report is due on Monday. Dana Whitfield owns the Kestrel report.")
    memory = wait_status(client, memory_id, timeout=30)
    assert memory["status"] == "done" and memory["attempts"] == 1
    assert "Dana Whitfield owns the Kestrel report." in fact_texts(memory)
    sent = requests_for(fake, "Kestrel report is due on Monday. Dana")
    assert len(sent) == 1
    assert all(r["chat_template_kwargs"] == {"enable_thinking": False} for r in sent)
    assert all(r["temperature"] == 0 and r["cache_prompt"] is True and 0 < r["max_tokens"] <= 384 for r in sent)
    assert all(r["response_format"]["type"] == "json_schema" for r in sent)
    assert memory["extraction"]["calls"][0]["reasoning_chars"] == 0

    # Qwen3 with thinking off still emits an empty think block first: stripped, not a failure.
    set_fake(fake, "thinking", tokens_per_s=400, empty_think=True)
    memory = wait_status(client, save(client, "The Kestrel archive lives in bucket kestrel-cold."), timeout=30)
    assert fact_texts(memory) == ["The Kestrel archive lives in bucket kestrel-cold."]


@pytest.mark.parametrize(
    ("mode", "label"),
    [("unclosed_think", "Lapwing"), ("think_then_json", "Curlew"), ("reasoning_content", "Godwit")],
)
def test_think_blocks_and_reasoning_content_yield_clean_facts(
    fake: FakeLlamaServer, client: httpx.Client, mode: str, label: str
) -> None:
    set_fake(fake, mode, reasoning_tokens=100)
    text = f"The {label} probe ships to Vilnius. The {label} probe weighs 12 kilograms."
    memory = wait_status(client, save(client, text), timeout=30)
    assert memory["status"] == "done"
    assert sorted(fact_texts(memory)) == sorted(
        [f"The {label} probe ships to Vilnius.", f"The {label} probe weighs 12 kilograms."]
    )
    assert not any("think" in f.lower() or "let me" in f.lower() for f in fact_texts(memory))


@pytest.mark.parametrize(
    ("mode", "options", "error"),
    [
        ("unclosed_think", {"reasoning_tokens": 3000}, "still thinking"),  # never closes within the cap
        ("reasoning_only", {"reasoning_tokens": 50}, "only in reasoning_content"),
    ],
)
def test_thinking_that_never_answers_is_a_visible_failure_not_an_empty_success(
    fake: FakeLlamaServer, client: httpx.Client, mode: str, options: dict[str, Any], error: str
) -> None:
    set_fake(fake, mode, **options)
    memory = wait_status(client, save(client, f"The {mode} failure case concerns the Osprey gateway."), timeout=30)
    assert memory["status"] == "failed" and memory["attempts"] == MAX_ATTEMPTS
    assert error in memory["last_error"]
    assert memory["raw_reply"], "what the model said is kept for inspection"
    assert memory["facts"] == []


# --------------------------------------------------------------------------- time budget


@pytest.mark.parametrize("mode", ["hang", "slow"])
def test_hung_or_slow_model_is_cut_at_the_deadline_and_the_save_is_kept(
    fake: FakeLlamaServer, client: httpx.Client, mode: str
) -> None:
    set_fake(fake, mode)
    word = f"pelican{mode}"
    memory = wait_status(client, save(client, f"The {word} ledger is stored in vault 7."), timeout=30)
    assert memory["status"] == "failed" and memory["attempts"] == MAX_ATTEMPTS
    assert memory["last_error"].startswith("LlmTimeout")
    # one sentence can't be split further: the failure says what would fix it
    assert "MEMORY_EXTRACT_BUDGET_S" in memory["last_error"] and "as small as the text splits" in memory["last_error"]
    attempt = memory["timings"]["attempt"]
    # the attempt ended at its deadline, by the job's own clock: not before it, not long after
    assert -0.05 <= attempt["overrun_s"] <= 0.5, attempt
    assert attempt["ended_at"] - attempt["started_at"] <= BUDGET_S + 0.5
    # the request's own timeout was what was left of the budget
    call = memory["extraction"]["calls"][0]
    assert call["error"] == "LlmTimeout" and 0 < call["timeout_s"] <= BUDGET_S
    items = recall(client, f"{word} ledger", kinds=["passage"])
    assert memory["id"] in [item["memory_id"] for item in items]


def test_recall_answers_while_the_model_hangs(fake: FakeLlamaServer, client: httpx.Client) -> None:
    set_fake(fake, "hang")
    fake.clear_requests()
    memory_id = save(client, "The albatross runbook says to page the storage team first.")
    wait_until(client, memory_id, lambda m: m["status"] == "extracting")
    deadline = time.monotonic() + 30
    while not any("albatross" in json.dumps(r) for r in fake.recorded()):  # the model has the call: it hangs
        assert time.monotonic() < deadline, "the worker never called the model"
        time.sleep(0.05)
    # the keyword leg finds the text the moment it is saved; its passage vector follows from the indexer
    # moments later (longer on a slow machine), and then the passage ranks first
    deadline = time.monotonic() + 60
    while True:
        items = recall(client, "albatross runbook")
        assert memory_id in [item["memory_id"] for item in items], items
        if items[0]["memory_id"] == memory_id and items[0]["kind"] == "passage":
            break
        assert time.monotonic() < deadline, items
        time.sleep(0.1)
    # recall came back while extraction was still stuck on the model
    assert client.get(f"/v1/memories/{memory_id}").json()["status"] == "extracting"
    set_fake(fake, "ok")  # the retry (a fresh budget) succeeds
    memory = wait_status(client, memory_id, timeout=30)
    assert memory["status"] == "done" and memory["attempts"] == 2
    assert fact_texts(memory) == ["The albatross runbook says to page the storage team first."]


def test_a_queued_job_gets_its_window_at_the_head_of_the_queue_not_from_its_save(
    fake: FakeLlamaServer, client: httpx.Client
) -> None:
    # The slot is busy with a long save: 4+ chunks at ~1.5 s each, every call within its own budget.
    set_fake(fake, "ok", tokens_per_s=50)
    long_text = " ".join(f"Gannet crate {n} sits on shelf {n * 3}." for n in range(1, 600))
    first = client.post("/v1/remember", json={"text": long_text, "agent_id": "faults"}).json()
    second = client.post(
        "/v1/remember", json={"text": "The Gannet follow-up note lists 3 owners.", "agent_id": "faults"}
    ).json()
    # the saver is told about the backlog ahead of it
    assert second["queue_depth"] == 2
    assert second["estimated_extraction_s"] > first["estimated_extraction_s"] > 0
    # It waited longer than a whole budget behind the long save, and was still not deferred or charged:
    # its window opened when it reached the head of the queue.
    waited = wait_status(client, second["id"], timeout=90)
    assert waited["status"] == "done" and waited["deferrals"] == 0 and waited["attempts"] == 1
    assert fact_texts(waited) == ["The Gannet follow-up note lists 3 owners."]
    attempt = waited["timings"]["attempt"]
    assert attempt["queue_wait_s"] > BUDGET_S and attempt["overrun_s"] < 0
    assert len(requests_for(fake, "Gannet follow-up")) == 1
    busy = wait_status(client, first["id"], timeout=90)
    assert busy["status"] == "done" and busy["extraction"]["chunks"] >= 4 and busy["attempts"] == 1
    assert busy["timings"]["attempt"]["elapsed_s"] > BUDGET_S  # longer than one budget, in windows of one budget
    for call in busy["extraction"]["calls"]:
        assert call["timeout_s"] <= BUDGET_S and "error" not in call


# --------------------------------------------------------------------------- server errors


@pytest.mark.parametrize(
    ("mode", "options", "error"),
    [
        ("http_500", {}, "answered 500"),
        ("drop", {"drop_style": "close"}, "LlmUnavailable"),
        ("drop", {"drop_style": "partial"}, "LlmUnavailable"),
    ],
)
def test_server_errors_and_dropped_connections_retry_then_fail_visibly(
    fake: FakeLlamaServer, client: httpx.Client, mode: str, options: dict[str, Any], error: str
) -> None:
    set_fake(fake, mode, **options)
    marker = f"Cormorant {mode} {options.get('drop_style', '')}".strip()
    memory = wait_status(client, save(client, f"The {marker} service restarts nightly."), timeout=30)
    assert memory["status"] == "failed" and memory["attempts"] == MAX_ATTEMPTS
    assert error in memory["last_error"]
    assert len(requests_for(fake, marker)) == MAX_ATTEMPTS, "one request per attempt, then it stopped"
    assert memory["id"] in [i["memory_id"] for i in recall(client, f"{marker} restarts nightly", kinds=["passage"])]


def test_transient_500_is_retried_to_success(fake: FakeLlamaServer, client: httpx.Client) -> None:
    set_fake(fake, "fail_then_ok", fail_count=1)
    memory = wait_status(client, save(client, "The Shearwater backup runs at 02:00."), timeout=30)
    assert memory["status"] == "done" and memory["attempts"] == 2
    assert fact_texts(memory) == ["The Shearwater backup runs at 02:00."]


def test_model_server_down_waits_without_spending_attempts(fake: FakeLlamaServer, client: httpx.Client) -> None:
    set_fake(fake, "loading")
    memory_id = save(client, "The Petrel dashboard moved to port 8443.")
    waiting = wait_until(client, memory_id, lambda m: "unreachable" in (m["last_error"] or ""))
    assert waiting["status"] == "queued" and waiting["attempts"] == 0
    set_fake(fake, "ok")
    memory = wait_status(client, memory_id, timeout=30)
    assert memory["status"] == "done" and memory["attempts"] == 1


# --------------------------------------------------------------------------- output format


@pytest.mark.parametrize(
    ("mode", "options", "error", "raw"),
    [
        ("tool_call", {"tool_style": "hermes"}, "tool-call markup", "<tool_call>"),
        ("tool_call", {"tool_style": "qwen_xml"}, "tool-call markup", "<function="),
        ("malformed", {}, "not JSON", "Here are the facts:"),
    ],
)
def test_tool_call_or_prose_reply_is_a_visible_parse_failure_with_the_raw_reply(
    fake: FakeLlamaServer, client: httpx.Client, mode: str, options: dict[str, Any], error: str, raw: str
) -> None:
    set_fake(fake, mode, **options)
    marker = f"Gull {mode} {options.get('tool_style', '')}".strip()
    memory = wait_status(client, save(client, f"The {marker} tracker is archived."), timeout=30)
    assert memory["status"] == "failed" and memory["attempts"] == MAX_ATTEMPTS
    assert memory["last_error"].startswith("BadReply") and error in memory["last_error"]
    assert raw in memory["raw_reply"]
    assert memory["facts"] == []


def test_reply_cut_at_the_output_cap_keeps_complete_facts_and_says_so(
    fake: FakeLlamaServer, client: httpx.Client
) -> None:
    set_fake(fake, "truncated")
    sentences = [f"The Skua depot {n} holds {n * 11} pallets." for n in range(1, 5)]
    memory = wait_status(client, save(client, " ".join(sentences)), timeout=30)
    assert memory["status"] == "done"
    kept = fact_texts(memory)
    assert 0 < len(kept) < len(sentences) and set(kept) <= set(sentences)
    assert memory["extraction"]["truncated_calls"] == 1
    assert memory["extraction"]["calls"][0]["finish_reason"] == "length"


# --------------------------------------------------------------------------- context size


def test_long_text_is_chunked_to_fit_a_small_context(fake: FakeLlamaServer, client: httpx.Client) -> None:
    set_fake(fake, "ok")
    parts, n = [], 0
    while len(" ".join(parts).encode()) < 40 * 1024:
        n += 1
        parts.append(f"Crate {n} of the Tern shipment sits on shelf {n * 3}.")
    text = " ".join(parts)
    memory = wait_status(client, save(client, text), timeout=60)
    assert memory["status"] == "done", memory["last_error"]
    report = memory["extraction"]
    assert report["n_ctx"] == N_CTX and report["chunks"] >= 5 and len(report["calls"]) == report["chunks"]
    sent = requests_for(fake, "of the Tern shipment")
    assert len(sent) == report["chunks"]
    for request in sent:  # every request fits the server's context: no 400 from the fake
        prompt = render_chatml(request["messages"], empty_think=True)
        assert count_tokens(prompt) + request["max_tokens"] <= N_CTX
    facts = {f["text"]: f for f in memory["facts"]}
    assert "Crate 1 of the Tern shipment sits on shelf 3." in facts
    last_chunk_start = report["calls"][-1]["start"]
    late = [f for f in memory["facts"] if f["spans"][0][0] >= last_chunk_start]
    assert late, "facts from the last chunk were extracted too"
    for fact in late:  # provenance spans point into the original text, not into the chunk
        [(start, end)] = fact["spans"]
        assert text[start:end] == fact["text"]
    assert memory["timings"]["prompt_n"] > 0 and "cache_n" in memory["timings"]


# --------------------------------------------------------------------------- grounding and dedup


def test_ungrounded_facts_are_rejected_counted_and_kept_on_the_job(fake: FakeLlamaServer, client: httpx.Client) -> None:
    invented_number = "The Plover budget is 9,999 dollars."
    invented_name = "Zorblax Quentin approved the Plover plan."
    set_fake(fake, "ok", facts=["The Plover plan was approved by Ines.", invented_number, invented_name])
    memory = wait_status(client, save(client, "The Plover plan was approved by Ines. The budget is 400 dollars."))
    assert fact_texts(memory) == ["The Plover plan was approved by Ines."]
    rejected = {r["text"]: r["reason"] for r in memory["rejected_facts"]}
    assert "9999" in rejected[invented_number] and "numbers" in rejected[invented_number]
    assert "zorblax" in rejected[invented_name]
    assert memory["extraction"]["proposed"] == 3
    assert not [i for i in recall(client, "Plover budget 9,999", kinds=["fact"]) if "9,999" in i["text"]]


def test_small_talk_skips_the_model_and_stays_recallable(fake: FakeLlamaServer, client: httpx.Client) -> None:
    set_fake(fake, "ok")
    fake.clear_requests()
    memory = wait_status(client, save(client, "Haha, thanks Wren, talk soon!"))
    assert memory["status"] == "done" and memory["facts"] == [] and memory["attempts"] == 1
    assert memory["extraction"]["skipped"] == "small talk" and memory["extraction"]["calls"] == []
    assert requests_for(fake, "talk soon") == []  # no model call
    items = recall(client, "thanks Wren talk soon", kinds=["passage"])
    assert memory["id"] in [item["memory_id"] for item in items]


def test_small_talk_that_reaches_the_model_yields_no_facts(fake: FakeLlamaServer, client: httpx.Client) -> None:
    # a name that is not the listener's keeps the gate conservative: the model is asked, grounding drops it
    set_fake(fake, "ok", facts=["Haha, thanks, talk soon!"])
    memory = wait_status(client, save(client, "Haha, thanks, Wren said: talk soon!"))
    assert memory["status"] == "done" and memory["facts"] == []
    assert any("small talk" in r["reason"] for r in memory["rejected_facts"])


def test_exact_duplicates_are_stored_once_with_all_sources(fake: FakeLlamaServer, client: httpx.Client) -> None:
    set_fake(fake, "ok")
    shared = "The Avocet cluster runs in Tallinn."
    one = wait_status(client, save(client, f"{shared} It was set up by Ravi."))
    two = wait_status(client, save(client, f"{shared} Its on-call rota changes weekly."))
    [fact_one] = [f for f in one["facts"] if f["text"] == shared]
    [fact_two] = [f for f in two["facts"] if f["text"] == shared]
    assert fact_one["id"] == fact_two["id"] and two["extraction"]["merged"] == 1
    hits = [i for i in recall(client, "Avocet cluster Tallinn", kinds=["fact"]) if i["fact_id"] == fact_one["id"]]
    assert len(hits) == 1 and set(hits[0]["source_memory_ids"]) == {one["id"], two["id"]}


def test_near_duplicates_merge(fake: FakeLlamaServer, client: httpx.Client) -> None:
    set_fake(fake, "ok")
    one = wait_status(client, save(client, "The Dunlin team deploys on Fridays."))
    two = wait_status(client, save(client, "The Dunlin team deploys on Friday."))
    assert two["extraction"]["merged"] == 1 and two["extraction"]["stored"] == 0
    assert [f["id"] for f in two["facts"]] == [f["id"] for f in one["facts"]]
    hits = [i for i in recall(client, "Dunlin team deploys", kinds=["fact"]) if "Dunlin" in i["text"]]
    assert len(hits) == 1 and set(hits[0]["source_memory_ids"]) == {one["id"], two["id"]}


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("The Heron build budget is 500 dollars.", "The Heron build budget is 700 dollars."),  # same shape
        ("The Heron cluster has 12 nodes.", "The cluster Heron has 16 nodes in total."),  # near-duplicate wording
    ],
)
def test_a_changed_value_supersedes_the_old_fact(
    fake: FakeLlamaServer, client: httpx.Client, old: str, new: str
) -> None:
    set_fake(fake, "ok")
    first = wait_status(client, save(client, old))
    second = wait_status(client, save(client, new))
    [new_fact] = second["facts"]
    assert new_fact["text"] == new and second["extraction"]["superseded"] == 1
    history = client.get(f"/v1/memories/{first['id']}").json()["facts"]
    assert [(f["text"], f["superseded_by"]) for f in history] == [(old, new_fact["id"])]
    texts = [i["text"] for i in recall(client, old, kinds=["fact"])]
    assert new in texts and old not in texts


# --------------------------------------------------------------------------- the server changes under us
# (last in the module: they move the service's measured speed and context size, and put them back)


def test_a_model_too_slow_for_any_window_is_still_tried_not_deferred_forever(inprocess_service) -> None:
    # 12 tokens/s from the first reply on: a minimal 48-token answer alone needs 4 s, more than the
    # whole 3 s budget, so deferring "until there is enough time" would spin forever and never re-measure.
    with FakeLlamaServer("ok", n_ctx=N_CTX, tokens_per_s=12, facts=["The Kite is red."]) as slow_fake:
        svc = inprocess_service(
            slow_fake.url, env={"MEMORY_EXTRACT_BUDGET_S": str(BUDGET_S), "MEMORY_MAX_ATTEMPTS": str(MAX_ATTEMPTS)}
        )
        with svc.client("key-a") as slow_client:
            wait_status(slow_client, save(slow_client, "The Kite is red."), timeout=30)  # measured: 12 tokens/s
            memory = wait_status(slow_client, save(slow_client, "The Kite is red, said its owner."), timeout=30)
        svc.stop()
    assert memory["status"] == "done" and memory["deferrals"] == 0 and memory["attempts"] == 1
    assert fact_texts(memory) == ["The Kite is red."]


def test_a_server_restarted_with_a_smaller_context_is_reread_and_the_job_fits(
    fake: FakeLlamaServer, client: httpx.Client
) -> None:
    set_fake(fake, "ok", n_ctx=1024)  # llama-server restarted with -c 1024; the service still believes 2048
    text = " ".join(f"Locker {n} of the Ibis depot holds {n * 5} boxes." for n in range(1, 120))
    try:
        memory = wait_status(client, save(client, text), timeout=60)
        assert memory["status"] == "done", memory["last_error"]
        assert memory["attempts"] == 2 and memory["extraction"]["n_ctx"] == 1024
        first, *later = requests_for(fake, "of the Ibis depot")
        assert count_tokens(render_chatml(first["messages"], empty_think=True)) + first["max_tokens"] > 1024
        for request in later:  # after re-reading /props, every request fits
            assert count_tokens(render_chatml(request["messages"], empty_think=True)) + request["max_tokens"] <= 1024
    finally:
        set_fake(fake, "ok", n_ctx=N_CTX)
        client.get("/ready")  # re-read /props
