"""Which queued job is served next: round-robin across teams, then across a team's agents, then the oldest.

In global order one team's backlog of 500 saves would delay every other team's extraction by 500 jobs. So
the claim takes the team whose turn is oldest among teams with a due job (a team never served goes first),
within it the agent likewise, and within that agent the due job first due (then first saved), as before:
another team waits at most one job per active team, whatever one team has queued.

A turn is a number from `queue_turns` (one row per team, agent_id '', and one per agent), one more than
the highest on every claim: a counter, not a clock, so claims in the same instant still alternate.
The choice reads only the partial indexes `memories_fair_team` and `memories_fair_agent` (queued rows):
one index probe per team with queued jobs and per agent of the chosen team, whatever their backlogs, in
one query per level. A team that queues under many agent ids slows only the claims that serve it.
"""

from __future__ import annotations

from typing import Any

TEAM_ROW = ""  # the team's own turn row: '' is no valid agent_id
# the partial indexes' own terms: SQLite uses a partial index only for a literal that matches it
QUEUED_ROWS = "status = 'queued'"


def queued(dialect: str, index: str) -> str:
    """The queued rows read through `index`. SQLite is told the index: with no statistics its planner took
    `memories_leases` (status) for `MIN(team)`, a scan of the whole queue; PostgreSQL plans from its own."""
    return f"memories INDEXED BY {index}" if dialect == "sqlite" else "memories"


def level_sql(dialect: str, agents: bool) -> str:
    """One query for a round's candidates: the teams with queued jobs (or, `agents`, the agents of the team
    given as its 3 parameters), each with its earliest next_attempt_at and its last turn.

    A loose index scan (a recursive `MIN(x) WHERE x > previous`): one index probe per distinct value, in
    one round trip, so a backlog of 100,000 in one team or agent costs what a backlog of one does.
    """
    column, where = ("agent_id", " AND team = ?") if agents else ("team", "")
    table = queued(dialect, "memories_fair_agent" if agents else "memories_fair_team")
    turn_of = "team = ? AND agent_id = names.name" if agents else f"team = names.name AND agent_id = '{TEAM_ROW}'"
    return (
        f"WITH RECURSIVE names(name) AS (SELECT MIN({column}) FROM {table} WHERE {QUEUED_ROWS}{where} "
        f"UNION ALL SELECT (SELECT MIN({column}) FROM {table} WHERE {QUEUED_ROWS}{where} AND {column} > names.name) "
        "FROM names WHERE names.name IS NOT NULL) "
        f"SELECT name, (SELECT MIN(next_attempt_at) FROM {table} WHERE {QUEUED_ROWS}{where} AND {column} = names.name), "
        f"(SELECT turn FROM queue_turns WHERE {turn_of}) FROM names WHERE name IS NOT NULL"
    )


def _in_turn(conn: Any, dialect: str, team: str | None, now: float) -> list[str]:
    """Teams (or agents of `team`) with a due job, the oldest turn first (never served first, then the one
    due longest). Only teams and agents with queued jobs are read, never every team ever served."""
    args = () if team is None else (team, team, team, team)
    rows = conn.execute(level_sql(dialect, team is not None), args).fetchall()
    due = sorted((0 if turn is None else int(turn), first, name) for name, first, turn in rows if first <= now)
    return [name for _, _, name in due]


def next_due(conn: Any, now: float, dialect: str) -> str | None:
    """The id of the queued job to serve next (locked on PostgreSQL, `SKIP LOCKED`), or None if none is due.

    A job another process holds locked is skipped for the next agent or team in turn, as `SKIP LOCKED`
    skipped it before.
    """
    lock = " FOR UPDATE SKIP LOCKED" if dialect == "postgresql" else ""
    for team in _in_turn(conn, dialect, None, now):
        for agent in _in_turn(conn, dialect, team, now):
            found = conn.execute(
                f"SELECT id FROM {queued(dialect, 'memories_fair_agent')} WHERE {QUEUED_ROWS} AND team = ? "
                f"AND agent_id = ? AND next_attempt_at <= ? ORDER BY next_attempt_at, created_at LIMIT 1{lock}",
                (team, agent, now),
            ).fetchone()
            if found is not None:
                return str(found[0])
    return None


def take_turn(conn: Any, team: str, agent_id: str) -> None:
    """Record that `team` and its `agent_id` were just served: both go to the back of their rounds."""
    turn = int(conn.execute("SELECT COALESCE(MAX(turn), 0) + 1 FROM queue_turns").fetchone()[0])
    for agent in (TEAM_ROW, agent_id):
        conn.execute(
            "INSERT INTO queue_turns (team, agent_id, turn) VALUES (?, ?, ?) "
            "ON CONFLICT (team, agent_id) DO UPDATE SET turn = excluded.turn",
            (team, agent, turn),
        )
