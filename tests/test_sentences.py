"""Sentence and line splitting keeps emails, URLs, decimals, versions and abbreviations whole, and the spans a
fact rests on (what the console's span view shows) are whole sentences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_service.extraction.coverage import fill_in_gaps
from memory_service.extraction.grounding import ground
from memory_service.extraction.sentences import sentence_spans, sentences


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Mail alice@example.com about it. Then go on.",
            ["Mail alice@example.com about it.", "Then go on."],
        ),
        (
            "The runbook is at https://wiki.example.com/ops/a.b?x=1. Read it first!",
            ["The runbook is at https://wiki.example.com/ops/a.b?x=1.", "Read it first!"],
        ),
        ("It cost 1.50 per unit. Version 1.2.3 shipped.", ["It cost 1.50 per unit.", "Version 1.2.3 shipped."]),
        (
            "Dr. Smith met J. R. Tolkien, e.g. at the pub. Is that so? Yes.",
            ["Dr. Smith met J. R. Tolkien, e.g. at the pub.", "Is that so?", "Yes."],
        ),
        ("Logs are in /var/log/app.log\nBob: restarted db-1", ["Logs are in /var/log/app.log", "Bob: restarted db-1"]),
        ('He said "done." Then left.', ['He said "done."', "Then left."]),
        ("", []),
    ],
)
def test_sentences_keep_addresses_numbers_and_abbreviations_whole(text: str, expected: list[str]) -> None:
    assert sentences(text) == expected


def test_a_fact_about_an_email_rests_on_the_whole_sentence() -> None:
    source = "Support questions go to help.desk@example.com. The queue is triaged daily."
    (fact,) = ground(["Support questions go to help.desk@example.com."], source).kept
    assert [source[s:e] for s, e in fact.spans] == ["Support questions go to help.desk@example.com."]


def test_coverage_adds_a_sentence_with_a_url_whole() -> None:
    text = "The staging dashboard moved to https://grafana.example.com/d/abc.def?orgId=2 last week."
    (fact,) = fill_in_gaps([], text).facts
    assert fact.text == text


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_spans_are_in_order_inside_the_text_and_never_raise(text: str) -> None:
    for extra in ("", "\ud800", "\x00. x", "İ. i", "e\u0301. "):
        body = text + extra
        spans = sentence_spans.__wrapped__(body)
        assert all(0 <= s < e <= len(body) for s, e in spans)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
