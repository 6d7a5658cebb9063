"""The journal: every saved text, its extraction job, and the facts it produced.

SQLite in WAL mode with `synchronous=FULL`, so a row is on disk before
`/remember` answers. The job queue lives in the same table as the text: a job
cannot be lost without losing its text, and a restart resumes whatever was
`queued` or `extracting`. A keyword index (FTS5) is written in the same
transaction, so a saved text is findable by recall the moment it is acked,
before any embedding or model work.

All methods are synchronous and thread-safe (one connection, one lock); the
async code calls them through `asyncio.to_thread`.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

from ..text import STOPWORDS
from .database import Database, SqliteDatabase

SCHEMA = """
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
    lease_until REAL
);
CREATE UNIQUE INDEX IF NOT EXISTS memories_idem ON memories(team, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS memories_queue ON memories(status, next_attempt_at);
CREATE INDEX IF NOT EXISTS memories_unindexed ON memories(indexed) WHERE indexed = 0;
CREATE INDEX IF NOT EXISTS memories_team_time ON memories(team, created_at, id);
CREATE INDEX IF NOT EXISTS memories_team_agent ON memories(team, agent_id);
-- a conversation's earlier saves (extraction context): a run, or an agent's saves without a run
CREATE INDEX IF NOT EXISTS memories_conversation ON memories(team, run_id, agent_id, created_at);

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
    indexed INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS facts_norm ON facts(team, norm);
CREATE INDEX IF NOT EXISTS facts_shape ON facts(team, shape);
CREATE INDEX IF NOT EXISTS facts_team_agent ON facts(team, agent_id);

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

# The same tables on PostgreSQL: `rowid` is a real column there (keyset paging uses it), and keyword search
# is a generated `tsvector` with a GIN index, written in the same transaction as the text.
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
    tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED
);
CREATE UNIQUE INDEX IF NOT EXISTS memories_idem ON memories(team, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS memories_queue ON memories(status, next_attempt_at);
CREATE INDEX IF NOT EXISTS memories_unindexed ON memories(indexed) WHERE indexed = 0;
CREATE INDEX IF NOT EXISTS memories_team_time ON memories(team, created_at, id);
CREATE INDEX IF NOT EXISTS memories_team_agent ON memories(team, agent_id);
CREATE INDEX IF NOT EXISTS memories_conversation ON memories(team, run_id, agent_id, created_at);
CREATE INDEX IF NOT EXISTS memories_tsv ON memories USING GIN (tsv);

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
CREATE INDEX IF NOT EXISTS job_attempts_memory ON job_attempts(memory_id)
"""

QUEUED, EXTRACTING, DONE, FAILED = "queued", "extracting", "done", "failed"
# A forgotten memory whose vectors are not removed yet: invisible to every read, purged on completion.
DELETED = "deleted"
# What `fail_attempt` answers when the worker's lease was taken over: the job is someone else's now.
LOST = "lost"


@dataclass
class Memory:
    id: str
    team: str
    agent_id: str
    run_id: str | None
    text: str
    tags: list[str]
    metadata: dict[str, Any]
    idempotency_key: str | None
    created_at: float
    status: str
    attempts: int
    deferrals: int
    next_attempt_at: float
    deadline_at: float
    started_at: float | None
    finished_at: float | None
    last_error: str | None
    raw_reply: str | None
    timings: dict[str, Any] | None
    report: dict[str, Any] | None
    progress: dict[str, Any] | None = None  # chunks already extracted, when a long text is part-way
    occurred_at: float | None = None  # when what the text tells happened, if the saver said; else created_at
    occurred_day: str | None = None  # that day (YYYY-MM-DD) where it was said: relative dates count from it
    lease_owner: str | None = None  # the worker extracting it now

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> "Memory":
        return cls(
            id=row["id"], team=row["team"], agent_id=row["agent_id"], run_id=row["run_id"], text=row["text"],
            tags=json.loads(row["tags"]), metadata=json.loads(row["metadata"]),
            idempotency_key=row["idempotency_key"], created_at=row["created_at"], status=row["status"],
            attempts=row["attempts"], deferrals=row["deferrals"], next_attempt_at=row["next_attempt_at"],
            deadline_at=row["deadline_at"], started_at=row["started_at"], finished_at=row["finished_at"],
            last_error=row["last_error"], raw_reply=row["raw_reply"],
            timings=json.loads(row["timings"]) if row["timings"] else None,
            report=json.loads(row["report"]) if row["report"] else None,
            progress=json.loads(row["progress"]) if row["progress"] else None,
            occurred_at=row["occurred_at"], occurred_day=row["occurred_day"], lease_owner=row["lease_owner"],
        )


@dataclass
class Fact:
    id: str
    team: str
    agent_id: str
    memory_id: str
    text: str
    norm: str
    shape: str
    tags: list[str]
    created_at: float
    superseded_by: str | None = None
    superseded_at: float | None = None
    sources: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class NewFact:
    """A grounded fact ready to be stored; `id` is deterministic so a replayed job upserts, not duplicates."""

    id: str
    text: str
    norm: str
    shape: str
    spans: list[tuple[int, int]]


@dataclass
class FactPlan:
    """What the dedup step decided for one job, applied in one transaction."""

    new: list[NewFact] = field(default_factory=list)
    merged: list[tuple[str, list[tuple[int, int]]]] = field(default_factory=list)  # (existing fact id, spans)
    superseded: list[tuple[str, str]] = field(default_factory=list)  # (old fact id, new fact id)
    born_superseded: list[tuple[str, str]] = field(default_factory=list)  # (new fact id, newer existing id)
    # (fact id, earlier memory id, span): a fact that also rests on an earlier save given as context
    context_sources: list[tuple[str, str, tuple[int, int]]] = field(default_factory=list)


@dataclass
class KeywordHit:
    kind: str  # passage | fact
    item_id: str
    memory_id: str
    text: str
    rank: float


# Keyword leg bounds (BM25 costs ~5-10 us a row, the join to the item as much): rows the rarest words may
# match before the rest must co-occur, rows ranked at most, and rows looked at when a filter skips some.
KEYWORD_RARE_ROWS = 250
KEYWORD_MAX_RANKED = 200
KEYWORD_MAX_SCANNED = 1000
KEYWORD_AGENT_SET_ROWS = 5000  # an agent with at most this many rows is filtered as a set of rowids
DOC_FREQ_TTL_S = 30.0  # document frequencies only bound the work: a slightly old count is fine

_FTS_TOKEN = re.compile(r"[\w]+", re.UNICODE)


def fts_query(text: str) -> str | None:
    """Quote every content word, OR them: a free-text query must never be parsed as FTS syntax.

    Stopwords are left out: they match most rows, and BM25 must rank every row that matches.
    """
    words = fts_words(text)
    if not words:
        return None
    return " OR ".join(f'"{w}"' for w in words)


def fts_words(text: str) -> list[str]:
    """The query's content words, once each, in order."""
    return list(dict.fromkeys(w for w in _FTS_TOKEN.findall(text.lower()) if len(w) > 1 and w not in STOPWORDS))


_STEMMER = sqlite3.connect(":memory:", check_same_thread=False)
_STEMMER.executescript("CREATE VIRTUAL TABLE t USING fts5(x, tokenize='porter unicode61');"
                       "CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance');")
_STEMMER_LOCK = threading.Lock()


@lru_cache(maxsize=8192)
def _stems(word: str) -> tuple[str, ...]:
    """The index terms the FTS tokenizer makes of a word (its porter stems), to look them up in fts5vocab."""
    with _STEMMER_LOCK:
        _STEMMER.execute("INSERT INTO t(rowid, x) VALUES (1, ?)", (word,))
        terms = tuple(row[0] for row in _STEMMER.execute("SELECT term FROM v ORDER BY offset"))
        _STEMMER.execute("DELETE FROM t")
    return terms


def json_items(dialect: str, column: str, alias: str) -> str:
    """A FROM item listing the strings of a JSON array column as `alias.value`."""
    if dialect == "postgresql":
        return f"json_array_elements_text({column}::json) AS {alias}(value)"
    return f"json_each({column}) AS {alias}"


def has_tag(dialect: str, column: str) -> str:
    """A condition: the JSON array in `column` holds the tag given as the next parameter."""
    return f"EXISTS (SELECT 1 FROM {json_items(dialect, column, 'tag_')} WHERE tag_.value = ?)"


def _item_filter(kind: str, agent_id: str | None, tags: tuple[str, ...], since: float | None,
                 until: float | None, dialect: str = "sqlite") -> tuple[str, list[Any]]:
    """SQL conditions (on alias `t`) for recall's filters; a passage must also not be forgotten."""
    where: list[str] = []
    args: list[Any] = []
    if kind == "passage":
        where.append("t.status != ?")
        args.append(DELETED)
    else:
        where.append("t.superseded_by IS NULL")
    if agent_id is not None:
        where.append("t.agent_id = ?")
        args.append(agent_id)
    for tag in tags:
        where.append(has_tag(dialect, "t.tags"))
        args.append(tag)
    if since is not None:
        where.append("t.created_at >= ?")
        args.append(since)
    if until is not None:
        where.append("t.created_at <= ?")
        args.append(until)
    return "".join(" AND " + w for w in where), args


class Journal:
    """The journal on a `Database`: SQLite under the data dir, or PostgreSQL when given one."""

    def __init__(self, store: Path | Database) -> None:
        self._owns = not isinstance(store, Database)  # a shared database is closed by whoever opened it
        self.db: Database = store if isinstance(store, Database) else SqliteDatabase(store, synchronous="FULL")
        self.db.create_schema(SCHEMA, POSTGRES_SCHEMA)
        if isinstance(self.db, SqliteDatabase):
            conn = self.db.writer()
            columns = {row[1] for row in conn.execute("PRAGMA table_info(memories)")}
            # journals written before these columns existed: chunk progress, when a text happened, job leases
            for column, kind in (("progress", "TEXT"), ("occurred_at", "REAL"), ("occurred_day", "TEXT"),
                                 ("lease_owner", "TEXT"), ("lease_until", "REAL")):
                if column not in columns:
                    conn.execute(f"ALTER TABLE memories ADD COLUMN {column} {kind}")
            if "indexed" not in {row[1] for row in conn.execute("PRAGMA table_info(facts)")}:
                conn.execute("ALTER TABLE facts ADD COLUMN indexed INTEGER NOT NULL DEFAULT 1")
            conn.execute("CREATE INDEX IF NOT EXISTS facts_unindexed ON facts(indexed) WHERE indexed = 0")
            with self.db.reading() as reader:  # document frequencies, for the bounded keyword search
                for fts in ("memories_fts", "facts_fts"):
                    reader.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{fts}_vocab USING fts5vocab(main, {fts}, 'row')")
        self._df_cache: dict[tuple[str, str], tuple[int, float]] = {}
        self._team_locks: dict[str, threading.Lock] = {}
        self._team_locks_guard = threading.Lock()

    @property
    def dialect(self) -> str:
        return self.db.dialect

    def close(self) -> None:
        if self._owns:
            self.db.close()

    # -- writes -----------------------------------------------------------------

    @contextmanager
    def deciding(self, team: str) -> Iterator[None]:
        """Held while a job's facts are decided (new, merged, superseding) and stored: one decision per team
        at a time, so two workers never both add the same fact or both supersede one. Every process on a
        shared PostgreSQL waits on the same advisory lock; on SQLite one process owns the file."""
        if self.db.dialect == "postgresql":
            with self.db.transaction() as conn:
                conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", ("facts\x1f" + team,))
                yield
            return
        with self._team_locks_guard:
            lock = self._team_locks.setdefault(team, threading.Lock())
        with lock:
            yield

    def transaction(self) -> Any:
        """One write transaction, for the storage modules built on the journal."""
        return self.db.transaction()

    def reading(self) -> Any:
        """A read connection, for the storage modules built on the journal."""
        return self.db.reading()

    def insert(
        self,
        *,
        team: str,
        agent_id: str,
        text: str,
        run_id: str | None,
        tags: list[str],
        metadata: dict[str, Any],
        idempotency_key: str | None,
        budget_s: float,
        now: float | None = None,
        occurred_at: float | None = None,
        occurred_day: str | None = None,
    ) -> tuple[Memory, bool]:
        """Commit a text and its job; returns (memory, created). An idempotency hit returns the first one.

        The insert skips on a conflict instead of failing: two processes saving the same key at once both
        answer with the one row that won.
        """
        now = time.time() if now is None else now
        with self.db.transaction() as conn:
            if idempotency_key is not None:
                row = conn.execute(
                    "SELECT * FROM memories WHERE team = ? AND idempotency_key = ?", (team, idempotency_key)
                ).fetchone()
                if row is not None:
                    return Memory.from_row(row), False
            memory_id = "mem_" + uuid.uuid4().hex
            inserted = conn.execute(
                """INSERT INTO memories (id, team, agent_id, run_id, text, tags, metadata, idempotency_key,
                   created_at, next_attempt_at, deadline_at, occurred_at, occurred_day)
                   VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING""",
                (memory_id, team, agent_id, run_id, text, json.dumps(tags), json.dumps(metadata),
                 idempotency_key, now, now, now + budget_s, occurred_at, occurred_day),
            ).rowcount
            if not inserted:
                row = conn.execute("SELECT * FROM memories WHERE team = ? AND idempotency_key = ?",
                                   (team, idempotency_key)).fetchone()
                return Memory.from_row(row), False
            row = conn.execute("SELECT * FROM memories WHERE id = ?", (memory_id,)).fetchone()
            return Memory.from_row(row), True

    def recover(self, owner: str | None = None) -> int:
        """Jobs taken but not finished go back to the queue: every one (one process owns this journal,
        at its start and stop), or those whose lease names `owner` as prefix (one of several processes
        stopping; the others keep theirs)."""
        now = time.time()
        where, args = "status = ?", [EXTRACTING]
        if owner is not None:
            where += " AND lease_owner LIKE ?"
            args.append(owner.replace("%", "") + "%")
        with self.db.transaction() as conn:
            conn.execute(f"UPDATE job_attempts SET ended_at = ?, outcome = 'released' WHERE ended_at IS NULL "
                         f"AND memory_id IN (SELECT id FROM memories WHERE {where})", (now, *args))
            return conn.execute(
                f"UPDATE memories SET status = ?, started_at = NULL, lease_owner = NULL, lease_until = NULL "
                f"WHERE {where}", (QUEUED, *args)
            ).rowcount

    def claim_next(self, worker: str = "local", lease_s: float = 60.0, now: float | None = None) -> Memory | None:
        """Lease the next due job to `worker` for `lease_s` (renewed while it runs), or None.

        A job whose lease ran out (its process died) is due again: another worker takes it over, with no
        restart. On PostgreSQL `SKIP LOCKED` lets every process claim at once without taking the same row.
        """
        now = time.time() if now is None else now
        lock = " FOR UPDATE SKIP LOCKED" if self.db.dialect == "postgresql" else ""
        with self.db.transaction() as conn:
            row = conn.execute(
                "SELECT * FROM memories WHERE (status = ? AND next_attempt_at <= ?) "
                "OR (status = ? AND lease_until < ?) "
                f"ORDER BY next_attempt_at, created_at LIMIT 1{lock}",
                (QUEUED, now, EXTRACTING, now),
            ).fetchone()
            if row is None:
                return None
            if row["status"] == EXTRACTING:  # taken over: the previous holder's attempt ended with its lease
                conn.execute("UPDATE job_attempts SET ended_at = ?, outcome = 'lease expired' "
                             "WHERE memory_id = ? AND ended_at IS NULL", (row["lease_until"], row["id"]))
            conn.execute("UPDATE memories SET status = ?, started_at = ?, lease_owner = ?, lease_until = ? "
                         "WHERE id = ?", (EXTRACTING, now, worker, now + lease_s, row["id"]))
            conn.execute("INSERT INTO job_attempts (memory_id, worker, started_at) VALUES (?, ?, ?)",
                         (row["id"], worker, now))
            memory = Memory.from_row(row)
            memory.status, memory.started_at, memory.lease_owner = EXTRACTING, now, worker
            return memory

    def renew(self, memory_id: str, worker: str, lease_s: float, now: float | None = None) -> bool:
        """Extend `worker`'s lease on a running job; False when it is no longer the holder."""
        now = time.time() if now is None else now
        with self.db.transaction() as conn:
            return conn.execute("UPDATE memories SET lease_until = ? WHERE id = ? AND status = ? AND lease_owner = ?",
                                (now + lease_s, memory_id, EXTRACTING, worker)).rowcount == 1

    def attempts_of(self, memory_id: str) -> list[tuple[str, float, float | None, str | None]]:
        """(worker, started_at, ended_at, outcome) of every time a worker took this job, oldest first."""
        with self.db.reading() as conn:
            rows = conn.execute("SELECT worker, started_at, ended_at, outcome FROM job_attempts "
                                "WHERE memory_id = ? ORDER BY started_at", (memory_id,)).fetchall()
        return [(r[0], float(r[1]), None if r[2] is None else float(r[2]), r[3]) for r in rows]

    @staticmethod
    def _held(owner: str | None) -> tuple[str, tuple[Any, ...]]:
        """The condition that the job is still this worker's (none when no owner is named)."""
        return ("", ()) if owner is None else (" AND status = 'extracting' AND lease_owner = ?", (owner,))

    @staticmethod
    def _end_attempt(conn: Any, memory_id: str, owner: str | None, outcome: str, now: float) -> None:
        if owner is not None:
            conn.execute("UPDATE job_attempts SET ended_at = ?, outcome = ? WHERE memory_id = ? AND worker = ? "
                         "AND ended_at IS NULL", (now, outcome, memory_id, owner))

    def context_for(self, memory: Memory, *, block: int, window_s: float) -> list[Memory]:
        """The saves just before `memory` in its conversation, oldest first.

        In a run the window keeps its start for `block` saves in a row, so each prompt extends the last
        one and llama.cpp's cache covers the context: it starts at the save before a multiple of `block`
        and holds 1 to `block` saves (fewer at the run's start). Only the first save of each block pays
        for one earlier save again. Without a run, the conversation is the same agent's saves (also
        without a run) from the `window_s` before it, windowed the same way.
        """
        where = "team = ? AND status != ? AND created_at < ? AND id != ?"
        args: list[Any] = [memory.team, DELETED, memory.created_at, memory.id]
        if memory.run_id is not None:
            where += " AND run_id = ?"
            args.append(memory.run_id)
        else:
            where += " AND agent_id = ? AND run_id IS NULL AND created_at >= ?"
            args += [memory.agent_id, memory.created_at - window_s]
        with self.db.reading() as conn:
            before = conn.execute(f"SELECT COUNT(*) FROM memories WHERE {where}", args).fetchone()[0]
            start = max(0, before // block * block - 1)
            rows = conn.execute(
                f"SELECT * FROM memories WHERE {where} ORDER BY created_at, id LIMIT ? OFFSET ?",
                (*args, before - start, start)).fetchall()
        return [Memory.from_row(row) for row in rows]

    def next_due_in(self, now: float | None = None) -> float | None:
        """Seconds until the earliest queued job is due (0 if one is due now), None if the queue is empty."""
        now = time.time() if now is None else now
        with self.db.reading() as conn:
            row = conn.execute(
                "SELECT MIN(next_attempt_at) FROM memories WHERE status = ?", (QUEUED,)
            ).fetchone()
        return None if row[0] is None else max(0.0, row[0] - now)

    def save_progress(self, memory_id: str, progress: dict[str, Any], owner: str | None = None) -> None:
        """The chunks of a long text extracted so far: a deferral, retry or restart resumes after them."""
        held, args = self._held(owner)
        with self.db.transaction() as conn:
            conn.execute(f"UPDATE memories SET progress = ? WHERE id = ? AND status != ?{held}",
                         (_dumps(progress), memory_id, DELETED, *args))

    def defer(self, memory_id: str, *, until: float, budget_s: float, reason: str, owner: str | None = None) -> None:
        """Not now, and not an error (model down, machine slower than measured): requeue without an attempt."""
        held, args = self._held(owner)
        with self.db.transaction() as conn:
            conn.execute(
                "UPDATE memories SET status = ?, deferrals = deferrals + 1, next_attempt_at = ?, deadline_at = ?, "
                f"started_at = NULL, last_error = ?, lease_owner = NULL WHERE id = ? AND status != ?{held}",
                (QUEUED, until, until + budget_s, reason, memory_id, DELETED, *args),
            )
            self._end_attempt(conn, memory_id, owner, "deferred", time.time())

    def fail_attempt(
        self,
        memory_id: str,
        *,
        error: str,
        raw_reply: str | None,
        timings: dict[str, Any] | None,
        report: dict[str, Any] | None,
        retry_at: float | None,
        budget_s: float,
        now: float | None = None,
        owner: str | None = None,
    ) -> str:
        """Record a failed attempt; retry at `retry_at`, or mark failed when it is None. Returns the new status.

        A memory forgotten meanwhile stays forgotten: nothing is written and the status is `deleted`. So
        does a job whose lease `owner` lost (another worker took it over): the status is then `lost`.
        """
        now = time.time() if now is None else now
        status = QUEUED if retry_at is not None else FAILED
        held, args = self._held(owner)
        with self.db.transaction() as conn:
            updated = conn.execute(
                "UPDATE memories SET status = ?, attempts = attempts + 1, last_error = ?, "
                "raw_reply = COALESCE(?, raw_reply), timings = COALESCE(?, timings), report = COALESCE(?, report), "
                "next_attempt_at = ?, deadline_at = ?, started_at = NULL, finished_at = ?, lease_owner = NULL "
                f"WHERE id = ? AND status != ?{held}",
                (status, error, raw_reply, _dumps(timings), _dumps(report),
                 retry_at if retry_at is not None else now,
                 (retry_at + budget_s) if retry_at is not None else now,
                 None if retry_at is not None else now, memory_id, DELETED, *args),
            ).rowcount
            self._end_attempt(conn, memory_id, owner, "retry" if retry_at is not None else "failed", now)
            if not updated and owner is not None:
                alive = conn.execute("SELECT 1 FROM memories WHERE id = ? AND status != ?",
                                     (memory_id, DELETED)).fetchone()
                return LOST if alive else DELETED
        return status if updated else DELETED

    def retry(self, team: str, memory_id: str, *, budget_s: float, now: float | None = None) -> bool:
        """An operator's retry of a failed job: queued again, due now. False unless the team's job had failed.

        Attempts are kept (the history stays true), so a retry is one more attempt: a job that fails
        again with a retryable error goes back to failed rather than through the whole back-off again.
        """
        now = time.time() if now is None else now
        with self.db.transaction() as conn:
            return conn.execute(
                "UPDATE memories SET status = ?, next_attempt_at = ?, deadline_at = ?, started_at = NULL, "
                "finished_at = NULL WHERE id = ? AND team = ? AND status = ?",
                (QUEUED, now, now + budget_s, memory_id, team, FAILED),
            ).rowcount == 1

    def complete(
        self,
        memory: Memory,
        plan: FactPlan,
        *,
        raw_reply: str | None,
        timings: dict[str, Any] | None,
        report: dict[str, Any],
        now: float | None = None,
    ) -> bool:
        """Store the job's facts and mark it done, all in one transaction.

        False (and nothing written) when the memory was forgotten while its job ran: no fact may
        outlive the text it came from. Also False when the worker's lease was taken over meanwhile: the
        job is the new holder's now, and one result per job is stored.
        """
        now = time.time() if now is None else now
        tags = json.dumps(memory.tags)
        held, args = self._held(memory.lease_owner)
        lock = " FOR UPDATE" if self.db.dialect == "postgresql" else ""
        with self.db.transaction() as conn:
            live = conn.execute(f"SELECT 1 FROM memories WHERE id = ? AND status != ?{held}{lock}",
                                (memory.id, DELETED, *args)).fetchone()
            if live is None:
                return False
            self._end_attempt(conn, memory.id, memory.lease_owner, "done", now)
            born_old = {new_id for new_id, _ in plan.born_superseded}
            for fact in plan.new:
                # its vector is written after this commit (`indexed` says whether that happened yet)
                conn.execute(
                    "INSERT INTO facts (id, team, agent_id, memory_id, text, norm, shape, tags, created_at, indexed) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                    (fact.id, memory.team, memory.agent_id, memory.id, fact.text, fact.norm, fact.shape, tags,
                     memory.created_at, 1 if fact.id in born_old else 0),
                )
                self._add_sources(conn, fact.id, memory.id, fact.spans, now)
            for fact_id, spans in plan.merged:
                self._add_sources(conn, fact_id, memory.id, spans, now)
            for fact_id, context_id, (start, end) in plan.context_sources:
                # only while that earlier save is live: a source must never point at a forgotten text
                conn.execute(
                    "INSERT INTO fact_sources (fact_id, memory_id, span_start, span_end, added_at) "
                    "SELECT ?, id, ?, ?, ? FROM memories WHERE id = ? AND team = ? AND status != ? "
                    "ON CONFLICT DO NOTHING",
                    (fact_id, start, end, now, context_id, memory.team, DELETED))
            for old_id, new_id in plan.superseded + plan.born_superseded:
                conn.execute(
                    "UPDATE facts SET superseded_by = ?, superseded_at = ? WHERE id = ? AND team = ?",
                    (new_id, now, old_id, memory.team),
                )
            for old_id, _ in plan.superseded:  # its vector goes after the commit (the to-do list survives a crash)
                conn.execute("INSERT INTO fact_purges (team, fact_id) VALUES (?, ?) ON CONFLICT DO NOTHING",
                             (memory.team, old_id))
            conn.execute(
                "UPDATE memories SET status = ?, attempts = attempts + 1, finished_at = ?, last_error = NULL, "
                "raw_reply = ?, timings = ?, report = ?, progress = NULL, lease_owner = NULL WHERE id = ?",
                (DONE, now, raw_reply, _dumps(timings), _dumps(report), memory.id),
            )
        return True

    @staticmethod
    def _add_sources(conn: sqlite3.Connection, fact_id: str, memory_id: str,
                     spans: Iterable[tuple[int, int]], now: float) -> None:
        for start, end in spans or [(0, 0)]:
            conn.execute(
                "INSERT INTO fact_sources (fact_id, memory_id, span_start, span_end, added_at) "
                "VALUES (?,?,?,?,?) ON CONFLICT DO NOTHING",
                (fact_id, memory_id, start, end, now),
            )

    def mark_facts_indexed(self, fact_ids: list[str]) -> None:
        if fact_ids:
            with self.db.transaction() as conn:
                conn.executemany("UPDATE facts SET indexed = 1 WHERE id = ?", [(f,) for f in fact_ids])

    def unindexed_facts(self, limit: int) -> list[tuple[Fact, str | None]]:
        """Active facts whose vector was never written (a stop between commit and upsert), with their run."""
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT f.*, m.run_id AS run_id FROM facts f LEFT JOIN memories m ON m.id = f.memory_id "
                "WHERE f.indexed = 0 AND f.superseded_by IS NULL ORDER BY f.created_at LIMIT ?", (limit,)).fetchall()
        return [(_fact_from_row(r), r["run_id"]) for r in rows]

    def mark_indexed(self, memory_ids: list[str]) -> None:
        with self.db.transaction() as conn:
            conn.executemany("UPDATE memories SET indexed = 1 WHERE id = ?", [(m,) for m in memory_ids])

    # -- reads ------------------------------------------------------------------

    def get(self, team: str, memory_id: str) -> Memory | None:
        with self.db.reading() as conn:
            row = conn.execute(
                "SELECT * FROM memories WHERE id = ? AND +team = ? AND status != ?", (memory_id, team, DELETED)
            ).fetchone()
        return Memory.from_row(row) if row else None

    def get_many(self, team: str, memory_ids: list[str]) -> dict[str, Memory]:
        if not memory_ids:
            return {}
        marks = ",".join("?" * len(memory_ids))
        with self.db.reading() as conn:
            rows = conn.execute(
                f"SELECT * FROM memories WHERE id IN ({marks}) AND +team = ? AND status != ?",
                (*memory_ids, team, DELETED)
            ).fetchall()
        return {row["id"]: Memory.from_row(row) for row in rows}

    def recall_rows(self, team: str, memory_ids: list[str]) -> dict[str, tuple[str, float, list[str], str]]:
        """(agent_id, created_at, tags, text) of the team's live memories among these ids: what recall shows."""
        if not memory_ids:
            return {}
        marks = ",".join("?" * len(memory_ids))
        with self.db.reading() as conn:
            rows = conn.execute(
                f"SELECT id, agent_id, created_at, tags, text FROM memories WHERE id IN ({marks}) AND +team = ? "
                "AND status != ?", (*memory_ids, team, DELETED)
            ).fetchall()
        return {r[0]: (r[1], float(r[2]), json.loads(r[3]), r[4]) for r in rows}

    def live(self, memory_ids: list[str]) -> set[str]:
        """Which of these ids still exist and are not forgotten (any team: for workers, never for routes)."""
        if not memory_ids:
            return set()
        marks = ",".join("?" * len(memory_ids))
        with self.db.reading() as conn:
            rows = conn.execute(
                f"SELECT id FROM memories WHERE id IN ({marks}) AND status != ?", (*memory_ids, DELETED)
            ).fetchall()
        return {row[0] for row in rows}

    def existing_facts(self, fact_ids: list[str]) -> set[str]:
        if not fact_ids:
            return set()
        marks = ",".join("?" * len(fact_ids))
        with self.db.reading() as conn:
            rows = conn.execute(f"SELECT id FROM facts WHERE id IN ({marks})", fact_ids).fetchall()
        return {row[0] for row in rows}

    def unindexed(self, limit: int) -> list[Memory]:
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT * FROM memories WHERE indexed = 0 AND status != ? ORDER BY created_at LIMIT ?", (DELETED, limit)
            ).fetchall()
        return [Memory.from_row(r) for r in rows]

    def facts_of_memory(self, team: str, memory_id: str) -> list[Fact]:
        """Facts this memory produced or confirmed, superseded ones included (its history)."""
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT f.*, s.span_start, s.span_end FROM fact_sources s JOIN facts f ON f.id = s.fact_id "
                "WHERE s.memory_id = ? AND f.team = ? ORDER BY f.created_at, s.span_start",
                (memory_id, team),
            ).fetchall()
        facts: dict[str, Fact] = {}
        for row in rows:
            fact = facts.get(row["id"]) or facts.setdefault(row["id"], _fact_from_row(row))
            fact.sources.append({"memory_id": memory_id, "span": [row["span_start"], row["span_end"]]})
        return list(facts.values())

    def fact_sources(self, fact_ids: list[str]) -> dict[str, list[tuple[str, int, int]]]:
        if not fact_ids:
            return {}
        marks = ",".join("?" * len(fact_ids))
        with self.db.reading() as conn:
            rows = conn.execute(
                f"SELECT fact_id, memory_id, span_start, span_end FROM fact_sources WHERE fact_id IN ({marks}) "
                "ORDER BY added_at",
                fact_ids,
            ).fetchall()
        out: dict[str, list[tuple[str, int, int]]] = {}
        for row in rows:
            out.setdefault(row[0], []).append((row[1], row[2], row[3]))
        return out

    def active_facts_by_norm(self, team: str, norm: str) -> list[Fact]:
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT * FROM facts WHERE team = ? AND norm = ? AND superseded_by IS NULL", (team, norm)
            ).fetchall()
        return [_fact_from_row(r) for r in rows]

    def active_facts_by_shape(self, team: str, shape: str) -> list[Fact]:
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT * FROM facts WHERE team = ? AND shape = ? AND superseded_by IS NULL", (team, shape)
            ).fetchall()
        return [_fact_from_row(r) for r in rows]

    def facts_by_ids(self, team: str, fact_ids: list[str]) -> dict[str, Fact]:
        if not fact_ids:
            return {}
        marks = ",".join("?" * len(fact_ids))
        with self.db.reading() as conn:
            rows = conn.execute(
                f"SELECT * FROM facts WHERE id IN ({marks}) AND +team = ?", (*fact_ids, team)
            ).fetchall()
        return {r["id"]: _fact_from_row(r) for r in rows}

    def keyword_search(self, team: str, query: str, *, kinds: set[str], limit: int, agent_id: str | None = None,
                       tags: tuple[str, ...] = (), since: float | None = None,
                       until: float | None = None) -> list[KeywordHit]:
        """BM25 over passages and active facts of one team, filters applied before the limit.

        Bounded: only rows holding one of the rarest query words, or every query word, are candidates
        (see `_bounded_match`); of those the newest `KEYWORD_MAX_RANKED` that pass the filters are ranked,
        looking at no more than the newest `KEYWORD_MAX_SCANNED`. Ranking every row that shares one common
        word with the query was the slowest part of recall at 100k facts.
        """
        words = fts_words(query)
        if not words:
            return []
        with self.db.reading() as conn:
            if self.db.dialect == "postgresql":
                return self._keyword_postgres(conn, team, words, kinds, limit, agent_id, tags, since, until)
            return self._keyword_sqlite(conn, team, words, kinds, limit, agent_id, tags, since, until)

    def _keyword_sqlite(self, conn: Any, team: str, words: list[str], kinds: set[str], limit: int,
                        agent_id: str | None, tags: tuple[str, ...], since: float | None,
                        until: float | None) -> list[KeywordHit]:
        filtered = agent_id is not None or bool(tags) or since is not None or until is not None
        hits: list[KeywordHit] = []
        for kind, fts, table, cols in (("passage", "memories_fts", "memories", "t.id, t.id, t.text"),
                                       ("fact", "facts_fts", "facts", "t.id, t.memory_id, t.text")):
            if kind not in kinds:
                continue
            match = self._bounded_match(conn, fts, words)
            where, args = _item_filter(kind, agent_id, tags, since, until)
            # CROSS JOIN keeps the FTS match as the outer loop: the planner may otherwise scan the
            # team's rows and probe the index per row (seconds); newest rows first when capped
            if agent_id is not None and self._agent_rows(conn, table, team, agent_id) <= KEYWORD_AGENT_SET_ROWS:
                # a minority agent's rows as a set, probed per match before any join: a set look-up per
                # match instead of a row read (a large agent's set would cost more to build than it saves)
                where += f" AND +{fts}.rowid IN (SELECT rowid FROM {table} WHERE team = ? AND agent_id = ?)"
                args += [team, agent_id]
            floor = self._scan_floor(conn, fts, match) if filtered else None
            if floor is not None:
                where += f" AND {fts}.rowid >= ?"
                args.append(floor)
            sql = (f"SELECT * FROM (SELECT {cols}, bm25({fts}) AS r FROM {fts} CROSS JOIN {table} t "
                   f"ON t.rowid = {fts}.rowid WHERE {fts} MATCH ? AND t.team = ? {where} "
                   f"ORDER BY {fts}.rowid DESC LIMIT ?) ORDER BY r LIMIT ?")
            for row in conn.execute(sql, (match, team, *args, KEYWORD_MAX_RANKED, limit)):
                hits.append(KeywordHit(kind, row[0], row[1], row[2], row[3]))
        return hits

    def _keyword_postgres(self, conn: Any, team: str, words: list[str], kinds: set[str], limit: int,
                          agent_id: str | None, tags: tuple[str, ...], since: float | None,
                          until: float | None) -> list[KeywordHit]:
        """The same contract on PostgreSQL: a `tsvector` column (English stemming) with a GIN index.

        Any query word matches; of the matching rows that pass the filters, the newest
        `KEYWORD_MAX_SCANNED` are ranked (`ts_rank_cd`), which bounds the work for common words.
        """
        query = " || ".join(["plainto_tsquery('english', ?)"] * len(words))
        hits: list[KeywordHit] = []
        for kind, table, cols in (("passage", "memories", "t.id, t.id, t.text"),
                                  ("fact", "facts", "t.id, t.memory_id, t.text")):
            if kind not in kinds:
                continue
            where, args = _item_filter(kind, agent_id, tags, since, until, "postgresql")
            sql = (f"SELECT * FROM (SELECT {cols}, ts_rank_cd(t.tsv, q.q) AS r FROM {table} t, "
                   f"(SELECT {query} AS q) q WHERE t.tsv @@ q.q AND t.team = ? {where} "
                   f"ORDER BY t.rowid DESC LIMIT ?) AS c ORDER BY r DESC LIMIT ?")
            for row in conn.execute(sql, (*words, team, *args, KEYWORD_MAX_SCANNED, limit)):
                hits.append(KeywordHit(kind, row[0], row[1], row[2], -float(row[3])))
        return hits

    def _bounded_match(self, conn: Any, fts: str, words: list[str]) -> str:
        """The FTS5 expression that bounds how many rows get ranked.

        Words are taken rarest first (document frequencies from `fts5vocab`) while together they match at
        most `KEYWORD_RARE_ROWS` rows; if that is every word, the plain OR of all words. Otherwise rows with
        one of those rare words OR with all the words: an id, a number or a name (rare) is never dropped,
        the common words still count in BM25 (they are phrases of the expression), and a query of common
        words ranks the rows that hold them all.
        """
        df = {w: self._doc_freq(conn, fts, w) for w in words}
        ordered = sorted(words, key=lambda w: df[w])
        rare: list[str] = []
        total = 0
        for word in ordered:
            if total + df[word] > KEYWORD_RARE_ROWS:
                break
            rare.append(word)
            total += df[word]
        quoted = [f'"{w}"' for w in words]
        if len(rare) == len(words):
            return " OR ".join(quoted)
        parts = [" OR ".join(f'"{w}"' for w in rare)] if rare else []
        if len(words) > 1:
            parts.append("(" + " AND ".join(quoted) + ")")
        return " OR ".join(parts) if parts else quoted[0]

    def _scan_floor(self, conn: Any, fts: str, match: str) -> int | None:
        """The rowid of the `KEYWORD_MAX_SCANNED`-th newest match (None if fewer): a filter that keeps few
        rows must not make the search walk every match. Walking the index alone is cheap."""
        row = conn.execute(f"SELECT rowid FROM {fts} WHERE {fts} MATCH ? ORDER BY rowid DESC "
                                   "LIMIT 1 OFFSET ?", (match, KEYWORD_MAX_SCANNED - 1)).fetchone()
        return None if row is None else int(row[0])

    def _agent_rows(self, conn: Any, table: str, team: str, agent_id: str) -> int:
        """How many rows of `table` the agent has (cached like document frequencies: it only picks a plan)."""
        now = time.monotonic()
        cached = self._df_cache.get((table, f"{team}\x00{agent_id}"))
        if cached is not None and now - cached[1] < DOC_FREQ_TTL_S:
            return cached[0]
        count = int(conn.execute(f"SELECT COUNT(*) FROM {table} WHERE team = ? AND agent_id = ?",
                                         (team, agent_id)).fetchone()[0])
        self._df_cache[(table, f"{team}\x00{agent_id}")] = (count, now)
        return count

    def _doc_freq(self, conn: Any, fts: str, word: str) -> int:
        """Rows of `fts` (all teams) holding `word`: a bound for one team. A phrase counts its rarest token.

        Cached for `DOC_FREQ_TTL_S`: a look-up walks every index segment (~0.5 ms at 100k rows)."""
        now = time.monotonic()
        cached = self._df_cache.get((fts, word))
        if cached is not None and now - cached[1] < DOC_FREQ_TTL_S:
            return cached[0]
        counts = [conn.execute(f"SELECT doc FROM temp.{fts}_vocab WHERE term = ?", (term,)).fetchone()
                  for term in _stems(word)]
        df = min((int(c[0]) if c else 0 for c in counts), default=0)
        if len(self._df_cache) > 20_000:
            self._df_cache.clear()
        self._df_cache[(fts, word)] = (df, now)
        return df

    def backlog(self, created_at: float | None = None) -> tuple[int, int]:
        """(jobs, characters) waiting or running, optionally only those saved by `created_at`: the work ahead."""
        sql = "SELECT COUNT(*), COALESCE(SUM(LENGTH(text)), 0) FROM memories WHERE status IN (?, ?)"
        args: tuple[Any, ...] = (QUEUED, EXTRACTING)
        if created_at is not None:
            sql += " AND created_at <= ?"
            args += (created_at,)
        with self.db.reading() as conn:
            jobs, chars = conn.execute(sql, args).fetchone()
        return int(jobs), int(chars)

    def counts(self) -> dict[str, int]:
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT status, COUNT(*) FROM memories WHERE status != ? GROUP BY status", (DELETED,)
            ).fetchall()
            facts = conn.execute("SELECT COUNT(*) FROM facts WHERE superseded_by IS NULL").fetchone()[0]
        out = {status: 0 for status in (QUEUED, EXTRACTING, DONE, FAILED)}
        out.update({row[0]: row[1] for row in rows})
        out["facts"] = facts
        return out


def _fact_from_row(row: sqlite3.Row) -> Fact:
    return Fact(
        id=row["id"], team=row["team"], agent_id=row["agent_id"], memory_id=row["memory_id"], text=row["text"],
        norm=row["norm"], shape=row["shape"], tags=json.loads(row["tags"]), created_at=row["created_at"],
        superseded_by=row["superseded_by"], superseded_at=row["superseded_at"],
    )


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value)
