"""Repetition loops: a reply that repeats itself is stopped on the stream, its complete facts kept, the rest
asked again in smaller pieces; texts that merely repeat their structure (logs, tables, chat lines, notes)
are never cut.

The fake llama-server's `loop` mode plays what the default model did on doctor's probe: two facts, then
one span over and over until the output cap. It counts the tokens it really wrote before the client left.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from conftest import wait_status

from memory_service.extraction.errors import LoopedReply
from memory_service.extraction.loops import LoopGuard, find_loop
from memory_service.extraction.parsing import parse_facts
from memory_service.extraction.prompt import build_messages, facts_schema
from memory_service.llm.client import LlamaClient
from memory_service.ops.doctor_checks import probe_check
from tests.fakes.fake_llama_server import FakeLlamaServer, count_tokens

SPAN = "1,250,000 rows. Two alerts fired during the window: the queue depth on orders-worker peaked "
CAP = 384

LOG = "\n".join(
    f"2024-05-01T12:{m:02d}:{(7 * m) % 60:02d}Z INFO orders-worker: processed batch {m} ({400 + 13 * m} rows) "
    f"in {1 + m / 10:.1f}s, queue depth {8400 - 97 * m}"
    for m in range(1, 25)
)
TABLE = "| region | p95 latency | errors |\n|---|---|---|\n" + "\n".join(
    f"| eu-west-{n} | {110 + 7 * n} ms | {n * 3 % 11} |" for n in range(1, 30)
)
CHAT = "\n".join(
    f"{speaker}: {line}"
    for speaker, line in [
        ("Caroline", "I went to the LGBTQ support group yesterday and it was so powerful."),
        ("Melanie", "That sounds great! What happened at the group?"),
        ("Caroline", "The transgender stories were so inspiring, I was so happy and thankful."),
        ("Melanie", "Haha, lol, lol, that is so nice. I painted a lake sunrise last year."),
        ("Caroline", "Yes, yes, yes! I love it. I am thinking about counseling as a career."),
        ("Melanie", "Counseling would suit you. I am off to go swimming with the kids."),
    ]
    * 4
)
NOTES = "\n".join(
    f"- TODO: rotate the API key of service {s} before Friday (ticket OPS-{2290 + i})"
    for i, s in enumerate(["billing", "orders", "payments", "search", "mailer", "auth", "ledger", "reports"])
)
LOG_FACTS = json.dumps(
    {"facts": [f"On 2024-05-01 the orders-worker processed batch {m} of {400 + 13 * m} rows." for m in range(1, 13)]}
)
BENIGN = {"log": LOG, "table": TABLE, "chat": CHAT, "notes": NOTES, "facts from a log": LOG_FACTS}


def stream(text: str, piece: int = 3) -> LoopGuard:
    guard = LoopGuard()
    for i in range(0, len(text), piece):
        if guard.feed(text[i : i + piece]):
            break
    return guard


@pytest.mark.parametrize("name", sorted(BENIGN))
def test_texts_that_repeat_their_structure_are_never_cut(name: str) -> None:
    guard = stream(BENIGN[name])
    assert guard.loop is None, (name, guard.loop)


@pytest.mark.parametrize(
    "reply",
    [
        '{"facts": ["The billing service was upgraded to 4.2.1.", "The migration touched ' + SPAN * 4,
        '{"facts": [' + '"Tom Becker is the on-call engineer this week.", ' * 4,
        '{"facts": ["The counter read 0.' + "0" * 130,
    ],
)
def test_a_reply_repeating_one_span_is_caught_within_its_third_copy(reply: str) -> None:
    guard = stream(reply)
    assert guard.loop is not None
    caught_at = sum(len(p) for p in guard._parts)
    # caught early: at most a few tokens past the point where three copies (or 120 characters) exist
    first = find_loop(reply)
    assert first is not None and caught_at <= len(reply) - first.chars + max(120, 3 * first.period) + 8


def test_a_loop_keeps_the_complete_facts_before_it() -> None:
    reply = (
        '{"facts": ["The billing service was upgraded to 4.2.1.", "Maria Lopez approved it.", "It touched ' + SPAN * 3
    )
    with pytest.raises(LoopedReply) as info:
        parse_facts(reply, "loop")
    assert info.value.facts == ["The billing service was upgraded to 4.2.1.", "Maria Lopez approved it."]


def test_a_looping_reply_is_stopped_on_the_stream_long_before_its_cap() -> None:
    text = "The billing service was upgraded to 4.2.1. Maria Lopez approved the rollout. It touched rows."

    async def ask(url: str):  # type: ignore[no-untyped-def]
        client = LlamaClient(url)
        try:
            return await client.complete_json(
                build_messages(text), schema=facts_schema(12, 300), max_tokens=CAP, timeout_s=30
            )
        finally:
            await client.aclose()

    with FakeLlamaServer("loop", tokens_per_s=400) as fake:
        completion = asyncio.run(ask(fake.url))
        assert completion.finish_reason == "loop" and completion.loop is not None
        assert completion.loop["period"] == len(SPAN)
        written = fake.streamed[0]
        # stopped once the third copy was complete: the server writes on until it sees the client go, more of
        # them on a busy machine, so the bound is "far from the cap", not a token count
        head = '{"facts": ["The billing service was upgraded to 4.2.1.", "Maria Lopez approved the rollout.", "'
        assert count_tokens(head + SPAN * 2) < written < CAP // 2, written
        assert completion.timings["loops"] == 1 and completion.timings["predicted_n"] <= written
    with pytest.raises(LoopedReply) as info:
        parse_facts(completion.content, completion.finish_reason)
    assert info.value.facts == ["The billing service was upgraded to 4.2.1.", "Maria Lopez approved the rollout."]


# 8 sentences, ~110 tokens by the fake's tokenizer: the whole text loops, its halves (under 70) do not
TEXT = (
    "The billing service was upgraded to version 4.2.1 on staging. Maria Lopez approved the rollout for "
    "Thursday. The database migration took 37 minutes. The queue depth on orders-worker peaked at 8,400. "
    "The on-call engineer this week is Tom Becker. The API keys of the payments gateway rotate before Friday. "
    "Ticket OPS-2291 closes once the dashboards are green. Acme Corp wants a maintenance notice 48 hours ahead."
)
ENV = {"MEMORY_EXTRACT_CONTEXT_SAVES": "0", "MEMORY_MAX_ATTEMPTS": "2", "MEMORY_RETRY_BASE_S": "0.2"}


def test_a_looping_job_keeps_its_facts_and_asks_the_rest_in_smaller_pieces_without_spending_an_attempt(
    inprocess_service,
) -> None:
    assert 100 < count_tokens(TEXT) and count_tokens(TEXT) // 2 < 70
    with FakeLlamaServer("loop", tokens_per_s=2000) as fake:
        fake.set_mode("loop", loop_above=70)
        svc = inprocess_service(fake.url, env={**ENV, "MEMORY_METRICS_TOKEN": "scrape-token"})
        with svc.client("key-a") as client:
            response = client.post("/v1/remember", json={"text": TEXT, "agent_id": "ops"})
            assert response.status_code == 202, response.text
            memory = wait_status(client, response.json()["id"], timeout=30)
            # one attempt (the one that finished), no deferral, no error: the loop spent nothing
            assert memory["status"] == "done" and memory["attempts"] == 1 and not memory["deferrals"], memory
            assert not memory["last_error"], memory
            facts = " ".join(f["text"] for f in memory["facts"])
            # the two facts before the loop, and the later sentences from the pieces asked again
            for part in ("4.2.1", "Maria Lopez", "Tom Becker", "OPS-2291", "Acme Corp"):
                assert part in facts, (part, facts)
            assert memory["extraction"]["loops"] == 1, memory["extraction"]
            looped = [c for c in memory["extraction"]["calls"] if c.get("loop")]
            assert looped[0]["facts"] == 2 and looped[0]["loop"]["period"] == len(SPAN)
            assert len(memory["extraction"]["calls"]) >= 3  # the looping call, then the smaller pieces
            # a counter of the whole service (no team label): read with the scrape token
            metrics = client.get("/metrics", headers={"Authorization": "Bearer scrape-token"}).text
            assert "memory_llm_loops_total 1.0" in metrics, [
                m for m in metrics.splitlines() if m.startswith("memory_llm")
            ]
        # the looping reply was stopped early: far fewer tokens written than its cap
        assert fake.streamed and max(fake.streamed) < CAP // 2, fake.streamed


def test_a_smallest_piece_that_loops_before_any_fact_is_asked_once_more_with_dry_sampling(inprocess_service) -> None:
    with FakeLlamaServer("loop", tokens_per_s=2000) as fake:
        fake.set_mode("loop", loop_head=0, dry_breaks_loop=True)
        svc = inprocess_service(fake.url, env={**ENV, "MEMORY_MAX_ATTEMPTS": "1"})
        with svc.client("key-a") as client:
            response = client.post("/v1/remember", json={"text": "Tom Becker is on call.", "agent_id": "ops"})
            memory = wait_status(client, response.json()["id"], timeout=30)
        chats = fake.recorded()
    assert memory["status"] == "done" and [f["text"] for f in memory["facts"]] == ["Tom Becker is on call."], memory
    assert [c.get("dry_multiplier") for c in chats] == [None, 0.8]  # DRY only on the retry of the looping piece
    calls = memory["extraction"]["calls"]
    assert calls[0]["loop"] and calls[1]["sampling"]["dry_multiplier"] == 0.8 and calls[1]["facts"] == 1, calls


def test_a_smallest_piece_that_loops_before_any_fact_even_with_dry_spends_an_attempt(inprocess_service) -> None:
    with FakeLlamaServer("loop", tokens_per_s=2000) as fake:
        fake.set_mode("loop", loop_head=0)
        svc = inprocess_service(fake.url, env={**ENV, "MEMORY_MAX_ATTEMPTS": "1"})
        with svc.client("key-a") as client:
            response = client.post("/v1/remember", json={"text": "Tom Becker is on call.", "agent_id": "ops"})
            memory = wait_status(client, response.json()["id"], timeout=30)
        assert len(fake.recorded()) == 2 and all(n < CAP // 2 for n in fake.streamed), fake.streamed
    assert memory["status"] == "failed" and memory["last_error"].startswith("LoopedReply"), memory


def test_doctor_advice_for_a_looping_model_names_real_remedies() -> None:
    probe = {"valid": False, "error": "LoopedReply: reply stopped in a repetition loop", "raw_reply": SPAN * 2}
    check = probe_check(probe, 60.0, model="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    assert check.verdict == "FAIL"
    assert "--model default" not in check.fix and "--model large" in check.fix, check.fix
    bad = probe_check({**probe, "error": "BadReply: reply is not JSON"}, 60.0, model="qwen2.5-coder-0.5b-q4.gguf")
    assert "--model default" not in bad.fix and "--model large" in bad.fix, bad.fix


def test_the_fake_counts_what_it_streams() -> None:
    with FakeLlamaServer("ok", tokens_per_s=5000) as fake:
        body = {"messages": [{"role": "user", "content": "Tom is on call."}], "stream": True}
        httpx.post(fake.url + "/v1/chat/completions", json=body, timeout=10, trust_env=False)
        assert fake.streamed == [count_tokens(json.dumps({"facts": ["Tom is on call."]}))]


def test_a_think_block_is_not_watched_but_the_answer_after_it_is() -> None:
    thinking = "<think>\n" + "Okay, let me read the text carefully and decide which facts are worth keeping. " * 6
    assert stream(thinking).loop is None
    assert stream(thinking + "</think>\n" + '{"facts": ["It touched ' + SPAN * 4).loop is not None
