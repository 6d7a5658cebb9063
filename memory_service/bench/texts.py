"""Realistic agent texts: what the benchmarks and tests save, so extraction and the journal see real work."""

from __future__ import annotations

AGENT_TEXTS: tuple[str, ...] = (
    "Deployed build 4.12.3 of the billing service to staging at 14:05 UTC. Migration 0087 ran in 41 seconds. "
    "Dana asked to keep the new invoice PDF feature flag off until the finance review on Friday.",
    "Read the customer email from Acme Corp: they want to move their renewal from March 1 to April 15 and "
    "reduce seats from 120 to 95. Contact is Priya Natarajan, priya.natarajan@acme.example.",
    "Ran the nightly test suite: 1,482 passed, 3 failed (test_refund_rounding, test_webhook_retry, "
    "test_locale_dates). The webhook failure is flaky; the other two started after commit 9f3c2e1.",
    "User said they prefer short answers in bullet points and work in the Europe/Berlin timezone. "
    "They are the team lead for the data platform group.",
    "Checked the Hacker News story about SQLite WAL mode performance (item 40123456). Already summarised "
    "it yesterday for the #eng-reading channel, so skipped it.",
    "Booked the offsite venue: Lakeside Hall in Zurich, 12-14 June, capacity 40 people, deposit of 2,500 CHF "
    "paid by card ending 4417. Catering confirmed with vegetarian option.",
    "The on-call rotation changes next week: Marco covers Monday to Wednesday, Aiko Thursday to Sunday. "
    "Pager escalation goes to Sam Oduya after 15 minutes without acknowledgement.",
    "Investigated the latency spike on the search API: p99 went from 180 ms to 1.9 s at 03:10 because the "
    "Redis cache node redis-2 restarted. Added an alert on cache hit rate below 80%.",
    "Summarised the quarterly planning doc: priorities are SSO for enterprise customers, cutting cloud costs "
    "by 15%, and launching the mobile app beta in Brazil before September.",
    "Sent the weekly digest to 312 subscribers. Open rate last week was 47%. Two people unsubscribed and "
    "one replied asking for a Spanish edition.",
    "Tried to reproduce issue #2291 (export to CSV drops unicode characters) on macOS and Windows. It only "
    "happens on Windows with Excel 2016; the file itself is valid UTF-8.",
    "Hi, thanks for the update! Talk soon.",
    "Meeting notes: the vendor Northwind quoted 18,000 EUR per year for the analytics plan. Legal needs "
    "two weeks to review the data processing agreement. Decision postponed to the 23rd.",
    "The user's daughter Emma starts school on 2 September; they asked me to block mornings that week "
    "and not schedule calls before 10:00.",
    "Rotated the API keys for the payments provider. Old key revoked at 09:30. Updated the secret in the "
    "vault under payments/prod/api-key and restarted the three checkout pods.",
    "Scraped 58 new job postings for senior Rust engineers in Lisbon; median advertised salary is 72,000 EUR. "
    "Saved the list to the hiring spreadsheet, tab 'Lisbon Q3'.",
    "The customer from Globex reported that password reset emails arrive after 20 minutes. Mail logs show "
    "the provider throttles us at 100 messages per minute since Tuesday.",
    "Agent note: completed step 3 of 7 in the data migration runbook. Copied 2.4 million rows from "
    "orders_2019 to the archive cluster; checksum matches.",
    "Remember that the CFO, Laura Jensen, wants all budget numbers in thousands of euros and rounded "
    "to one decimal place in every report.",
    "Translated the onboarding guide into Portuguese for the Brazil team. Felipe will review it by Thursday. "
    "Terminology for 'workspace' is 'espaco de trabalho'.",
    "Compared three vector databases for the prototype: Chroma was easiest to embed, Qdrant had the best "
    "filtering speed, and pgvector fits our existing Postgres 15 setup.",
    "Cancelled the duplicate AWS reservation for m6i.large in eu-west-1 (reservation r-0a1b2c). This saves "
    "about 1,100 USD per month starting next billing cycle.",
    "Daily standup: Ravi is blocked on the design review, Mei finished the login page redesign, "
    "and the release train moves from Tuesday to Wednesday this week.",
    "The user is allergic to peanuts and prefers aisle seats on flights. Their frequent flyer number "
    "with Lufthansa is 992 0041 7733.",
)


def agent_text(i: int) -> str:
    """A realistic text, varied per request (the journal sees no two identical saves)."""
    return f"{AGENT_TEXTS[i % len(AGENT_TEXTS)]} (ref {i})"
