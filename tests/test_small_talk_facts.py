"""Small talk and pleasantries yield no fact, whatever the model returns, and the date resolver never dates a
sentence that states nothing (the field case: "Haha that was fun, thanks so much for your patience today!"
was stored as "... today (5 December 2026)!")."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
from conftest import wait_status
from hypothesis import given, settings
from hypothesis import strategies as st
from inprocess import InProcessService

from memory_service.extraction.coverage import fill_in_gaps
from memory_service.extraction.dates import resolve
from memory_service.extraction.gate import small_talk_reason
from memory_service.extraction.grounding import ground
from memory_service.extraction.phatic import states_nothing

FIELD_CASE = "Haha that was fun, thanks so much for your patience today! Talk soon :)"

# chat lines, agent log lines and notes that say nothing
TALK = [
    FIELD_CASE,
    "Thanks, Nate!",
    "Ha, sounds great. See you tomorrow!",
    "It was a pleasure, have a great weekend!",
    "OK, done.",
    "Thank you so much for your help today :D",
    "Good morning everyone!",
    "Wow, that was intense haha",
]
# the same shapes holding something worth keeping
CLAIMS = [
    "Thanks for restarting db-1 after the outage!",
    "Thanks for the pizza recipe from your grandma.",
    "OK, the nightly backup finished at 02:10.",
    "Talk to Dana about the invoice tomorrow.",
    "That was the last backup before the migration.",
    "Haha, Melanie adopted a second cat.",
    "See you at the Lisbon offsite on Friday!",
]


@pytest.mark.parametrize("text", TALK)
def test_talk_states_nothing_and_grounding_rejects_it_as_small_talk(text: str) -> None:
    assert states_nothing.__wrapped__(text)
    result = ground([text], text)
    assert not result.kept and [r.code for r in result.rejected] == ["small_talk"]


@pytest.mark.parametrize("text", CLAIMS)
def test_a_claim_in_the_same_shapes_still_states_something(text: str) -> None:
    assert not states_nothing.__wrapped__(text)


def test_the_gate_skips_the_field_case_before_the_model() -> None:
    assert small_talk_reason(FIELD_CASE) == "small talk"
    assert small_talk_reason("[5 Dec 2026, 4:02 pm] Wren: " + FIELD_CASE) == "small talk"
    assert small_talk_reason("Thanks for restarting db-1 after the outage!") is None


def test_the_date_resolver_dates_statements_but_never_pleasantries() -> None:
    day = date(2026, 12, 5)
    assert resolve(FIELD_CASE, day) == FIELD_CASE
    assert resolve("Talk to you tomorrow!", day) == "Talk to you tomorrow!"
    text = "The deploy moved to tomorrow. Thanks for your patience today!"
    assert resolve(text, day) == "The deploy moved to tomorrow (6 December 2026). Thanks for your patience today!"


def test_code_adds_no_uncovered_pleasantry_as_a_fact() -> None:
    text = "Wren: The staging cluster now runs on three nodes. Haha that was fun, thanks so much for your patience!"
    added = [f.text for f in fill_in_gaps([], text).facts]
    assert added == ["Wren: The staging cluster now runs on three nodes."]


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_the_small_talk_rule_never_raises(text: str) -> None:
    for extra in ("", "\ud800", "\x00", "İ", "e\u0301 ", " :)"):
        states_nothing.__wrapped__(text + extra)
        resolve.__wrapped__(text + extra + " tomorrow", date(2026, 12, 5))


@pytest.mark.model
@pytest.mark.process  # the default model runs in llama-server
def test_the_default_model_stores_no_fact_of_small_talk(default_llama, tmp_path: Path) -> None:
    """The real default model is asked (the gate is turned off so the text reaches it), and whatever it
    proposes, no fact of the pleasantry is stored and no date is added to it."""
    env = {"MEMORY_SKIP_SMALL_TALK": "0", "MEMORY_EXTRACT_BUDGET_S": "120"}
    with InProcessService(tmp_path / "data", default_llama.url, env=env) as service, service.client() as http:
        saved = http.post("/v1/remember", json={"text": FIELD_CASE, "agent_id": "chat"}).json()["id"]
        done = wait_status(http, saved, timeout=300)
        assert done["status"] == "done", done
        assert done["facts"] == [], done
