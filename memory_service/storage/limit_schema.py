"""The tables of the limits store and its two atomic upserts, in SQL both engines run.

Each check-and-count is one `INSERT ... ON CONFLICT DO UPDATE ... RETURNING`: atomic under SQLite's
database lock and under PostgreSQL's row lock alike, so several API processes count as one.
"""

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
-- a counter that reached its limit, written by that consume: the webhook loop moves it to the journal's outbox
CREATE TABLE IF NOT EXISTS limit_events (
    event_id TEXT PRIMARY KEY, team TEXT NOT NULL, payload TEXT NOT NULL, created_us INTEGER NOT NULL
);
"""

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
    expires_us    = CASE WHEN handled.expires_us <= excluded.last_seen_us
                         THEN excluded.expires_us ELSE handled.expires_us END,
    last_seen_us  = excluded.last_seen_us
RETURNING first_seen_us, last_seen_us, seen_count, expires_us
"""

UPSERT_LIMIT = """
INSERT INTO limit_defs (team, name, daily_limit, timezone, per, created_us, updated_us)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (team, name) DO UPDATE SET daily_limit = excluded.daily_limit,
    timezone = excluded.timezone, per = excluded.per, updated_us = excluded.updated_us
"""
