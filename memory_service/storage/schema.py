"""The journal's tables, in SQLite's and in PostgreSQL's words.

SQLite: FTS5 tables kept by triggers give keyword search. PostgreSQL: `rowid` is a real column (keyset
paging and the copy order use it) and keyword search is a generated `tsvector` column with a GIN index.
Either way the keyword index is written in the save's own transaction.

`pinned` (on a memory: saved by a key pinned to its agent; on a fact: written by such a save) keeps a pinned
save's dedup and supersede inside its agent's facts, and other agents' saves out of those facts
(docs/security.md, "Write scope").

These are the current tables; an older journal is brought to them by `schema_upgrades` first.

`webhook_subscriptions` and `webhook_outbox` (storage/webhooks.py) live here so that an event's outbox rows
are written in the event's own transaction: a job's end and its notice commit together or not at all.
`memory_versions` holds the earlier texts of a memory a mem0 update replaced (storage/versions.py).
"""

# `{real}`: REAL on SQLite, DOUBLE PRECISION on PostgreSQL (a REAL there is 4 bytes: no timestamp fits)
WEBHOOK_TABLES = (
    """CREATE TABLE IF NOT EXISTS webhook_subscriptions (
    id TEXT PRIMARY KEY,
    team TEXT NOT NULL,
    url TEXT NOT NULL,
    events TEXT NOT NULL,
    secret TEXT NOT NULL,
    created_at {real} NOT NULL,
    delivered INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    last_delivery_at {real},
    last_failure_at {real},
    last_error TEXT
)""",
    "CREATE INDEX IF NOT EXISTS webhook_subscriptions_team ON webhook_subscriptions(team)",
    """CREATE TABLE IF NOT EXISTS webhook_outbox (
    event_id TEXT NOT NULL,
    subscription_id TEXT NOT NULL,
    team TEXT NOT NULL,
    event TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at {real} NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at {real} NOT NULL,
    last_error TEXT,
    PRIMARY KEY (event_id, subscription_id)
)""",
    "CREATE INDEX IF NOT EXISTS webhook_outbox_due ON webhook_outbox(status, next_attempt_at)",
    "CREATE INDEX IF NOT EXISTS webhook_outbox_subscription ON webhook_outbox(subscription_id, status)",
    # a subscription's next due row in one probe (WebhookStore.due): made on every open, so old journals get it
    "CREATE INDEX IF NOT EXISTS webhook_outbox_subscription_due "
    "ON webhook_outbox(subscription_id, status, next_attempt_at)",
)


# mem0 updates' earlier versions (storage/versions.py): rows, not metadata, so no count of updates can grow a
# memory's metadata past its bound
VERSION_TABLES = (
    """CREATE TABLE IF NOT EXISTS memory_versions (
    team TEXT NOT NULL,
    memory_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    version_id TEXT NOT NULL,
    text TEXT NOT NULL,
    at {real} NOT NULL,
    PRIMARY KEY (team, memory_id, seq)
)""",
)


def version_tables(dialect: str) -> str:
    """The versions table as one script in `dialect`'s words."""
    real = "DOUBLE PRECISION" if dialect == "postgresql" else "REAL"
    return ";\n".join(sql.format(real=real) for sql in VERSION_TABLES) + ";\n"


def webhook_tables(dialect: str) -> str:
    """The webhook tables as one script in `dialect`'s words."""
    real = "DOUBLE PRECISION" if dialect == "postgresql" else "REAL"
    return ";\n".join(sql.format(real=real) for sql in WEBHOOK_TABLES) + ";\n"


SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS memories (
    id TEXT PRIMARY KEY,
    team TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    run_id TEXT,
    text TEXT NOT NULL,
    tags TEXT NOT NULL DEFAULT '[]',
    metadata TEXT NOT NULL DEFAULT '{}',
    idempotency_key TEXT,
    created_at REAL NOT NULL,
    status TEXT NOT NULL DEFAULT 'queued',
    attempts INTEGER NOT NULL DEFAULT 0,
    deferrals INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    deadline_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    last_error TEXT,
    raw_reply TEXT,
    timings TEXT,
    report TEXT,
    indexed INTEGER NOT NULL DEFAULT 0,
    progress TEXT,
    occurred_at REAL,
    occurred_day TEXT,
    lease_owner TEXT,
    lease_until REAL,
    pinned INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX IF NOT EXISTS memories_idem ON memories(team, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS memories_queue ON memories(status, next_attempt_at);
CREATE INDEX IF NOT EXISTS memories_leases ON memories(status, lease_until);
CREATE INDEX IF NOT EXISTS memories_unindexed ON memories(indexed) WHERE indexed = 0;
CREATE INDEX IF NOT EXISTS memories_team_time ON memories(team, created_at, id);
CREATE INDEX IF NOT EXISTS memories_team_agent ON memories(team, agent_id);
-- a team's own pending jobs (remember's queue_depth): only queued and running rows, a few at any time
CREATE INDEX IF NOT EXISTS memories_team_pending ON memories(team, created_at)
    WHERE status IN ('queued', 'extracting');
-- a conversation's earlier saves (extraction context): a run, or an agent's saves without a run
CREATE INDEX IF NOT EXISTS memories_conversation ON memories(team, run_id, agent_id, created_at);
-- the claim's round-robin (storage/fair_queue.py): queued rows by team and by agent, and each one's last turn
CREATE INDEX IF NOT EXISTS memories_fair_team ON memories(team, next_attempt_at) WHERE status = 'queued';
CREATE INDEX IF NOT EXISTS memories_fair_agent ON memories(team, agent_id, next_attempt_at, created_at)
    WHERE status = 'queued';
CREATE TABLE IF NOT EXISTS queue_turns (
    team TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    turn INTEGER NOT NULL,
    PRIMARY KEY (team, agent_id)
);
CREATE INDEX IF NOT EXISTS queue_turns_turn ON queue_turns(turn);

CREATE TABLE IF NOT EXISTS facts (
    id TEXT PRIMARY KEY,
    team TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    memory_id TEXT NOT NULL,
    text TEXT NOT NULL,
    norm TEXT NOT NULL,
    shape TEXT NOT NULL,
    tags TEXT NOT NULL DEFAULT '[]',
    created_at REAL NOT NULL,
    superseded_by TEXT,
    superseded_at REAL,
    indexed INTEGER NOT NULL DEFAULT 1,
    pinned INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS facts_norm ON facts(team, norm);
CREATE INDEX IF NOT EXISTS facts_shape ON facts(team, shape);
CREATE INDEX IF NOT EXISTS facts_team_agent ON facts(team, agent_id);
CREATE INDEX IF NOT EXISTS facts_unindexed ON facts(indexed) WHERE indexed = 0;

CREATE TABLE IF NOT EXISTS fact_sources (
    fact_id TEXT NOT NULL,
    memory_id TEXT NOT NULL,
    span_start INTEGER NOT NULL,
    span_end INTEGER NOT NULL,
    added_at REAL NOT NULL,
    PRIMARY KEY (fact_id, memory_id, span_start)
);
CREATE INDEX IF NOT EXISTS fact_sources_memory ON fact_sources(memory_id);

-- fact vectors still to remove after a forget: the to-do list that survives a crash
CREATE TABLE IF NOT EXISTS fact_purges (
    team TEXT NOT NULL,
    fact_id TEXT NOT NULL,
    PRIMARY KEY (team, fact_id)
);

-- one row per time a worker took a job: who, from when to when, and how it ended
CREATE TABLE IF NOT EXISTS job_attempts (
    memory_id TEXT NOT NULL,
    worker TEXT NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    outcome TEXT,
    PRIMARY KEY (memory_id, worker, started_at)
);
CREATE INDEX IF NOT EXISTS job_attempts_memory ON job_attempts(memory_id);

CREATE VIRTUAL TABLE IF NOT EXISTS memories_fts USING fts5(text, content='memories', content_rowid='rowid', tokenize='porter unicode61');
CREATE TRIGGER IF NOT EXISTS memories_ai AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts(rowid, text) VALUES (new.rowid, new.text);
END;
CREATE VIRTUAL TABLE IF NOT EXISTS facts_fts USING fts5(text, content='facts', content_rowid='rowid', tokenize='porter unicode61');
CREATE TRIGGER IF NOT EXISTS facts_ai AFTER INSERT ON facts BEGIN
    INSERT INTO facts_fts(rowid, text) VALUES (new.rowid, new.text);
END;
"""
    + webhook_tables("sqlite")
    + version_tables("sqlite")
)

POSTGRES_SCHEMA = """
CREATE TABLE IF NOT EXISTS memories (
    rowid BIGSERIAL UNIQUE,
    id TEXT PRIMARY KEY,
    team TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    run_id TEXT,
    text TEXT NOT NULL,
    tags TEXT NOT NULL DEFAULT '[]',
    metadata TEXT NOT NULL DEFAULT '{}',
    idempotency_key TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    status TEXT NOT NULL DEFAULT 'queued',
    attempts INTEGER NOT NULL DEFAULT 0,
    deferrals INTEGER NOT NULL DEFAULT 0,
    next_attempt_at DOUBLE PRECISION NOT NULL,
    deadline_at DOUBLE PRECISION NOT NULL,
    started_at DOUBLE PRECISION,
    finished_at DOUBLE PRECISION,
    last_error TEXT,
    raw_reply TEXT,
    timings TEXT,
    report TEXT,
    indexed INTEGER NOT NULL DEFAULT 0,
    progress TEXT,
    occurred_at DOUBLE PRECISION,
    occurred_day TEXT,
    lease_owner TEXT,
    lease_until DOUBLE PRECISION,
    pinned INTEGER NOT NULL DEFAULT 0,
    tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED
);
CREATE UNIQUE INDEX IF NOT EXISTS memories_idem ON memories(team, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS memories_queue ON memories(status, next_attempt_at);
CREATE INDEX IF NOT EXISTS memories_leases ON memories(status, lease_until);
CREATE INDEX IF NOT EXISTS memories_unindexed ON memories(indexed) WHERE indexed = 0;
CREATE INDEX IF NOT EXISTS memories_team_time ON memories(team, created_at, id);
CREATE INDEX IF NOT EXISTS memories_team_agent ON memories(team, agent_id);
-- a team's own pending jobs (remember's queue_depth): only queued and running rows, a few at any time
CREATE INDEX IF NOT EXISTS memories_team_pending ON memories(team, created_at)
    WHERE status IN ('queued', 'extracting');
CREATE INDEX IF NOT EXISTS memories_conversation ON memories(team, run_id, agent_id, created_at);
CREATE INDEX IF NOT EXISTS memories_tsv ON memories USING GIN (tsv);
-- the claim's round-robin (storage/fair_queue.py): queued rows by team and by agent, and each one's last turn
CREATE INDEX IF NOT EXISTS memories_fair_team ON memories(team, next_attempt_at) WHERE status = 'queued';
CREATE INDEX IF NOT EXISTS memories_fair_agent ON memories(team, agent_id, next_attempt_at, created_at)
    WHERE status = 'queued';
CREATE TABLE IF NOT EXISTS queue_turns (
    team TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    turn BIGINT NOT NULL,
    PRIMARY KEY (team, agent_id)
);
CREATE INDEX IF NOT EXISTS queue_turns_turn ON queue_turns(turn);

CREATE TABLE IF NOT EXISTS facts (
    rowid BIGSERIAL UNIQUE,
    id TEXT PRIMARY KEY,
    team TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    memory_id TEXT NOT NULL,
    text TEXT NOT NULL,
    norm TEXT NOT NULL,
    shape TEXT NOT NULL,
    tags TEXT NOT NULL DEFAULT '[]',
    created_at DOUBLE PRECISION NOT NULL,
    superseded_by TEXT,
    superseded_at DOUBLE PRECISION,
    indexed INTEGER NOT NULL DEFAULT 1,
    pinned INTEGER NOT NULL DEFAULT 0,
    tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED
);
CREATE INDEX IF NOT EXISTS facts_norm ON facts(team, norm);
CREATE INDEX IF NOT EXISTS facts_shape ON facts(team, shape);
CREATE INDEX IF NOT EXISTS facts_team_agent ON facts(team, agent_id);
CREATE INDEX IF NOT EXISTS facts_unindexed ON facts(indexed) WHERE indexed = 0;
CREATE INDEX IF NOT EXISTS facts_tsv ON facts USING GIN (tsv);

CREATE TABLE IF NOT EXISTS fact_sources (
    fact_id TEXT NOT NULL,
    memory_id TEXT NOT NULL,
    span_start INTEGER NOT NULL,
    span_end INTEGER NOT NULL,
    added_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (fact_id, memory_id, span_start)
);
CREATE INDEX IF NOT EXISTS fact_sources_memory ON fact_sources(memory_id);

CREATE TABLE IF NOT EXISTS fact_purges (
    team TEXT NOT NULL,
    fact_id TEXT NOT NULL,
    PRIMARY KEY (team, fact_id)
);

CREATE TABLE IF NOT EXISTS job_attempts (
    memory_id TEXT NOT NULL,
    worker TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    ended_at DOUBLE PRECISION,
    outcome TEXT,
    PRIMARY KEY (memory_id, worker, started_at)
);
CREATE INDEX IF NOT EXISTS job_attempts_memory ON job_attempts(memory_id);
""" + (webhook_tables("postgresql") + version_tables("postgresql")).rstrip().rstrip(";")
