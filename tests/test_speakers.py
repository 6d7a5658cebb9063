"""Speakers in multi-speaker text: each fact is attributed to the speaker of the line it came from, "I" and
"we" are that speaker, and a fact never carries another line's speaker prefix (the field case: every fact of
an ops log got the first speaker's name in front)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from memory_service.extraction.coverage import fill_in_gaps
from memory_service.extraction.grounding import ground
from memory_service.extraction.speakers import lines_of

OPS_LOG = (
    "Priya: Morning all, starting the migration now.\n"
    "Tomás: I moved 45 tables from db-1 to db-2.\n"
    "Priya: We paused the billing cron until noon.\n"
    "Tomás: Thanks!"
)


def facts_of(model_facts: list[str], text: str) -> list[str]:
    grounded = ground(model_facts, text).kept
    return [f.text for f in fill_in_gaps(grounded, text).facts]


def test_each_fact_gets_the_speaker_of_its_own_line() -> None:
    facts = facts_of(["I moved 45 tables from db-1 to db-2.", "We paused the billing cron until noon."], OPS_LOG)
    assert "Tomás moved 45 tables from db-1 to db-2." in facts
    assert "Priya paused the billing cron until noon." in facts
    assert not any(f.startswith("Priya: Tomás") or f.startswith("Priya: I") for f in facts)


def test_a_fact_never_carries_another_lines_speaker_prefix() -> None:
    facts = facts_of(["Priya: Tomás moved 45 tables from db-1 to db-2."], OPS_LOG)
    assert facts[0] == "Tomás moved 45 tables from db-1 to db-2."


def test_agent_log_lines_with_an_agent_field() -> None:
    log = "\n".join(
        json.dumps(r)
        for r in (
            {"agent": "planner", "message": "I scheduled the nightly reindex for 02:00."},
            {"agent": "deployer", "message": "I rolled back release v2.4.1 on web-3."},
        )
    )
    facts = facts_of(["I rolled back release v2.4.1 on web-3."], log)
    assert facts[0] == "deployer rolled back release v2.4.1 on web-3."
    assert "planner scheduled the nightly reindex for 02:00." in facts


def test_lines_without_a_header_continue_the_message_before_them_and_labels_name_no_one() -> None:
    lines = lines_of("Ana: I fixed it.\nIt took two hours.\nNote: check the logs")
    assert [line.speaker for line in lines] == ["Ana", "Ana", None]


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_reading_speakers_never_raises(text: str) -> None:
    for extra in ("", "\ud800", "\x00", "İ: I went.", '\n{"agent": "\\ud800", "message": "x"}'):
        lines_of(text + extra)
        fill_in_gaps.__wrapped__([], text + extra)
