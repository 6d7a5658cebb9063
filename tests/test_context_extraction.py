"""Extraction sees the saves just before a text: pronouns resolve, and a fact that borrows from them
keeps them as sources."""

from __future__ import annotations

from pathlib import Path

from conftest import wait_status
from inprocess import InProcessService

from memory_service.extraction.extractor import NO_FACTS, earlier_context, history_of
from memory_service.extraction.grounding import ground
from memory_service.extraction.prompt import build_messages
from memory_service.storage.journal import Journal
from tests.fakes.fake_llama_server import FakeLlamaServer

QUESTION = "Melanie: Did you go to the LGBTQ support group you told me about, Caroline?"
ANSWER = "Caroline: Yes! I finally did it last week, it was so powerful."


def test_earlier_saves_become_past_turns_cut_at_their_head_with_clean_answers_only() -> None:
    long = "first part. " + "b" * 30
    shown = earlier_context(
        [("m1", "short", '{"facts": ["A fact."]}'), ("m2", long, "The facts are: none"), ("m3", "x", None)],
        max_chars=20,
    )
    assert [(e.memory_id, e.text, e.offset) for e in shown] == [
        ("m1", "short", 0),
        ("m2", long[-20:], len(long) - 20),
        ("m3", "x", 0),
    ]
    assert [e.answer for e in shown] == ['{"facts": ["A fact."]}', NO_FACTS, NO_FACTS]
    messages = build_messages("now", history_of(shown))
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert messages[-1]["content"] == "Text:\nnow"


def test_a_fact_may_borrow_names_from_context_but_must_rest_on_the_text() -> None:
    result = ground(
        [
            "Caroline went to the LGBTQ support group last week.",
            "Caroline told Melanie about the LGBTQ support group.",
            "Melanie went hiking with Caroline last week.",
        ],
        ANSWER,
        context=[("mem_q", QUESTION, 0)],
    )
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


def test_context_is_a_block_aligned_window_of_the_run_or_the_agents_recent_saves(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite3")

    def save(text: str, agent: str = "chat", run: str | None = None, team: str = "t", at: float = 0.0):
        return journal.insert(
            team=team,
            agent_id=agent,
            text=text,
            run_id=run,
            tags=[],
            metadata={},
            idempotency_key=None,
            budget_s=20,
            now=1000.0 + at,
        )[0]

    texts = lambda ms: [m.text for m in ms]  # noqa: E731
    run = [save(f"r{n}", run="r1", at=n) for n in range(7)]
    save("other run", run="r2", at=3.5)
    save("other team", run="r1", team="u", at=3.6)
    windows = [texts(journal.context_for(m, block=2, window_s=1800)) for m in run]
    assert windows == [[], ["r0"], ["r1"], ["r1", "r2"], ["r3"], ["r3", "r4"], ["r5"]]
    # each window but the first of a block extends the one before: the prompt grows, its prefix stays
    assert windows[3][:1] == windows[2] and windows[5][:1] == windows[4]

    old = save("long ago", at=-7200)
    first, second = save("first", at=10), save("second", at=11)
    save("elsewhere", "mailer", at=12)
    third = save("third", at=13)
    assert texts(journal.context_for(second, block=2, window_s=1800)) == ["first"]
    assert texts(journal.context_for(third, block=2, window_s=1800)) == ["second"]  # a new block
    assert texts(journal.context_for(first, block=2, window_s=1800)) == []  # "long ago" is outside the window
    assert texts(journal.context_for(first, block=2, window_s=99999)) == ["long ago"]
    assert old.id
    journal.close()


def test_the_model_sees_the_previous_turn_and_the_fact_keeps_it_as_a_source(tmp_path: Path) -> None:
    """With context turned on (MEMORY_EXTRACT_CONTEXT_SAVES; off by default), and what code adds after the
    model turned off, so only the model's facts are stored (tests/test_coverage.py covers the rest)."""
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        service = InProcessService(
            tmp_path / "data", fake.url, env={"MEMORY_EXTRACT_CONTEXT_SAVES": "4", "MEMORY_EXTRACT_COMPLETE": "0"}
        ).start()
        try:
            with service.client() as http:
                fake.set_mode("ok", facts=[])
                asked = http.post("/v1/remember", json={"text": QUESTION, "agent_id": "chat"}).json()["id"]
                wait_status(http, asked)
                fake.clear_requests()
                fake.set_mode(
                    "ok",
                    facts=[
                        "Caroline went to the LGBTQ support group last week.",
                        "Caroline told Melanie about the LGBTQ support group.",
                    ],
                )
                answered = http.post(
                    "/v1/remember", json={"text": ANSWER, "agent_id": "chat", "occurred_at": "2023-05-08T13:56:00"}
                ).json()["id"]
                done = wait_status(http, answered)
                messages = fake.recorded()[-1]["messages"]
                assert [(m["role"], m["content"]) for m in messages[1:]] == [
                    ("user", "Text:\n" + QUESTION),
                    ("assistant", '{"facts": []}'),
                    ("user", "Text:\n" + ANSWER),
                ]
                assert [f["text"] for f in done["facts"]] == [
                    "Caroline went to the LGBTQ support group last week (the week of 1 May 2023)."
                ]
                assert [r["code"] for r in done["rejected_facts"]] == ["context"]
                hits = http.post("/v1/recall", json={"query": "Caroline LGBTQ support group", "kinds": ["fact"]})
                item = hits.json()["items"][0]
                assert item["memory_id"] == answered and set(item["source_memory_ids"]) == {answered, asked}
                # forgetting the earlier save removes it as a source; the fact stays with its own text
                assert http.delete(f"/v1/memories/{asked}").status_code == 204
                item = http.post(
                    "/v1/recall", json={"query": "Caroline LGBTQ support group", "kinds": ["fact"]}
                ).json()["items"][0]
                assert item["source_memory_ids"] == [answered]
        finally:
            service.stop()
