"""Identifiers are grounded exactly: a fact that changes or invents a number, an id, an email, a URL, a path or
a version is rejected with the reason "identifiers"; one that only changed an identifier's case gets the
source's spelling back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_service.extraction.grounding import REJECT_CODES, ground
from memory_service.extraction.identifiers import SourceIdentifiers, capitalised, identifiers_in


def verdict(fact: str, source: str) -> tuple[list[str], list[str]]:
    result = ground([fact], source)
    return [f.text for f in result.kept], [r.code for r in result.rejected]


@pytest.mark.parametrize(
    ("source", "good", "bad"),
    [
        # numbers: an equal number written differently is the same; a repeated one must be repeated in the source
        (
            "The import loaded 1,250,000 rows and 3 tables.",
            "The import loaded 1250000 rows.",
            "The import loaded 1,250,000 rows and 3 tables, 3 of them empty.",
        ),
        # letters + digits
        (
            "Ticket R385-P94 blocks the release.",
            "Ticket R385-P94 blocks the release.",
            "Ticket R94-P385 blocks the release.",
        ),
        # hyphenated ids: a changed one, an invented one, and one used twice where the source has it once
        (
            "Dana moved 45 tables from db-1 to db-2.",
            "Dana moved 45 tables from db-1 to db-2.",
            "Dana moved 45 tables from db-1 to db-1.",
        ),
        ("Dana moved 16 tables from db-1 to db-2.", "Dana moved tables to db-2.", "Dana moved 16 tables to db-16."),
        # emails
        (
            "Write to alice@example.com about the invoice.",
            "Invoices go to alice@example.com.",
            "Invoices go to alice@example.org.",
        ),
        # URLs
        (
            "The runbook is at https://wiki.example.com/ops/Runbook?id=7.",
            "The runbook is at https://wiki.example.com/ops/Runbook?id=7.",
            "The runbook is at https://wiki.example.org/ops/Runbook?id=7.",
        ),
        # file paths
        (
            "The crash log is in /var/log/app/worker-2.log on the host.",
            "The crash log is in /var/log/app/worker-2.log.",
            "The crash log is in /var/log/app2/worker-2.log.",
        ),
        # versions
        (
            "We upgraded Postgres to 15.4.2 last night.",
            "Postgres was upgraded to 15.4.2.",
            "Postgres was upgraded to 15.4.2, then to 15.4.2 again.",
        ),
    ],
)
def test_each_identifier_class_must_be_the_sources_as_written(source: str, good: str, bad: str) -> None:
    assert verdict(good, source) == ([good], [])
    kept, codes = verdict(bad, source)
    assert kept == [] and codes in (["identifiers"], ["numbers"])


def test_a_fact_that_only_changed_an_identifiers_case_gets_the_source_spelling_back() -> None:
    source = "we have used 12 of the 50 seats; questions go to alice@example.com or ticket OPS-17."
    kept, codes = verdict("Alice@example.com answers questions about ops-17.", source)
    assert codes == [] and kept == ["alice@example.com answers questions about OPS-17."]


def test_rejections_say_which_identifier_and_count_under_a_bounded_code() -> None:
    result = ground(["Dana moved 45 tables from db-1 to db-16."], "Dana moved 45 tables from db-1 to db-2.")
    (rejected,) = result.rejected
    assert rejected.code == "identifiers" and rejected.code in REJECT_CODES
    assert "db-16" in rejected.reason


def test_words_numbers_of_other_scripts_and_plain_words_are_not_identifiers() -> None:
    assert identifiers_in("and/or the well-known plan, 1,2 and 3,000 at 10:30, v1.2.3, x@y.io.") == [
        "1",
        "2",
        "3,000",
        "10:30",
        "v1.2.3",
        "x@y.io",
    ]
    assert identifiers_in("سلام ١٢٣ İstanbul ３") == []


def test_opening_identifiers_keep_their_case() -> None:
    assert capitalised("alice@example.com owns the mailbox.") == "alice@example.com owns the mailbox."
    assert capitalised("db-1 is down.") == "db-1 is down."
    assert capitalised("the cache is cold.") == "The cache is cold."


@settings(max_examples=300, deadline=None)
@given(st.text(), st.text())
def test_identifier_checks_never_raise_on_any_text(fact: str, source: str) -> None:
    for extra in ("", "\ud800", "\x00", "İ", "e\u0301", "ﬃ"):
        SourceIdentifiers(source + extra).check(fact + extra)
        capitalised(fact + extra)
