"""The tables of the limits store and its two atomic upserts, in SQL both engines run.

Each check-and-count is one `INSERT ... ON CONFLICT DO UPDATE ... RETURNING`: atomic under SQLite's
database lock and under PostgreSQL's row lock alike, so several API processes count as one.
"""

from __future__ import annotations

from .database import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS limit_defs (
    team TEXT NOT NULL, name TEXT NOT NULL,
    daily_limit INTEGER NOT NULL, timezone TEXT NOT NULL, per TEXT NOT NULL,
    created_us INTEGER NOT NULL, updated_us INTEGER NOT NULL,
    PRIMARY KEY (team, name)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS limit_usage (
    team TEXT NOT NULL, name TEXT NOT NULL, day TEXT NOT NULL, agent_id TEXT NOT NULL,
    used INTEGER NOT NULL,
    PRIMARY KEY (team, name, day, agent_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS limit_idempotency (
    team TEXT NOT NULL, name TEXT NOT NULL, day TEXT NOT NULL, idem_key TEXT NOT NULL,
    agent_id TEXT NOT NULL, amount INTEGER NOT NULL, response TEXT NOT NULL, created_us INTEGER NOT NULL,
    PRIMARY KEY (team, name, day, idem_key)
);
CREATE INDEX IF NOT EXISTS limit_idempotency_created ON limit_idempotency (created_us);
CREATE TABLE IF NOT EXISTS handled (
    team TEXT NOT NULL, agent_id TEXT NOT NULL, key TEXT NOT NULL,
    first_seen_us INTEGER NOT NULL, last_seen_us INTEGER NOT NULL,
    seen_count INTEGER NOT NULL, expires_us INTEGER,
    PRIMARY KEY (team, agent_id, key)
);
CREATE INDEX IF NOT EXISTS handled_expires ON handled (expires_us) WHERE expires_us IS NOT NULL;
-- the gate's reservations: a tool call that holds its key (and the units it consumed) until finished,
-- released, or its lease runs out. `ledger` is whose ledger the key is in ('' the team's, else the agent's);
-- `counter` the limit_usage row it consumed from (day and agent_id), so a release refunds that row.
CREATE TABLE IF NOT EXISTS gate_reservations (
    id TEXT PRIMARY KEY, team TEXT NOT NULL, ledger TEXT NOT NULL, key TEXT,
    agent_id TEXT, tool TEXT NOT NULL,
    limit_name TEXT, limit_day TEXT, counter TEXT, units INTEGER NOT NULL,
    created_us INTEGER NOT NULL, expires_us INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS gate_reservations_key ON gate_reservations (team, ledger, key);
CREATE INDEX IF NOT EXISTS gate_reservations_expires ON gate_reservations (expires_us);
-- a counter that reached its limit, written by that consume: the webhook loop moves it to the journal's outbox
CREATE TABLE IF NOT EXISTS limit_events (
    event_id TEXT PRIMARY KEY, team TEXT NOT NULL, payload TEXT NOT NULL, created_us INTEGER NOT NULL
);
"""

# Columns added to the ledger for the gate (who handled it, with which tool, its short result), null in the
# records /v1/handled writes and in stores from before the gate: `upgrade` adds them to an existing store.
HANDLED_COLUMNS = (("handled", "done_by"), ("handled", "tool"), ("handled", "result"))

# PostgreSQL: the same tables; microsecond clocks need 64-bit integers, and every table has a primary key.
POSTGRES_SCHEMA = SCHEMA.replace(" WITHOUT ROWID", "").replace("INTEGER", "BIGINT")

# Adds `amount` only while the day's total stays within the limit; no row back = denied.
CONSUME = """
INSERT INTO limit_usage (team, name, day, agent_id, used) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (team, name, day, agent_id) DO UPDATE SET used = limit_usage.used + excluded.used
WHERE limit_usage.used + excluded.used <= ?
RETURNING used
"""

# Set-if-absent; an expired row starts over as if it had never been seen.
MARK_HANDLED = """
INSERT INTO handled (team, agent_id, key, first_seen_us, last_seen_us, seen_count, expires_us)
VALUES (?, ?, ?, ?, ?, 1, ?)
ON CONFLICT (team, agent_id, key) DO UPDATE SET
    first_seen_us = CASE WHEN handled.expires_us <= excluded.last_seen_us
                         THEN excluded.first_seen_us ELSE handled.first_seen_us END,
    seen_count    = CASE WHEN handled.expires_us <= excluded.last_seen_us
                         THEN 1 ELSE handled.seen_count + 1 END,
    done_by       = CASE WHEN handled.expires_us <= excluded.last_seen_us THEN NULL ELSE handled.done_by END,
    tool          = CASE WHEN handled.expires_us <= excluded.last_seen_us THEN NULL ELSE handled.tool END,
    result        = CASE WHEN handled.expires_us <= excluded.last_seen_us THEN NULL ELSE handled.result END,
    expires_us    = CASE WHEN handled.expires_us <= excluded.last_seen_us
                         THEN excluded.expires_us ELSE handled.expires_us END,
    last_seen_us  = excluded.last_seen_us
RETURNING first_seen_us, last_seen_us, seen_count, expires_us, done_by, tool, result
"""

UPSERT_LIMIT = """
INSERT INTO limit_defs (team, name, daily_limit, timezone, per, created_us, updated_us)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (team, name) DO UPDATE SET daily_limit = excluded.daily_limit,
    timezone = excluded.timezone, per = excluded.per, updated_us = excluded.updated_us
"""

# The gate's finish: the key recorded handled with who, which tool and the result. An expired record starts
# over; a live one (marked through /v1/handled while the reservation held) keeps its first sighting and fills
# in what it lacked.
FINISH_HANDLED = """
INSERT INTO handled (team, agent_id, key, first_seen_us, last_seen_us, seen_count, expires_us, done_by, tool, result)
VALUES (?, ?, ?, ?, ?, 1, NULL, ?, ?, ?)
ON CONFLICT (team, agent_id, key) DO UPDATE SET
    first_seen_us = CASE WHEN handled.expires_us <= excluded.last_seen_us
                         THEN excluded.first_seen_us ELSE handled.first_seen_us END,
    seen_count    = CASE WHEN handled.expires_us <= excluded.last_seen_us
                         THEN 1 ELSE handled.seen_count + 1 END,
    done_by       = CASE WHEN handled.expires_us <= excluded.last_seen_us OR handled.done_by IS NULL
                         THEN excluded.done_by ELSE handled.done_by END,
    tool          = CASE WHEN handled.expires_us <= excluded.last_seen_us OR handled.tool IS NULL
                         THEN excluded.tool ELSE handled.tool END,
    result        = CASE WHEN handled.expires_us <= excluded.last_seen_us OR handled.result IS NULL
                         THEN excluded.result ELSE handled.result END,
    expires_us    = CASE WHEN handled.expires_us <= excluded.last_seen_us
                         THEN NULL ELSE handled.expires_us END,
    last_seen_us  = excluded.last_seen_us
RETURNING first_seen_us
"""

SCHEMA_LOCK = 7263545  # the advisory lock PostgreSQL's schema work takes (database.py, schema_upgrades.py)


def upgrade(db: Database) -> None:
    """Add the columns a store from before the gate lacks (HANDLED_COLUMNS); a no-op once they are there.

    One transaction: SQLite's BEGIN IMMEDIATE, or PostgreSQL's schema lock, keeps two processes opening the
    store at once from adding a column twice."""
    with db.transaction() as conn:
        for table, column in HANDLED_COLUMNS:
            if db.dialect == "postgresql":
                conn.execute(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK})")
                have = conn.execute(
                    "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()"
                    " AND table_name = ? AND column_name = ?",
                    (table, column),
                ).fetchone()
            else:
                have = column in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
            if not have:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT")
