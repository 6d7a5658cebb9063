"""Which queued job is served next: round-robin across teams, then across a team's agents, then the oldest.

In global order one team's backlog of 500 saves would delay every other team's extraction by 500 jobs. So
the claim takes the team whose turn is oldest among teams with a due job (a team never served goes first),
within it the agent likewise, and within that agent the due job first due (then first saved), as before:
another team waits at most one job per active team, whatever one team has queued.

A turn is a number from `queue_turns` (one row per team, agent_id '', and one per agent), one more than
the highest on every claim: a counter, not a clock, so claims in the same instant still alternate.
The choice reads only the partial indexes `memories_fair_team` and `memories_fair_agent` (queued rows):
one index probe per team with queued jobs and per agent weighed, whatever their backlogs, in one query per
level.

A team's agents are weighed at most `AGENT_WINDOW` at a time: those with queued jobs that follow, in name
order, the agent the team last served (wrapping round). Agent ids are the caller's to choose: weighing every
one made a claim for a team that queued one save under each of 10,000 ids take 68 ms (4 ms with 10), in a
write transaction that every save of every team waits for (issue 53). With at most 64 agents queued nothing
changes; past that, the round goes through the agents in name order, a window at a time, each agent's
turn still the oldest first within it, so every agent is served once in about as many of its team's claims
as there are agents, and a newcomer waits at most that long rather than going first.
"""

from __future__ import annotations

from typing import Any

TEAM_ROW = ""  # the team's own turn row: '' is no valid agent_id, and sorts before every one
AGENT_WINDOW = 64  # a team's agents one claim weighs at most
# the partial indexes' own terms: SQLite uses a partial index only for a literal that matches it
QUEUED_ROWS = "status = 'queued'"


def queued(dialect: str, index: str) -> str:
    """The queued rows read through `index`. SQLite is told the index: with no statistics its planner took
    `memories_leases` (status) for `MIN(team)`, a scan of the whole queue; PostgreSQL plans from its own."""
    return f"memories INDEXED BY {index}" if dialect == "sqlite" else "memories"


def level_sql(dialect: str, agents: bool) -> str:
    """One query for a round's candidates: the teams with queued jobs (or, `agents`, at most as many agents
    of a team as its 4th parameter says, in name order after its 2nd: parameters team, after, team, limit,
    team, team), each with its earliest next_attempt_at and its last turn.

    A loose index scan (a recursive `MIN(x) WHERE x > previous`): one index probe per distinct value, in
    one round trip, so a backlog of 100,000 in one team or agent costs what a backlog of one does.
    """
    if agents:
        table, where = queued(dialect, "memories_fair_agent"), f"{QUEUED_ROWS} AND team = ?"
        return (
            f"WITH RECURSIVE names(name, n) AS (SELECT MIN(agent_id), 1 FROM {table} WHERE {where} AND agent_id > ? "
            f"UNION ALL SELECT (SELECT MIN(agent_id) FROM {table} WHERE {where} AND agent_id > names.name), n + 1 "
            "FROM names WHERE names.name IS NOT NULL AND n < ?) "
            f"SELECT name, (SELECT MIN(next_attempt_at) FROM {table} WHERE {where} AND agent_id = names.name), "
            "(SELECT turn FROM queue_turns WHERE team = ? AND agent_id = names.name) FROM names WHERE name IS NOT NULL"
        )
    table = queued(dialect, "memories_fair_team")
    return (
        f"WITH RECURSIVE names(name) AS (SELECT MIN(team) FROM {table} WHERE {QUEUED_ROWS} "
        f"UNION ALL SELECT (SELECT MIN(team) FROM {table} WHERE {QUEUED_ROWS} AND team > names.name) "
        "FROM names WHERE names.name IS NOT NULL) "
        f"SELECT name, (SELECT MIN(next_attempt_at) FROM {table} WHERE {QUEUED_ROWS} AND team = names.name), "
        f"(SELECT turn FROM queue_turns WHERE team = names.name AND agent_id = '{TEAM_ROW}') "
        "FROM names WHERE name IS NOT NULL"
    )


# the agent a team served last: its turn row has the team row's turn (`take_turn` writes both)
LAST_SERVED_SQL = (
    "SELECT MIN(agent_id) FROM queue_turns WHERE turn = "
    f"(SELECT turn FROM queue_turns WHERE team = ? AND agent_id = '{TEAM_ROW}') AND team = ? AND agent_id <> '{TEAM_ROW}'"
)


def _by_turn(rows: list[Any], now: float) -> list[str]:
    """The names of `rows` (name, first due, turn) with a due job, the oldest turn first (never served first,
    then the one due longest)."""
    due = sorted((0 if turn is None else int(turn), first, name) for name, first, turn in rows if first <= now)
    return [name for _, _, name in due]


def _teams_in_turn(conn: Any, dialect: str, now: float) -> list[str]:
    """Teams with a due job, in turn. Only teams with queued jobs are read, never every team ever served."""
    return _by_turn(conn.execute(level_sql(dialect, agents=False)).fetchall(), now)


def _agents_in_turn(conn: Any, dialect: str, team: str, now: float) -> list[str]:
    """`team`'s agents with a due job, in turn, among at most `AGENT_WINDOW` of them: those that follow the
    agent it served last, in name order, wrapping round to the first names when the last are fewer."""
    last = conn.execute(LAST_SERVED_SQL, (team, team)).fetchone()[0] or TEAM_ROW
    sql = level_sql(dialect, agents=True)
    rows = list(conn.execute(sql, (team, last, team, AGENT_WINDOW, team, team)).fetchall())
    if len(rows) < AGENT_WINDOW and last != TEAM_ROW:
        seen = {row[0] for row in rows}
        wrapped = conn.execute(sql, (team, TEAM_ROW, team, AGENT_WINDOW - len(rows), team, team)).fetchall()
        rows += [row for row in wrapped if row[0] not in seen]
    return _by_turn(rows, now)


def next_due(conn: Any, now: float, dialect: str) -> str | None:
    """The id of the queued job to serve next (locked on PostgreSQL, `SKIP LOCKED`), or None if none is due.

    A job another process holds locked is skipped for the next agent or team in turn, as `SKIP LOCKED`
    skipped it before.
    """
    lock = " FOR UPDATE SKIP LOCKED" if dialect == "postgresql" else ""
    for team in _teams_in_turn(conn, dialect, now):
        for agent in _agents_in_turn(conn, dialect, team, now):
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
