"""Relative dates in facts become absolute, computed in code from the day the text was said."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from conftest import wait_status
from inprocess import InProcessService

from memory_service.extraction.dates import add_months, occurred, resolve
from tests.fakes.fake_llama_server import FakeLlamaServer

MONDAY = date(2023, 5, 8)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("She went to a support group yesterday.", "yesterday (7 May 2023)"),
        ("We talked last night.", "last night (7 May 2023)"),
        ("The race is tomorrow.", "tomorrow (9 May 2023)"),
        ("It was the day before yesterday.", "the day before yesterday (6 May 2023)"),
        ("Painted it today.", "today (8 May 2023)"),
        ("Ran a race last Saturday.", "last Saturday (6 May 2023)"),
        ("Said on a Monday: last Monday.", "last Monday (1 May 2023)"),
        ("Meets next Monday.", "next Monday (15 May 2023)"),
        ("Meets next Friday.", "next Friday (12 May 2023)"),
        ("Camping last weekend.", "last weekend (the weekend of 6 May 2023)"),
        ("Busy last week.", "last week (the week of 1 May 2023)"),
        ("Moving next month.", "next month (June 2023)"),
        ("Graduated last year.", "last year (2022)"),
        ("Joined 3 weeks ago.", "3 weeks ago (the week of 17 April 2023)"),
        ("Adopted two years ago.", "two years ago (2021)"),
        ("Met a few days ago.", "a few days ago (around 5 May 2023)"),
        ("Due in 10 days.", "in 10 days (18 May 2023)"),
    ],
)
def test_relative_expressions_get_their_absolute_date(text: str, expected: str) -> None:
    assert expected in resolve(text, MONDAY)


def test_text_without_relative_dates_is_unchanged_and_resolving_twice_changes_nothing() -> None:
    plain = "Caroline is researching adoption agencies in May 2023."
    assert resolve(plain, MONDAY) == plain
    once = resolve("Went yesterday and will go tomorrow.", MONDAY)
    assert resolve(once, MONDAY) == once
    assert once == "Went yesterday (7 May 2023) and will go tomorrow (9 May 2023)."


@pytest.mark.parametrize(
    "start, months, expected",
    [
        (date(2024, 3, 31), -1, date(2024, 2, 29)),  # leap year
        (date(2023, 3, 31), -1, date(2023, 2, 28)),
        (date(2024, 1, 31), 1, date(2024, 2, 29)),
        (date(2023, 12, 31), 1, date(2024, 1, 31)),
        (date(2023, 1, 15), -1, date(2022, 12, 15)),
        (date(2023, 5, 31), -3, date(2023, 2, 28)),
    ],
)
def test_months_are_clamped_to_their_length(start: date, months: int, expected: date) -> None:
    assert add_months(start, months) == expected


def test_month_and_year_ends() -> None:
    assert "yesterday (31 December 2022)" in resolve("yesterday", date(2023, 1, 1))
    assert "tomorrow (1 March 2024)" in resolve("tomorrow", date(2024, 2, 29))
    assert "tomorrow (29 February 2024)" in resolve("tomorrow", date(2024, 2, 28))
    assert "a month ago (February 2024)" in resolve("a month ago", date(2024, 3, 31))
    assert "next year (2024)" in resolve("next year", date(2023, 12, 31))


def test_the_day_counts_where_it_was_said_across_dst() -> None:
    madrid = ZoneInfo("Europe/Madrid")
    # 00:30 on the day clocks go forward (a 23-hour day), said in Madrid: still that day, not UTC's
    epoch, day = occurred(datetime(2026, 3, 29, 0, 30, tzinfo=madrid), 0, "UTC")
    assert day == "2026-03-29" and datetime.fromtimestamp(epoch, UTC).day == 28
    assert "yesterday (28 March 2026)" in resolve("yesterday", date.fromisoformat(day))
    # a naive time counts in MEMORY_TIMEZONE; the 25-hour day when clocks go back changes nothing
    _, day = occurred(datetime(2026, 10, 25, 23, 59), 0, "Europe/Madrid")
    assert day == "2026-10-25" and "tomorrow (26 October 2026)" in resolve("tomorrow", date.fromisoformat(day))
    # an explicit offset is the caller's own clock: 23:30 at -05:00 is still the 8th there
    _, day = occurred(datetime(2023, 5, 8, 23, 30, tzinfo=timezone(timedelta(hours=-5))), 0, "Europe/Madrid")
    assert day == "2023-05-08"
    # no occurred_at: the save time, in MEMORY_TIMEZONE (23:30 UTC on 28 March is the 29th in Madrid)
    saved = datetime(2026, 3, 28, 23, 30, tzinfo=UTC).timestamp()
    assert occurred(None, saved, "Europe/Madrid") == (None, "2026-03-29")
    assert occurred(None, saved, "UTC") == (None, "2026-03-28")


def test_stored_facts_carry_absolute_dates_from_occurred_at(tmp_path) -> None:
    """Through the service: a save with occurred_at; its fact says the date, the text stays as said."""
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        service = InProcessService(tmp_path / "data", fake.url, env={"MEMORY_TIMEZONE": "Europe/Madrid"}).start()
        try:
            with service.client() as http:
                said = "Caroline went to the LGBTQ support group yesterday."
                saved = http.post(
                    "/v1/remember",
                    json={"text": said, "agent_id": "caroline", "occurred_at": "2023-05-08T13:56:00+02:00"},
                ).json()
                done = wait_status(http, saved["id"])
                assert done["text"] == said and done["occurred_day"] == "2023-05-08"
                assert [f["text"] for f in done["facts"]] == [
                    "Caroline went to the LGBTQ support group yesterday (7 May 2023)."
                ]
                hits = http.post("/v1/recall", json={"query": "support group 7 May 2023", "kinds": ["fact"]}).json()
                assert "(7 May 2023)" in hits["items"][0]["text"]
                bad = http.post("/v1/remember", json={"text": "x", "agent_id": "a", "occurred_at": "last tuesday"})
                assert bad.status_code == 422 and "occurred_at" in bad.json()["detail"]
                exported = http.get("/v1/export").text
                assert '"occurred_day": "2023-05-08"' in exported
        finally:
            service.stop()
