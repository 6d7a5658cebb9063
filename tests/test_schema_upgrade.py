"""An old journal opens and is upgraded in numbered steps, keeping its rows; a new one starts at the latest version."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from memory_service.storage.database import Database, PostgresDatabase
from memory_service.storage.journal import Journal
from memory_service.storage.schema import POSTGRES_SCHEMA
from memory_service.storage.schema_upgrades import LATEST, STEPS, read_version

# The journal as written before the versioned upgrades (version 1): no chunk progress, no dates, no leases, and
# facts without their `indexed` flag. The keyword index and its triggers were there already.
OLD_SQLITE_JOURNAL = """
CREATE TABLE memories (
    id TEXT PRIMARY KEY, team TEXT NOT NULL, agent_id TEXT NOT NULL, run_id TEXT, text TEXT NOT NULL,
    tags TEXT NOT NULL DEFAULT '[]', metadata TEXT NOT NULL DEFAULT '{}', idempotency_key TEXT,
    created_at REAL NOT NULL, status TEXT NOT NULL DEFAULT 'queued', attempts INTEGER NOT NULL DEFAULT 0,
    deferrals INTEGER NOT NULL DEFAULT 0, next_attempt_at REAL NOT NULL, deadline_at REAL NOT NULL,
    started_at REAL, finished_at REAL, last_error TEXT, raw_reply TEXT, timings TEXT, report TEXT,
    indexed INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE facts (
    id TEXT PRIMARY KEY, team TEXT NOT NULL, agent_id TEXT NOT NULL, memory_id TEXT NOT NULL, text TEXT NOT NULL,
    norm TEXT NOT NULL, shape TEXT NOT NULL, tags TEXT NOT NULL DEFAULT '[]', created_at REAL NOT NULL,
    superseded_by TEXT, superseded_at REAL
);
CREATE TABLE fact_sources (
    fact_id TEXT NOT NULL, memory_id TEXT NOT NULL, span_start INTEGER NOT NULL, span_end INTEGER NOT NULL,
    added_at REAL NOT NULL, PRIMARY KEY (fact_id, memory_id, span_start)
);
CREATE VIRTUAL TABLE memories_fts USING fts5(text, content='memories', content_rowid='rowid', tokenize='porter unicode61');
CREATE TRIGGER memories_ai AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts(rowid, text) VALUES (new.rowid, new.text);
END;
CREATE VIRTUAL TABLE facts_fts USING fts5(text, content='facts', content_rowid='rowid', tokenize='porter unicode61');
CREATE TRIGGER facts_ai AFTER INSERT ON facts BEGIN
    INSERT INTO facts_fts(rowid, text) VALUES (new.rowid, new.text);
END;
"""
MEMORY = (
    "INSERT INTO memories (id, team, agent_id, text, created_at, next_attempt_at, deadline_at) "
    "VALUES ('mem_old', 'team-a', 'agent-1', 'The staging backups run nightly.', 1.0, 1.0, 601.0)"
)
FACT = (
    "INSERT INTO facts (id, team, agent_id, memory_id, text, norm, shape, created_at) "
    "VALUES ('f:old', 'team-a', 'agent-1', 'mem_old', 'Staging backups run nightly.', 'n', 's', 2.0)"
)
UPGRADED_COLUMNS = {(table, column) for step in STEPS for table, column, _ in step.columns}


def _upgrade_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "journal schema upgraded" in r.getMessage()]


def _columns(journal: Journal) -> set[tuple[str, str]]:
    with journal.reading() as conn:
        if journal.dialect == "sqlite":
            return {(t, row[1]) for t in ("memories", "facts") for row in conn.execute(f"PRAGMA table_info({t})")}
        rows = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_name IN ('memories', 'facts')"
        ).fetchall()
        return {(r[0], r[1]) for r in rows}


def _version(journal: Journal) -> int:
    with journal.reading() as conn:
        return read_version(conn, journal.dialect)


def test_an_old_sqlite_journal_is_upgraded_step_by_step_and_keeps_its_rows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "journal.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(OLD_SQLITE_JOURNAL)
    conn.execute(MEMORY)
    conn.execute(FACT)
    conn.commit()
    conn.close()

    with caplog.at_level(logging.INFO, logger="memory_service"):
        journal = Journal(path)
    try:
        assert _upgrade_logs(caplog) == [f"journal schema upgraded to version {s.version}: {s.what}" for s in STEPS]
        assert _version(journal) == LATEST
        assert UPGRADED_COLUMNS <= _columns(journal)
        memory = journal.get("team-a", "mem_old")
        assert memory is not None and memory.text == "The staging backups run nightly."
        assert journal.counts()["facts"] == 1
        with journal.reading() as conn:
            assert conn.execute("SELECT indexed FROM facts WHERE id = 'f:old'").fetchone()[0] == 1
            indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {"memories_leases", "facts_unindexed"} <= indexes
        claimed = journal.claim_next("worker-1", now=10.0)  # the lease columns are in use at once
        assert claimed is not None and claimed.id == "mem_old"
    finally:
        journal.close()

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="memory_service"):
        Journal(path).close()
    assert _upgrade_logs(caplog) == []  # each step runs once


def test_a_journal_with_some_later_columns_is_upgraded_too(tmp_path: Path) -> None:
    """A release that added columns on the fly left no version: the steps add only what is missing."""
    path = tmp_path / "journal.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(OLD_SQLITE_JOURNAL)
    conn.execute("ALTER TABLE memories ADD COLUMN progress TEXT")
    conn.execute("ALTER TABLE memories ADD COLUMN occurred_at REAL")
    conn.execute(MEMORY)
    conn.commit()
    conn.close()
    journal = Journal(path)
    try:
        assert _version(journal) == LATEST
        assert UPGRADED_COLUMNS <= _columns(journal)
        assert journal.get("team-a", "mem_old") is not None
    finally:
        journal.close()


def test_a_new_journal_starts_at_the_latest_version_without_upgrading(
    database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="memory_service"):
        journal = Journal(database)
    assert _upgrade_logs(caplog) == []
    assert _version(journal) == LATEST
    assert UPGRADED_COLUMNS <= _columns(journal)


def test_an_old_postgres_journal_gets_the_facts_indexed_flag(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A PostgreSQL journal from before fact vectors were written after the commit had no `facts.indexed`."""
    old = POSTGRES_SCHEMA.replace("    indexed INTEGER NOT NULL DEFAULT 1,\n", "").replace(
        "CREATE INDEX IF NOT EXISTS facts_unindexed ON facts(indexed) WHERE indexed = 0;\n", ""
    )
    assert old.count("indexed INTEGER") == 1  # only the memories' flag is left
    database = PostgresDatabase(postgres_url)
    try:
        with database.transaction() as conn:
            for statement in filter(str.strip, old.split(";")):
                conn.execute(statement)
            conn.execute(MEMORY)
            conn.execute(FACT)
        with caplog.at_level(logging.INFO, logger="memory_service"):
            journal = Journal(database)
        assert f"journal schema upgraded to version {LATEST}: {STEPS[-1].what}" in _upgrade_logs(caplog)
        assert _version(journal) == LATEST
        assert ("facts", "indexed") in _columns(journal)
        assert journal.get("team-a", "mem_old") is not None
        assert journal.counts()["facts"] == 1
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="memory_service"):
            Journal(database)
        assert _upgrade_logs(caplog) == []
    finally:
        database.close()
