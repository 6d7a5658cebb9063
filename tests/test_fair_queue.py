"""The extraction queue is served round-robin across teams, then across a team's agents (storage/fair_queue.py).

Every test runs on SQLite and on a real PostgreSQL (the `journal` fixture). In global order, which the
queue had before, each of them fails: a job queued behind another team's (or agent's) 500 waits 500 claims.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from memory_service.storage.database import Database, SqliteDatabase
from memory_service.storage.fair_queue import next_due
from memory_service.storage.journal import Journal

FLOOD = 500


def save(journal: Journal, team: str, agent: str, text: str, now: float) -> str:
    memory, created = journal.insert(
        team=team,
        agent_id=agent,
        text=text,
        run_id=None,
        tags=[],
        metadata={},
        idempotency_key=None,
        budget_s=60.0,
        now=now,
    )
    assert created
    return memory.id


def claims(journal: Journal, n: int, now: float) -> list[tuple[str, str, str]]:
    """(team, agent, id) of the next `n` jobs claimed, in order."""
    taken = []
    for _ in range(n):
        job = journal.claim_next("w", lease_s=600, now=now)
        assert job is not None
        taken.append((job.team, job.agent_id, job.id))
    return taken


def test_a_team_queued_behind_another_teams_backlog_is_served_next(journal: Journal) -> None:
    now = time.time()
    for i in range(FLOOD):
        save(journal, "b", "flooder", f"team b's save {i}", now - 1000 + i)
    first_b = claims(journal, 3, now)  # b is being served when a arrives
    assert {team for team, _, _ in first_b} == {"b"}
    a_job = save(journal, "a", "quiet", "team a's one save", now)
    # two active teams: a's job is among the next two claims, not behind b's 497 others
    assert a_job in [job_id for _, _, job_id in claims(journal, 2, now)]
    # and a third team arriving later is served as promptly
    c_job = save(journal, "c", "late", "team c's one save", now)
    assert c_job in [job_id for _, _, job_id in claims(journal, 2, now)]
    # b's own jobs still go oldest first
    rest = [journal.get("b", job_id) for _, _, job_id in claims(journal, 5, now)]
    saved_at = [job.created_at for job in rest if job is not None]
    assert (
        len(saved_at) == 5 and saved_at == sorted(saved_at) and saved_at[0] == now - 1000 + 5
    )  # 3 before a came, one beside a, one beside c


def test_teams_alternate_while_each_has_a_backlog(journal: Journal) -> None:
    now = time.time()
    for i in range(20):
        save(journal, "b", "x", f"b {i}", now - 500 + i)
    for i in range(20):
        save(journal, "a", "y", f"a {i}", now - 100 + i)
    teams = [team for team, _, _ in claims(journal, 10, now)]
    assert teams in (["a", "b"] * 5, ["b", "a"] * 5)


def test_agents_within_a_team_alternate(journal: Journal) -> None:
    now = time.time()
    for i in range(FLOOD):
        save(journal, "a", "noisy", f"noisy agent's save {i}", now - 1000 + i)
    claims(journal, 2, now)
    quiet = save(journal, "a", "quiet", "the quiet agent's save", now)
    assert quiet in [job_id for _, _, job_id in claims(journal, 2, now)]
    for i in range(5):
        save(journal, "a", "second", f"a second agent's save {i}", now + i)
    agents = [agent for _, agent, _ in claims(journal, 6, now + 10)]
    assert agents in (["noisy", "second"] * 3, ["second", "noisy"] * 3)


def test_a_retry_not_yet_due_is_skipped_and_its_teams_due_job_still_served(journal: Journal) -> None:
    now = time.time()
    for i in range(FLOOD):
        save(journal, "b", "flooder", f"team b's save {i}", now - 1000 + i)
    retried = save(journal, "a", "quiet", "fails once", now - 2000)
    (job,) = claims(journal, 1, now)
    assert job[2] == retried  # a's job came first (older, and a never served)
    journal.fail_attempt(
        retried, error="model down", raw_reply=None, timings=None, report=None, retry_at=now + 300, budget_s=60
    )
    due = save(journal, "a", "quiet", "due now", now)
    taken = [job_id for _, _, job_id in claims(journal, 2, now)]
    assert due in taken and retried not in taken
    # before its not-before time the retry is never claimed, whatever else is queued
    assert retried not in [job_id for _, _, job_id in claims(journal, 20, now + 299)]
    assert retried in [job_id for _, _, job_id in claims(journal, 2, now + 301)]


def test_the_claim_reads_the_queue_through_its_indexes(database: Database) -> None:
    """On SQLite, every step of the claim's choice is an index search, never a scan of the queue."""
    if database.dialect != "sqlite":
        pytest.skip("PostgreSQL plans from its statistics")
    Journal(database)
    from memory_service.storage.fair_queue import AGENT_WINDOW, LAST_SERVED_SQL, QUEUED_ROWS, level_sql, queued

    steps = [
        (level_sql("sqlite", agents=False), ()),
        (level_sql("sqlite", agents=True), ("a", "x", "a", AGENT_WINDOW, "a", "a")),
        (LAST_SERVED_SQL, ("a", "a")),
        (
            f"SELECT id FROM {queued('sqlite', 'memories_fair_agent')} WHERE {QUEUED_ROWS} AND team = ? "
            "AND agent_id = ? AND next_attempt_at <= ? ORDER BY next_attempt_at, created_at LIMIT 1",
            ("a", "x", 1.0),
        ),
        ("SELECT COALESCE(MAX(turn), 0) + 1 FROM queue_turns", ()),
    ]
    with database.reading() as conn:
        for sql, args in steps:
            plan = [str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql, args)]
            scans = [step for step in plan if step.startswith("SCAN") and "names" not in step]
            assert not scans and not any("TEMP B-TREE" in step for step in plan), (sql, plan)


def _claim_steps(path: Path, now: float) -> int:
    """SQLite virtual-machine steps (in hundreds) the claim's choice takes on the journal at `path`: a count,
    not a time, so the comparison holds on a busy machine."""
    conn = sqlite3.connect(path)
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    conn.set_progress_handler(count, 100)
    try:
        assert next_due(conn, now, "sqlite") is not None
    finally:
        conn.close()
    return steps[0]


def test_a_claim_weighs_a_bounded_number_of_agents(tmp_path: Path) -> None:
    """A team that queues one save under each of many agent ids (their names are the caller's to choose) does
    not make the claim, a write transaction every save waits for, cost more per agent (issue 53): it weighed
    every queued agent, 68 ms a claim with 10,000 of them against 4 ms with 10. Here 1,000 agents against 50
    (the old choice: about 20 times the steps); and every agent is still served, once each, in 1,000 claims."""
    costs = {}
    for agents in (50, 1000):
        journal = Journal(SqliteDatabase(tmp_path / f"j{agents}.sqlite3"))
        now = time.time()
        for i in range(agents):
            save(journal, "many", f"agent-{i:04d}", f"save {i}", now - 1000 + i * 0.01)
        claims(journal, 3, now)  # the team has been served: its round has a place to go on from
        costs[agents] = _claim_steps(tmp_path / f"j{agents}.sqlite3", now)
        if agents == 1000:
            served = [agent for _, agent, _ in claims(journal, agents - 3, now)]
            assert len(set(served)) == agents - 3
            assert journal.claim_next("w", lease_s=600, now=now) is None
        journal.db.close()
    assert costs[1000] <= 2 * costs[50], costs
