"""A write touches only its writer's share: a key pinned to an agent dedups and supersedes among that agent's
facts alone, and its report shows nothing of another agent's; an unpinned save dedups across the team's
unpinned facts but leaves a pinned agent's facts alone (docs/security.md, "Write scope").

Through the real app and its workers against the fake llama-server, which answers each text's sentences as
its facts (so "The quota is 50." becomes that fact); the storage rule itself on SQLite and PostgreSQL.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from memory_service.app import create_app
from memory_service.config import Settings
from memory_service.contract.text import normalize
from memory_service.extraction.grounding import shape
from memory_service.services import Services
from memory_service.storage.journal import FactPlan, Journal, Memory, NewFact
from tests.fakes.fake_llama_server import FakeLlamaServer

TEAM = "team-w"
LOW, HIGH, OTHER = "The quota is 50.", "The quota is 5000.", "The quota is 70."


@pytest.fixture
def fake() -> Iterator[FakeLlamaServer]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as server:  # each sentence of the text is a fact
        yield server


@pytest.fixture
def settings(fake: FakeLlamaServer, tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", llm_url=fake.url, chroma_process=False, retry_base_s=0.2)


@contextmanager
def served(settings: Settings, *, workers: bool = True) -> Iterator[tuple[Services, Any]]:
    """The real app on its own stores; with `workers`, its extraction workers run in the lifespan."""
    services = Services.open(settings)
    try:
        app = create_app(settings, services=services, run_workers=workers)
        with TestClient(app, base_url="http://127.0.0.1") as client:
            yield services, client
    finally:
        services.close()


def keys(services: Services) -> dict[str, str]:
    """An unpinned write key (its saves name their agent) and one pinned to agent m1."""
    return {
        "team": services.keys.create(TEAM, "write").key,
        "m1": services.keys.create(TEAM, "write", agent_id="m1").key,
    }


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def save(client: Any, key: str, agent: str, text: str, wait_s: float = 30) -> dict[str, Any]:
    """Save and wait until extracted; the memory as its saver's key sees it (GET /v1/memories/{id})."""
    saved = client.post("/v1/remember", json={"text": text, "agent_id": agent, "wait_s": wait_s}, headers=auth(key))
    assert saved.status_code == 202, saved.text
    return view(client, key, saved.json()["id"])


def view(client: Any, key: str, memory_id: str) -> dict[str, Any]:
    got = client.get(f"/v1/memories/{memory_id}", headers=auth(key))
    assert got.status_code == 200, got.text
    return got.json()


def recalled_facts(client: Any, key: str, agent: str) -> list[str]:
    body = {"query": "quota", "agent_id": agent, "scope": "agent", "kinds": ["fact"]}
    got = client.post("/v1/recall", json=body, headers=auth(key))
    assert got.status_code == 200, got.text
    return [item["text"] for item in got.json()["items"]]


def only_fact(memory: dict[str, Any]) -> dict[str, Any]:
    assert memory["status"] == "done", memory
    assert len(memory["facts"]) == 1, memory["facts"]
    return memory["facts"][0]


def test_a_pinned_save_never_supersedes_another_agents_fact(settings: Settings) -> None:
    with served(settings) as (services, client):
        k = keys(services)
        a1 = save(client, k["team"], "a1", LOW)
        m1 = save(client, k["m1"], "m1", HIGH)
        # a1's value stands, in its memory and its recall, whatever the pinned agent says
        assert only_fact(view(client, k["team"], a1["id"]))["superseded_by"] is None
        assert recalled_facts(client, k["team"], "a1") == [LOW]
        # m1's report: its own fact stored, nothing of anyone else's replaced
        assert only_fact(m1)["text"] == HIGH
        assert m1["extraction"]["superseded"] == 0 and m1["extraction"]["stored"] == 1
        assert recalled_facts(client, k["m1"], "m1") == [HIGH]


def test_a_pinned_save_of_another_agents_exact_sentence_reports_no_merge(settings: Settings) -> None:
    with served(settings) as (services, client):
        k = keys(services)
        a1 = save(client, k["team"], "a1", LOW)
        m1 = save(client, k["m1"], "m1", LOW)
        a1_fact, m1_fact = only_fact(a1), only_fact(m1)
        # m1's report tells it nothing about a1: no merge, and its one fact is its own (another id)
        assert m1["extraction"]["merged"] == 0 and m1["extraction"]["stored"] == 1
        assert m1_fact["id"] != a1_fact["id"] and m1_fact["superseded_by"] is None
        # a1's fact rests on a1's save alone, and m1's on m1's
        sources = services.journal.fact_sources([a1_fact["id"], m1_fact["id"]])
        assert [s[0] for s in sources[a1_fact["id"]]] == [a1["id"]]
        assert [s[0] for s in sources[m1_fact["id"]]] == [m1["id"]]
        # the pinned agent's own repeat still folds into its own fact
        again = save(client, k["m1"], "m1", LOW)
        assert again["extraction"]["merged"] == 1 and only_fact(again)["id"] == m1_fact["id"]


def test_unpinned_saves_dedup_team_wide_but_leave_a_pinned_agents_facts(settings: Settings) -> None:
    """The team's shared facts fold across its unpinned agents as before; a pinned agent's facts are closed
    to them (an unpinned key acting as m1 itself still reaches m1's facts)."""
    with served(settings) as (services, client):
        k = keys(services)
        m1 = save(client, k["m1"], "m1", HIGH)
        a1 = save(client, k["team"], "a1", LOW)
        a2 = save(client, k["team"], "a2", LOW)
        assert a2["extraction"]["merged"] == 1 and only_fact(a2)["id"] == only_fact(a1)["id"]  # team-wide
        a3 = save(client, k["team"], "a3", OTHER)
        assert a3["extraction"]["superseded"] == 1  # a1's 50, not m1's 5000
        assert only_fact(view(client, k["team"], a1["id"]))["superseded_by"] == only_fact(a3)["id"]
        # the pinned agent's fact was neither superseded by 50 nor 70, nor merged into by a repeat of it
        assert a1["extraction"]["superseded"] == 0  # a1's 50, saved after m1's 5000, left it alone
        a4 = save(client, k["team"], "a4", HIGH)
        assert a4["extraction"]["merged"] == 0 and only_fact(a4)["id"] != only_fact(m1)["id"]
        assert only_fact(view(client, k["m1"], m1["id"]))["superseded_by"] is None
        assert recalled_facts(client, k["m1"], "m1") == [HIGH]
        as_m1 = save(client, k["team"], "m1", HIGH)  # the team's key speaking as m1: m1's own share
        assert as_m1["extraction"]["merged"] == 1 and only_fact(as_m1)["id"] == only_fact(m1)["id"]


def test_a_pinned_keys_hindsight_retain_follows_the_same_rule(settings: Settings) -> None:
    with served(settings) as (services, client):
        k = keys(services)
        a1 = save(client, k["team"], "a1", LOW)
        body = {"items": [{"content": HIGH}]}
        retained = client.post("/v1/default/banks/m1/memories", json=body, headers=auth(k["m1"]))
        assert retained.status_code == 200, retained.text
        listed = client.get("/v1/memories", params={"agent_id": "m1"}, headers=auth(k["m1"])).json()["items"]
        m1 = _done(client, k["m1"], listed[0]["id"])
        assert only_fact(m1)["text"] == HIGH and m1["extraction"]["superseded"] == 0
        assert only_fact(view(client, k["team"], a1["id"]))["superseded_by"] is None


def _done(client: Any, key: str, memory_id: str, within_s: float = 60) -> dict[str, Any]:
    """The memory once its job has ended (a bound for a stuck job, not a timing under test)."""
    deadline = time.monotonic() + within_s
    while (memory := view(client, key, memory_id))["status"] not in ("done", "failed"):
        assert time.monotonic() < deadline, memory
        time.sleep(0.1)
    return memory


def test_the_pin_is_kept_with_the_job_across_a_restart(settings: Settings) -> None:
    """Saved while no worker runs, extracted by the next start's workers: the pin is read from the journal."""
    first: dict[str, str] = {}
    with served(settings, workers=False) as (services, client):
        k = keys(services)
        for who, key, text in (("a1", k["team"], LOW), ("m1", k["m1"], HIGH)):
            body = {"text": text, "agent_id": who, "idempotency_key": f"save-{who}"}
            saved = client.post("/v1/remember", json=body, headers=auth(key)).json()
            assert saved["status"] == "queued", saved
            first[who] = saved["id"]
    with served(settings) as (services, client):
        seen = {}
        for who, key, text in (("a1", k["team"], LOW), ("m1", k["m1"], HIGH)):
            # the same save again (its idempotency key) waits on the first one's job instead of saving anew
            body = {"text": text, "agent_id": who, "idempotency_key": f"save-{who}", "wait_s": 30}
            replayed = client.post("/v1/remember", json=body, headers=auth(key)).json()
            assert replayed["id"] == first[who] and replayed["status"] == "done", replayed
            seen[who] = view(client, key, first[who])
        assert only_fact(seen["a1"])["superseded_by"] is None and only_fact(seen["m1"])["superseded_by"] is None
        assert seen["m1"]["extraction"]["superseded"] == 0 and seen["a1"]["extraction"]["superseded"] == 0
        assert recalled_facts(client, k["team"], "a1") == [LOW]


# -- the storage rule, on both engines -------------------------------------------------------------------


def _stored(journal: Journal, agent: str, text: str, fact_id: str, *, pinned: bool) -> Memory:
    memory, _ = journal.insert(
        team=TEAM,
        agent_id=agent,
        text=text,
        run_id=None,
        tags=[],
        metadata={},
        idempotency_key=None,
        budget_s=20.0,
        pinned=pinned,
    )
    norm = normalize(text)
    plan = FactPlan(new=[NewFact(fact_id, text, norm, shape(norm), [(0, len(text))])])
    assert journal.complete(memory, plan, raw_reply=None, timings=None, report={})
    return memory


def test_the_facts_a_save_may_change_on_both_engines(journal: Journal) -> None:
    a1 = _stored(journal, "a1", LOW, "f-a1", pinned=False)
    m1 = _stored(journal, "m1", LOW, "f-m1", pinned=True)
    a2 = _stored(journal, "a2", HIGH, "f-a2", pinned=False)
    assert journal.get(TEAM, m1.id).pinned and not journal.get(TEAM, a1.id).pinned  # kept with the job
    norm, fact_shape = normalize(LOW), shape(normalize(LOW))

    def ids(found: Any) -> set[str]:
        return {f.id for f in (found.values() if isinstance(found, dict) else found)}

    # a reader (no writer) sees every fact; a pinned writer only its agent's; an unpinned one all but m1's
    assert ids(journal.active_facts_by_norm(TEAM, norm)) == {"f-a1", "f-m1"}
    assert ids(journal.active_facts_by_norm(TEAM, norm, m1)) == {"f-m1"}
    assert ids(journal.active_facts_by_norm(TEAM, norm, a2)) == {"f-a1"}
    assert ids(journal.active_facts_by_shape(TEAM, fact_shape, m1)) == {"f-m1"}
    assert ids(journal.active_facts_by_shape(TEAM, fact_shape, a2)) == {"f-a1", "f-a2"}
    everything = ["f-a1", "f-m1", "f-a2"]
    assert ids(journal.facts_by_ids(TEAM, everything, m1)) == {"f-m1"}
    assert ids(journal.facts_by_ids(TEAM, everything, a1)) == {"f-a1", "f-a2"}
    assert ids(journal.facts_by_ids(TEAM, everything)) == set(everything)
    # an unpinned save as m1 itself reaches m1's pinned fact: it is m1's share
    as_m1 = Memory(**{**journal.get(TEAM, a1.id).__dict__, "agent_id": "m1", "pinned": False})
    assert ids(journal.active_facts_by_norm(TEAM, norm, as_m1)) == {"f-a1", "f-m1"}


def test_an_earlier_save_of_another_share_never_becomes_a_facts_source_on_both_engines(journal: Journal) -> None:
    """Extraction context (a run's earlier saves) may show one agent's save to another's job; the fact
    the job stores rests on it only within the write scope."""
    a1 = _stored(journal, "a1", LOW, "f-a1", pinned=False)
    m1 = _stored(journal, "m1", HIGH, "f-m1", pinned=True)
    m1_later, _ = journal.insert(
        team=TEAM,
        agent_id="m1",
        text=OTHER,
        run_id=None,
        tags=[],
        metadata={},
        idempotency_key=None,
        budget_s=20.0,
        pinned=True,
    )
    a2_later, _ = journal.insert(
        team=TEAM, agent_id="a2", text=OTHER, run_id=None, tags=[], metadata={}, idempotency_key=None, budget_s=20.0
    )
    norm = normalize(OTHER)
    for later, fid in ((m1_later, "f-m1-later"), (a2_later, "f-a2-later")):
        plan = FactPlan(new=[NewFact(fid, OTHER, norm, shape(norm), [(0, len(OTHER))])])
        plan.context_sources = [(fid, a1.id, (0, 3)), (fid, m1.id, (0, 3))]
        assert journal.complete(later, plan, raw_reply=None, timings=None, report={})
    sources = journal.fact_sources(["f-m1-later", "f-a2-later"])
    assert {s[0] for s in sources["f-m1-later"]} == {m1_later.id, m1.id}  # not a1's
    assert {s[0] for s in sources["f-a2-later"]} == {a2_later.id, a1.id}  # not the pinned m1's


def test_a_pinned_saves_extraction_context_holds_only_its_agents_saves_on_both_engines(journal: Journal) -> None:
    """A run's earlier saves are the model's context; a pinned save's prompt never shows another agent's text,
    so nothing the pinned key can read is extracted from what it may not read."""

    def in_run(agent: str, text: str, *, pinned: bool) -> Memory:
        memory, _ = journal.insert(
            team=TEAM,
            agent_id=agent,
            text=text,
            run_id="shared-run",
            tags=[],
            metadata={},
            idempotency_key=None,
            budget_s=20.0,
            pinned=pinned,
        )
        time.sleep(0.01)  # distinct created_at, so the run's order is the order of the saves
        return memory

    a1 = in_run("a1", LOW, pinned=False)
    m1 = in_run("m1", HIGH, pinned=True)
    m1_later = in_run("m1", OTHER, pinned=True)
    a2_later = in_run("a2", OTHER, pinned=False)
    assert [m.id for m in journal.context_for(m1_later, block=8, window_s=3600)] == [m1.id]
    assert [m.id for m in journal.context_for(a2_later, block=8, window_s=3600)] == [a1.id, m1.id, m1_later.id]
