"""Consolidation while the model is idle: grouping, storage on both databases, and the service end to end.

The service runs as a subprocess against the fake llama-server (a real HTTP peer whose consolidation
requests can be made to hold the only slot until the client leaves) to show that a save never waits behind
consolidation and that a kill in the middle resumes without writing a group twice; one test runs the real
default model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from memory_service.consolidation import summary
from memory_service.consolidation.groups import GROUP_MAX_FACTS, group_facts, subject_of
from memory_service.storage.consolidation import ConsolidationStore, Item, SourceFact
from memory_service.storage.consolidation_runs import DONE, INTERRUPTED, YIELDED
from memory_service.storage.forget import mark_forgotten
from memory_service.storage.journal import FactPlan, Journal, NewFact
from tests.conftest import wait_status
from tests.fakes.fake_llama_server import FakeLlamaServer

CONSOLIDATION_PROMPT = "You merge facts"  # in the consolidation system prompt only
OPERATOR = "operator-token"  # the MEMORY_METRICS_TOKEN bearer: /v1/stats shows every team's runs to it
ON = {"MEMORY_CONSOLIDATE": "1", "MEMORY_METRICS_TOKEN": OPERATOR}


# ---------------------------------------------------------------- grouping and the line


def fact(fid: str, text: str, at: float, agent: str = "bot", day: str | None = "2023-05-08") -> SourceFact:
    return SourceFact(fid, agent, text, [], at, [f"m-{fid}"], occurred_at=at, occurred_day=day)


def test_subjects_are_the_leading_name():
    assert subject_of("Caroline attends an LGBTQ support group") == "Caroline"
    assert subject_of("Caroline's son plays the violin") == "Caroline"
    assert subject_of("John Smith moved to Berlin") == "John Smith"
    assert subject_of("The deploy failed on Friday") is None
    assert subject_of("she likes tea") is None


def test_groups_by_agent_and_subject_newest_first_in_small_parts():
    facts = [fact(f"c{i}", f"Caroline fact number {i}", float(i)) for i in range(GROUP_MAX_FACTS + 1)]
    facts += [
        fact("m1", "Melanie paints", 100.0),
        fact("m2", "Melanie runs", 101.0),
        fact("x1", "Melanie swims", 1.0, agent="other"),
        fact("t1", "The build is green", 2.0),
    ]
    groups = group_facts("t", facts)
    assert [(g.subject, g.part, len(g.facts)) for g in groups] == [("Melanie", 0, 2), ("Caroline", 0, 9)]
    assert group_facts("t", list(reversed(facts)))[1].digest == groups[1].digest  # order-free, restart-stable


def test_a_point_must_be_made_of_the_facts_words_and_no_fact_is_lost():
    facts = [
        fact("a", "Caroline attends an LGBTQ support group", 1.0),
        fact("b", "Caroline is researching adoption agencies", 2.0),
    ]
    points = summary.grounded(
        "Caroline",
        ["Caroline attends an LGBTQ support group (8 May 2023)", "is a famous astronaut", "(8 May 2023)"],
        facts,
    )
    assert points == ["attends an LGBTQ support group (8 May 2023)"]
    line = summary.line("Caroline", summary.complete("Caroline", points, facts))
    assert line == (
        "Caroline: attends an LGBTQ support group (8 May 2023); is researching adoption agencies (8 May 2023)"
    )


# ---------------------------------------------------------------- storage, SQLite and PostgreSQL


def _with_fact(journal: Journal, text: str, fid: str) -> str:
    memory, _ = journal.insert(
        team="t", agent_id="bot", text=text, run_id=None, tags=["x"], metadata={}, idempotency_key=None, budget_s=60.0
    )
    claimed = journal.claim_next("w", 60.0)
    assert claimed is not None and claimed.id == memory.id
    plan = FactPlan(new=[NewFact(fid, text, text.lower(), text.lower(), [(0, len(text))])])
    assert journal.complete(claimed, plan, raw_reply=None, timings={}, report={})
    return memory.id


def test_store_writes_reads_and_drops_items_citing_a_source(journal):
    store = ConsolidationStore(journal)
    m1 = _with_fact(journal, "Caroline attends a support group", "f:1")
    m2 = _with_fact(journal, "Caroline researches adoption agencies", "f:2")
    facts = store.recent_facts("t", 10)
    assert {(f.id, tuple(f.memory_ids)) for f in facts} == {("f:1", (m1,)), ("f:2", (m2,))}
    [group] = group_facts("t", facts)
    item = Item(
        group.id,
        "t",
        "bot",
        "Caroline",
        0,
        "Caroline: a; b",
        ["x"],
        m2,
        2.0,
        2.0,
        group.digest,
        sources=[("f:1", m1), ("f:2", m2)],
    )
    assert store.write(item)
    assert store.digests("t") == {group.id: group.digest}
    got = store.items_by_ids("t", [group.id])[group.id]
    assert sorted(got.memory_ids) == sorted([m1, m2]) and got.tags == ["x"]
    assert store.unindexed(10)[0].id == group.id
    store.mark_indexed([group.id])
    assert store.unindexed(10) == []
    assert store.drop_citing("t", [m1]) == 1
    assert store.items_by_ids("t", [group.id]) == {} and store.purges() == {"t": [group.id]}
    store.purged("t", [group.id])
    assert store.purges() == {}
    # an item whose source was forgotten meanwhile is not written
    mark_forgotten(journal, "t", memory_ids=[m1])
    assert not store.write(item)


def test_run_log_says_what_ran_and_closes_runs_cut_off(journal):
    store = ConsolidationStore(journal)
    old = store.start_run("dead-holder", 3, now=time.time() - 1000)
    run = store.start_run("me", 2)
    store.beat(run, 1, 0)
    assert store.close_dead_runs(None) == 1
    store.end_run(run, DONE, 2, 1)
    runs = {r["id"]: r for r in store.runs()}
    assert runs[old]["outcome"] == INTERRUPTED
    assert (runs[run]["outcome"], runs[run]["written"], runs[run]["removed"], runs[run]["groups_due"]) == (
        DONE,
        2,
        1,
        2,
    )


# ---------------------------------------------------------------- the service, with the fake llama-server


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what or check}")


def remember(client: httpx.Client, text: str, **extra: Any) -> str:
    response = client.post("/v1/remember", json={"text": text, "agent_id": "bot", **extra})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def consolidated(client: httpx.Client, query: str = "Caroline") -> list[dict]:
    return client.post("/v1/recall", json={"query": query, "kinds": ["consolidated"], "k": 10}).json()["items"]


def stats(client: httpx.Client) -> dict:
    return client.get("/v1/stats", headers={"Authorization": f"Bearer {OPERATOR}"}).json()["consolidation"]


def test_a_save_never_waits_behind_consolidation_and_items_cite_every_source(service_factory):
    with FakeLlamaServer("ok", tokens_per_s=5000) as fake:
        fake.set_mode("ok", hang_when=CONSOLIDATION_PROMPT)  # a consolidation call holds the only slot
        svc = service_factory(fake.url, env=ON)
        client = svc.client()
        first = [
            remember(client, "Caroline attends an LGBTQ support group.", wait_s=30),
            remember(client, "Caroline is researching adoption agencies.", wait_s=30),
        ]
        wait_for(lambda: fake.state()["held"] == 1, what="a consolidation call in flight")
        assert stats(client)["running"] is True

        started = time.monotonic()
        third = remember(client, "Caroline loves painting sunsets.")
        ack_s = time.monotonic() - started
        assert wait_status(client, third, timeout=20)["status"] == "done"
        extracted_s = time.monotonic() - started
        assert ack_s < 1.0 and extracted_s < 5.0, (ack_s, extracted_s)
        assert fake.state()["held"] == 0  # the consolidation request was closed, its slot freed
        assert any(r["outcome"] == YIELDED for r in stats(client)["runs"])

        fake.set_mode("ok", hang_when=None)
        items = wait_for(
            lambda: [i for i in consolidated(client) if len(i["source_memory_ids"]) == 3],
            what="the item refreshed with the third fact",
        )
        assert sorted(items[0]["source_memory_ids"]) == sorted(first + [third])
        assert items[0]["text"].startswith("Caroline: ") and "sunsets" in items[0]["text"]
        assert items[0]["fact_id"].startswith("c:")
        every = client.post(
            "/v1/recall",
            json={"query": "Caroline painting sunsets", "k": 10, "kinds": ["fact", "passage", "consolidated"]},
        ).json()["items"]
        assert "consolidated" in {i["kind"] for i in every}
        default = client.post("/v1/recall", json={"query": "Caroline painting sunsets", "k": 10}).json()["items"]
        assert "consolidated" not in {i["kind"] for i in default}  # asked for only

        # forgetting one source drops the item that cites it (the two facts left are consolidated again)
        assert client.delete(f"/v1/memories/{third}").status_code == 204
        assert all(third not in i["source_memory_ids"] for i in consolidated(client))
        items = wait_for(lambda: consolidated(client), what="the item rewritten without the forgotten memory")
        assert sorted(items[0]["source_memory_ids"]) == sorted(first)


def test_a_kill_in_the_middle_resumes_without_writing_a_group_twice(service_factory):
    with FakeLlamaServer("ok", tokens_per_s=5000) as fake:
        svc = service_factory(fake.url, env=ON)
        client = svc.client()
        fake.set_mode("ok", hang_when="Subject: Caroline")  # Melanie (newest) goes through, Caroline hangs
        for text in (
            "Caroline attends an LGBTQ support group.",
            "Caroline is researching adoption agencies.",
            "Melanie paints sunsets.",
            "Melanie runs a charity race.",
        ):
            remember(client, text, wait_s=30)
        wait_for(lambda: fake.state()["held"] == 1, what="Caroline's consolidation in flight")
        assert [i["text"].split(":")[0] for i in consolidated(client, "Melanie")] == ["Melanie"]
        svc.kill()

        fake.set_mode("ok", hang_when=None)
        fake.clear_requests()
        again = service_factory(fake.url, data_dir=svc.data_dir, env=ON)
        client = again.client()
        wait_for(lambda: stats(client)["items"] == 2, what="Caroline's item after the restart")
        asked = [r for r in fake.recorded() if CONSOLIDATION_PROMPT in str(r.get("messages"))]
        assert len(asked) == 1 and "Subject: Caroline" in str(asked[0]["messages"])  # Melanie not redone
        # the item is written before its run is closed: wait for the run to end
        runs = wait_for(
            lambda: (r := stats(client)["runs"]) and r[0]["outcome"] != "running" and r, what="the resumed pass to end"
        )
        assert runs[0]["outcome"] == DONE and runs[0]["written"] == 1
        assert any(r["outcome"] == INTERRUPTED for r in runs[1:])

        again.stop()
        third = service_factory(fake.url, data_dir=svc.data_dir, env=ON)
        time.sleep(4.0)  # longer than the quiet time before a pass
        client = third.client()
        assert stats(client)["items"] == 2
        assert len(stats(client)["runs"]) == len(runs)  # nothing due: no run, no model call
        assert len([r for r in fake.recorded() if CONSOLIDATION_PROMPT in str(r.get("messages"))]) == 1


# ---------------------------------------------------------------- the real default model


def test_the_default_model_consolidates_a_subject(service_factory, default_llama):
    svc = service_factory(default_llama.url, env=ON)
    client = svc.client()
    ids = [
        remember(client, text, wait_s=120, occurred_at="2023-05-08T10:00:00Z")
        for text in (
            "Caroline: I went to an LGBTQ support group yesterday.",
            "Caroline: I'm researching adoption agencies, I want to give kids a home.",
        )
    ]
    items = wait_for(lambda: consolidated(client), timeout=180, what="an item from the real model")
    item = items[0]
    assert item["text"].startswith("Caroline: ")
    facts = [f for m in ids for f in client.get(f"/v1/memories/{m}").json()["facts"]]
    assert set(item["source_memory_ids"]) <= set(ids) and len(item["source_memory_ids"]) >= 1
    assert facts, "the model extracted no fact"
