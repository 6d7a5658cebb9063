"""Token-budgeted recall: `max_tokens` bounds the `context` by the counter the answer names, and its lines
are the best items in rank order that fit, each source said once.

In process with real storage. The estimate: the app with no model server. The model's count: a service whose
llama-server is the fake (its /tokenize is the tokenizer), or a real HTTP server whose /tokenize hangs.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from conftest import wait_status
from fakes.fake_llama_server import FakeLlamaServer, count_tokens

from memory_service.client import AsyncMemoryClient, MemoryClient
from memory_service.contract.models import RecallResponse
from memory_service.recall.context import estimate_tokens

TEXTS = [
    ("scout", "The spare key for the depot is under the blue flowerpot by the back door."),
    ("scout", "Depot 7 opens at 06:30 on weekdays; on Saturday at 08:00, closed on Sunday."),
    ("courier", "Invoice INV-20931 for the depot repair was paid on 2026-02-14, 1,240.50 EUR."),
    ("courier", "The depot manager is Ingrid Larsen; call her on +47 915 22 048 for access."),
    ("scout", "A long note about the depot: " + "the forklift needs a new battery and the roof leaks. " * 12),
    ("planner", "Depot visits are planned on Tuesdays; the depot has 3 loading bays."),
    ("scout", "Depot key: blue pot."),
]
BUDGETS = (32, 40, 64, 120, 400)
# the fake's and the model's counts are what is checked: on a loaded test machine they may take over 200 ms
PATIENT = {"MEMORY_RECALL_TOKENIZE_TIMEOUT_S": "5"}


def recall(client: Any, **body: Any) -> dict[str, Any]:
    # min_score -1: every text, however weak its match (unembedded here, a text holding only "depot" is below the
    # relevance floor's share of the query's words)
    body = {"query": "depot key access battery", "k": 20, "min_score": -1, **body}
    response = client.post("/v1/recall", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def lines(answer: dict[str, Any]) -> list[str]:
    return answer["context"].split("\n") if answer["context"] else []


def check_fits(full: dict[str, Any], fitted: dict[str, Any], budget: int, count: Any) -> None:
    """Within the budget by the reported counter; each item is said in the context, in the order the
    context says them; and an item the full context says but this one leaves out would not have fitted: a line with
    its separator, or a fact joined to its memory's line (`; text`) when that line is in."""
    assert fitted["tokens"] == count(fitted["context"]) <= budget, (budget, fitted)
    where = [fitted["context"].find(" ".join(item["text"].split())) for item in fitted["items"]]
    assert -1 not in where, "an item the context does not say"
    assert where == sorted(where), "items not in the order the context says them"
    kept_lines = lines(fitted)
    for item in full["items"]:
        body = " ".join(item["text"].split())
        if body in fitted["context"]:
            continue
        head = next((line for line in lines(full) if line.split("] ", 1)[1].startswith(body)), None)
        if head is not None:  # a line of its own in the full context
            line = head.split("; ")[0] if item["kind"] == "fact" else head
            assert count(fitted["context"]) + count(line) + 1 > budget, (budget, line, fitted["context"])
        elif "; " + body in full["context"]:  # a fact on its memory's line
            of_line = next(line for line in lines(full) if ("; " + body) in line)
            if any(of_line.startswith(k.split("; ")[0]) for k in kept_lines):
                assert count(fitted["context"]) + count("; " + body) > budget, (budget, body, fitted["context"])


@pytest.fixture(scope="module")
def saved(inprocess) -> Any:
    """The texts saved by team-a (found by keyword search at once; no model, no worker)."""
    with inprocess.client() as client:
        for agent, text in TEXTS:
            assert client.post("/v1/remember", json={"text": text, "agent_id": agent}).status_code == 202
    return inprocess


def test_estimate_never_exceeds_the_budget_and_keeps_the_best_that_fit(saved):
    with saved.client() as client:
        full = recall(client)
        assert full["tokens"] is None and full["token_counter"] is None  # no budget: nothing counted
        assert len(lines(full)) == len(full["items"]) == len(TEXTS)
        for budget in BUDGETS:
            fitted = recall(client, max_tokens=budget)
            assert fitted["token_counter"] == "estimate"  # no model server is up
            check_fits(full, fitted, budget, estimate_tokens)
        assert recall(client, max_tokens=32)["items"], "a short line fits in the smallest budget"
        assert recall(client, max_tokens=4000)["items"] == full["items"]  # all fit: the same answer


def test_context_lines_are_dated_and_attributed(saved):
    with saved.client() as client:
        response = client.post(
            "/v1/remember",
            json={
                "text": "The depot alarm code changed to 5512.",
                "agent_id": "guard",
                "occurred_at": "2025-11-03T22:10:00Z",
            },
        )
        assert response.status_code == 202
        answer = client.post("/v1/recall", json={"query": "depot alarm code", "k": 3, "min_score": -1}).json()
    first = answer["items"][0]
    assert first["text"] == "The depot alarm code changed to 5512."
    assert lines(answer)[0] == "[2025-11-03 guard] The depot alarm code changed to 5512."  # occurred_at
    saved_day = first["created_at"][:10]
    assert any(line.startswith(f"[{saved_day} scout] ") for line in lines(answer)[1:])  # no occurred_at: save day


@pytest.mark.parametrize("bad", [0, 31, 32769, -5, "ten", 1.5, True, [64]])
def test_bad_max_tokens_is_a_422(inprocess, bad):
    with inprocess.client() as client:
        for bound in (32, 32768):  # the bounds themselves are fine
            assert client.post("/v1/recall", json={"query": "depot", "max_tokens": bound}).status_code == 200
        response = client.post("/v1/recall", json={"query": "depot", "max_tokens": bad})
    assert response.status_code == 422, response.text
    assert any(e["field"] == "max_tokens" for e in response.json()["errors"]), response.json()


def test_another_teams_texts_never_enter_the_context(saved):
    with saved.client() as client:
        before = recall(client, max_tokens=120)
    with saved.client("key-b") as other:
        for n in range(5):
            text = f"Secret {n}: the depot key access battery codes of team b."
            assert other.post("/v1/remember", json={"text": text, "agent_id": "spy"}).status_code == 202
        assert "team b" in recall(other, max_tokens=120)["context"]
    with saved.client() as client:
        after = recall(client, max_tokens=120)
    assert "team b" not in after["context"]
    assert after["context"] == before["context"]


# --------------------------------------------------------------------------- the model's tokenizer


@pytest.fixture
def extracted(inprocess_service) -> Iterator[tuple[Any, FakeLlamaServer]]:
    """A service on the fake llama-server, every text extracted (its facts: the text's sentences)."""
    with FakeLlamaServer("ok", tokens_per_s=5000) as fake:
        svc = inprocess_service(fake.url, env=PATIENT)
        with svc.client() as client:
            ids = [
                client.post("/v1/remember", json={"text": text, "agent_id": agent}).json()["id"]
                for agent, text in TEXTS
            ]
            for memory_id in ids:
                assert wait_status(client, memory_id, timeout=60)["status"] == "done"
        yield svc, fake


def test_model_count_never_exceeds_the_budget(extracted):
    svc, _ = extracted
    with svc.client() as client:
        full = recall(client)
        assert len(full["items"]) > len(lines(full))  # facts and their passages: repeats left out
        for budget in BUDGETS:
            fitted = recall(client, max_tokens=budget)
            assert fitted["token_counter"] == "model"
            check_fits(full, fitted, budget, count_tokens)


def test_a_source_is_said_once_and_as_cheaply_as_it_can_be(extracted):
    """The same text saved twice is said once; a passage whose facts are among the hits and say every query
    word it holds is left out for them (fewer tokens); facts of one text share one line and attribution."""
    svc, _ = extracted
    with svc.client() as client:
        again = client.post("/v1/remember", json={"text": TEXTS[3][1], "agent_id": "courier2"}).json()["id"]
        two = "Ingrid Larsen prefers email over calls. Her deputy at the depot is Tomas Berg."
        pair = client.post("/v1/remember", json={"text": two, "agent_id": "courier"}).json()["id"]
        for memory_id in (again, pair):
            assert wait_status(client, memory_id, timeout=60)["status"] == "done"
        query = {"query": "depot manager Ingrid Larsen deputy call access", "k": 30}
        answer = client.post("/v1/recall", json=query).json()
        facts_only = client.post("/v1/recall", json={**query, "kinds": ["fact"]}).json()
        passages_only = client.post("/v1/recall", json={**query, "kinds": ["passage"]}).json()
    items, context = answer["items"], answer["context"]
    assert [i["text"] for i in items if i["kind"] == "passage"].count(TEXTS[3][1]) == 2  # found, twice
    assert TEXTS[3][1] not in context  # ... and said by its two facts instead
    assert context.count("The depot manager is Ingrid Larsen.") == 1  # saved twice: said once
    assert "] The depot manager is Ingrid Larsen. Call her on +47 915 22 048 for access." in context  # one line
    [pair_line] = [line for line in lines(answer) if "Tomas Berg" in line]  # one line, in rank order
    assert "Ingrid Larsen prefers email over calls." in pair_line and pair_line.count("] ") == 1
    for line in lines(answer):
        body = line.split("] ", 1)[1]
        assert sum(body.casefold() in other.casefold() for other in lines(answer)) == 1, body
    assert "Her deputy at the depot is Tomas Berg." in facts_only["context"]
    assert TEXTS[3][1] in passages_only["context"]  # without its facts among the hits, the passage is said


def test_a_passage_holding_a_query_word_its_facts_lack_is_said() -> None:
    """The rule is about the words asked for: a passage enters when it holds one its facts do not."""
    from memory_service.recall.context import pieces_of
    from memory_service.recall.rank import Hit

    text = "Ingrid Larsen manages the depot; the night shift is run by Tomas Berg."
    passage = Hit("p:m1:0", "passage", text, "m1", None, "a", 1.7e9, source_memory_ids=["m1"])
    fact = Hit("f1", "fact", "Ingrid Larsen manages the depot.", "m1", "f1", "a", 1.7e9, source_memory_ids=["m1"])
    said = [p.text.split("] ", 1)[-1] for p in pieces_of([passage, fact], {}, "who manages the depot")]
    assert said == ["Ingrid Larsen manages the depot."]  # the fact says all the question asks of the text
    said = [p.text.split("] ", 1)[-1] for p in pieces_of([passage, fact], {}, "who runs the night shift")]
    assert said == [text]  # "night", "shift": only the passage holds them, and it holds the fact too


class HangingTokenizer(BaseHTTPRequestHandler):
    """A llama-server that is up (health, props) but whose /tokenize takes 3 s: the machine is swamped."""

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        if self.path.startswith("/props"):
            self._send(200, {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1})
        else:
            self._send(200, {"status": "ok"})

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.startswith("/tokenize"):
            time.sleep(HANG_S)
            self._send(200, {"tokens": []})
        else:
            self._send(503, {"error": {"message": "busy"}})


HANG_S = 12  # far beyond the 0.2 s bound and the test's own, so only a bounded wait passes


def test_a_slow_tokenizer_falls_back_to_the_estimate_in_time(inprocess_service):
    server = ThreadingHTTPServer(("127.0.0.1", 0), HangingTokenizer)
    server.daemon_threads = True  # a hanging handler must not hold the test's end
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        svc = inprocess_service(f"http://127.0.0.1:{server.server_address[1]}")
        with svc.client() as client:
            for agent, text in TEXTS[:3]:
                client.post("/v1/remember", json={"text": text, "agent_id": agent})
            recall(client, max_tokens=64)  # warm: the query embedder's first run
            started = time.monotonic()
            answer = recall(client, max_tokens=64)
            took = time.monotonic() - started
    finally:
        server.shutdown()
        server.server_close()
    assert answer["token_counter"] == "estimate" and answer["items"]
    assert answer["tokens"] == estimate_tokens(answer["context"]) <= 64
    # the tokenizer never answers: recall must not wait for it beyond its 0.2 s bound (plus a busy machine's
    # slack), where an unbounded call would wait for httpx's 30 s default
    assert took < 5, f"recall waited {took:.2f}s for a tokenizer that does not answer"


def test_estimate_over_counts_the_fakes_tokenizer_and_typical_bpe():
    """The estimate counts digits, punctuation and non-ASCII characters one by one, so it never falls below the
    fake's tokenizer (a stand-in for BPE) on text heavy with them."""
    for text in [t for _, t in TEXTS] + ["a b c d e f", "2026-03-01 12:30:45", "naïve café — 東京 🙂", "x" * 50]:
        assert estimate_tokens(text) >= count_tokens(text), text
    assert estimate_tokens("[2026-03-01 scout] ok") == 15


def test_the_clients_pass_max_tokens_and_read_the_context(extracted):
    svc, _ = extracted
    with MemoryClient(svc.url, api_key="key-a") as memory:
        answer = memory.recall("depot key access", max_tokens=64)
        unbudgeted = memory.recall("depot key access")
    assert isinstance(answer, RecallResponse) and answer.token_counter == "model"
    assert answer.context and answer.tokens == count_tokens(answer.context) <= 64
    assert len(answer.context.split("\n")) == len(answer.items) < len(unbudgeted.items)
    # the same hits, said within the budget (a passage may be said by its facts there: `fitted`)
    assert unbudgeted.tokens is None and {i.text for i in answer.items} <= {i.text for i in unbudgeted.items}

    async def in_async() -> RecallResponse:
        async with AsyncMemoryClient(svc.url, api_key="key-a") as memory:
            return await memory.recall("depot key access", max_tokens=64)

    again = asyncio.run(in_async())
    assert again.token_counter == "model" and again.tokens == count_tokens(again.context) <= 64


# --------------------------------------------------------------------------- the default model's tokenizer

HARD_TEXTS = [
    "Order 4417-2209-8812 shipped on 2026-03-01T09:15:00Z to 221B Baker St., London NW1 6XE.",
    "Ticket OPS-20931: p99 latency 1,240.50 ms at 03:00 UTC; rollback via `kubectl rollout undo deploy/api`.",
    "Mail ingrid.larsen+depot@example.no or call +47 915 22 048; key 3fa9c2e1-77b0-4d1e-9a8f-5c2d0e6b1a44.",
    "Naïve café déjà vu: Zoë paid €12,50 in Zürich; 東京で会いましょう 🙂🙂 — ok?",
    "xqzj vbnk wrtp mlkh ggfd hjkl qwer asdf zxcv uiop tyui bnmm cvbx",
    "I   said:\tread\n\nthe docs!!! ... ??? (yes) [no] {maybe} <x/> a+b=c; a||b && !c",
]


def test_the_default_model_counts_within_the_budget_and_the_estimate_over_counts(default_llama, inprocess_service):
    """By the default model's own /tokenize: the estimate is never below it on hard text (numbers, ids,
    punctuation, accents, CJK, emoji, random letters), and a budgeted context is within its budget."""
    with httpx.Client(base_url=default_llama.url, timeout=30, trust_env=False) as http:

        def real(text: str) -> int:
            return len(http.post("/tokenize", json={"content": text, "add_special": False}).json()["tokens"])

        for text in HARD_TEXTS + [t for _, t in TEXTS]:
            line = f"[2026-03-01 scout] {' '.join(text.split())}"
            print(f"estimate {estimate_tokens(line)} model {real(line)}: {line[:60]}")
            assert estimate_tokens(line) >= real(line), line
        svc = inprocess_service(default_llama.url, env=PATIENT)
        with svc.client() as client:
            for agent, text in TEXTS + [("ops", t) for t in HARD_TEXTS]:
                assert client.post("/v1/remember", json={"text": text, "agent_id": agent}).status_code == 202
            for budget in (32, 48, 100, 300):
                answer = client.post(
                    "/v1/recall", json={"query": "depot key order ticket", "k": 30, "max_tokens": budget}
                ).json()
                assert answer["token_counter"] == "model" and answer["items"], answer
                assert answer["tokens"] == real(answer["context"]) <= budget, answer


def test_a_near_duplicate_is_skipped_but_a_different_number_is_not() -> None:
    from memory_service.recall.context import pieces_of
    from memory_service.recall.rank import Hit

    def fact(n: int, text: str) -> Hit:
        return Hit(f"f{n}", "fact", text, f"m{n}", f"f{n}", "a", 1.7e9, source_memory_ids=[f"m{n}"])

    hits = [
        fact(1, "On 8 May Dana restarted the depot's backup server 2 times."),
        fact(2, "Dana restarted the backup server of the depot, 8 May."),  # every word said above: skipped
        fact(3, "On 8 May Dana restarted the depot's backup server 8 times."),  # "8" twice: not said above
        fact(4, "Depot 7 opens at 06:30."),
        fact(5, "Depot 8 opens at 06:30."),
    ]
    said = [p.text.split("] ", 1)[1] for p in pieces_of(hits, {}, "depot backup")]
    assert said == [hits[0].text, hits[2].text, hits[3].text, hits[4].text]


def test_a_small_budget_says_more_texts_by_their_facts_and_a_large_one_keeps_the_passages() -> None:
    """Each passage holds a word its fact lacks, so in rank order the passages are said. Within a small budget
    that says one text where the facts say all three: the facts are said. A budget that holds every text
    either way keeps the ranked form, passages and all."""
    from memory_service.recall.context import fitted, pieces_of
    from memory_service.recall.rank import Hit

    async def characters(text: str) -> list[str]:  # a tokenizer of one token per character
        return list(text)

    depots = [("Oslo", "Berg"), ("Bergen", "Dahl"), ("Tromso", "Lie")]
    hits = []
    for n, (city, name) in enumerate(depots):
        passage = f"The {city} depot is run by {name}; the night shift there starts at 22:00 and ends at 06:00."
        fact = f"The {city} depot is run by {name}."
        m = f"m{n}"
        hits.append(Hit(f"p:{m}:0", "passage", passage, m, None, "a", 1.7e9, source_memory_ids=[m]))
        hits.append(Hit(f"f{n}", "fact", fact, m, f"f{n}", "a", 1.7e9, source_memory_ids=[m]))
    query = "who runs the depot night shift"
    ranked = [p.text for p in pieces_of(hits, {}, query)]
    assert len(ranked) == 3 and all("night shift" in text for text in ranked)  # the passages, as ranked

    def said(budget: int) -> list[str]:
        context = asyncio.run(fitted(hits, {}, query, budget, characters, timeout_s=5))
        assert context.counter == "model" and context.tokens is not None and context.tokens <= budget
        return [line.split("] ", 1)[1] for line in context.text.split("\n")]

    assert said(150) == [f"The {city} depot is run by {name}." for city, name in depots]
    assert said(1000) == [p.split("] ", 1)[1] for p in ranked]
