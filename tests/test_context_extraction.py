"""Extraction sees the saves just before a text: pronouns resolve, and a fact that borrows from them
keeps them as sources."""

from __future__ import annotations

from pathlib import Path

from conftest import ServiceProcess, wait_status
from memory_service.extraction.extractor import earlier_context
from memory_service.extraction.grounding import ground
from memory_service.storage.journal import Journal
from tests.fakes.fake_llama_server import FakeLlamaServer

QUESTION = "Melanie: Did you go to the LGBTQ support group you told me about, Caroline?"
ANSWER = "Caroline: Yes! I finally did it last week, it was so powerful."


def test_context_is_the_tail_of_the_latest_saves_with_offsets_into_them() -> None:
    shown = earlier_context([("m1", "a" * 50), ("m2", "first part. " + "b" * 30)], max_chars=40)
    assert [e.memory_id for e in shown] == ["m2"] and shown[0].text == ("first part. " + "b" * 30)[-40:]
    assert shown[0].offset == len("first part. " + "b" * 30) - 40
    both = earlier_context([("m1", "one"), ("m2", "two")], max_chars=100)
    assert [(e.memory_id, e.text, e.offset) for e in both] == [("m1", "one", 0), ("m2", "two", 0)]
    assert earlier_context([("m1", "x")], max_chars=0) == []


def test_a_fact_may_borrow_names_from_context_but_must_rest_on_the_text() -> None:
    result = ground(["Caroline went to the LGBTQ support group last week.",
                     "Caroline told Melanie about the LGBTQ support group.",
                     "Melanie went hiking with Caroline last week."],
                    ANSWER, context=[("mem_q", QUESTION, 0)])
    kept = {f.text: f for f in result.kept}
    fact = kept["Caroline went to the LGBTQ support group last week."]
    assert fact.context and fact.context[0][0] == "mem_q"
    start, end = fact.context[0][1:]
    assert "support group" in QUESTION[start:end]
    rejected = {r.text: r.code for r in result.rejected}
    assert rejected["Caroline told Melanie about the LGBTQ support group."] == "context"
    assert rejected["Melanie went hiking with Caroline last week."] == "coverage"
    # without context, the borrowed names are not grounded
    assert not ground(["Caroline went to the LGBTQ support group last week."], ANSWER).kept


def test_context_is_the_same_run_or_the_same_agents_recent_saves(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite3")

    def save(text: str, agent: str = "chat", run: str | None = None, team: str = "t", at: float = 0.0):
        return journal.insert(team=team, agent_id=agent, text=text, run_id=run, tags=[], metadata={},
                              idempotency_key=None, budget_s=20, now=1000.0 + at)[0]

    old = save("long ago", at=-7200)
    first, other_agent, other_team = save("first", at=1), save("elsewhere", "mailer", at=2), save("x", team="u", at=3)
    second, in_run = save("second", at=4), save("run start", run="r1", at=5)
    third = save("third", at=6)
    run_next = save("run next", run="r1", at=7)
    texts = lambda ms: [m.text for m in ms]  # noqa: E731
    assert texts(journal.context_for(third, limit=2, window_s=1800)) == ["first", "second"]
    assert texts(journal.context_for(first, limit=2, window_s=1800)) == []  # "long ago" is outside the window
    assert texts(journal.context_for(first, limit=2, window_s=99999)) == ["long ago"]
    assert texts(journal.context_for(run_next, limit=2, window_s=1800)) == ["run start"]
    assert other_agent.id and other_team.id and old.id and in_run.id and second.id
    journal.close()


def test_the_model_sees_the_previous_turn_and_the_fact_keeps_it_as_a_source(tmp_path: Path) -> None:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        service = ServiceProcess(tmp_path / "data", fake.url).start()
        try:
            with service.client() as http:
                fake.set_mode("ok", facts=[])
                asked = http.post("/v1/remember", json={"text": QUESTION, "agent_id": "chat"}).json()["id"]
                wait_status(http, asked)
                fake.clear_requests()
                fake.set_mode("ok", facts=["Caroline went to the LGBTQ support group last week.",
                                           "Caroline told Melanie about the LGBTQ support group."])
                answered = http.post("/v1/remember", json={"text": ANSWER, "agent_id": "chat",
                                                           "occurred_at": "2023-05-08T13:56:00"}).json()["id"]
                done = wait_status(http, answered)
                prompt = fake.recorded()[-1]["messages"][-1]["content"]
                assert prompt.startswith("Context:\n" + QUESTION) and prompt.endswith("Text:\n" + ANSWER)
                assert [f["text"] for f in done["facts"]] == [
                    "Caroline went to the LGBTQ support group last week (the week of 1 May 2023)."]
                assert [r["code"] for r in done["rejected_facts"]] == ["context"]
                hits = http.post("/v1/recall", json={"query": "Caroline LGBTQ support group", "kinds": ["fact"]})
                item = hits.json()["items"][0]
                assert item["memory_id"] == answered and set(item["source_memory_ids"]) == {answered, asked}
                # forgetting the earlier save removes it as a source; the fact stays with its own text
                assert http.delete(f"/v1/memories/{asked}").status_code == 204
                item = http.post("/v1/recall", json={"query": "Caroline LGBTQ support group",
                                                     "kinds": ["fact"]}).json()["items"][0]
                assert item["source_memory_ids"] == [answered]
        finally:
            service.kill()
