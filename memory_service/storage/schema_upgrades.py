"""Versioned upgrades of the journal's tables: an older data dir (or PostgreSQL database) opens and is upgraded.

The version is recorded in the database itself: SQLite's `PRAGMA user_version` (in the file's header, so the
file keeps its tables), PostgreSQL's one row per store in `schema_version`. Each numbered step runs once, in
order, in its own transaction with the new version, and is logged. A new database gets the current tables
and the current version at once, with no steps.

Version 1 is the journal before these steps: its tables as `schema.py` has them, without the columns below.
A step only adds what is missing, so a journal that already has some of its columns (written by a release
that added them on the fly) is upgraded too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .database import Database
from .schema import POSTGRES_SCHEMA, SCHEMA, version_tables, webhook_tables

log = logging.getLogger("memory_service")

STORE = "journal"
SCHEMA_LOCK = 7263545  # the advisory lock PostgreSQL's schema creation takes: one process at a time
VERSION_TABLE = "CREATE TABLE IF NOT EXISTS schema_version (store TEXT PRIMARY KEY, version INTEGER NOT NULL)"


@dataclass(frozen=True)
class Step:
    version: int
    what: str
    columns: tuple[tuple[str, str, str], ...]  # (table, column, SQLite type and default)
    indexes: tuple[str, ...] = ()
    tables: bool = False  # the step adds the webhook tables (schema.WEBHOOK_TABLES)
    script: Callable[[str], str] | None = None  # the step's new tables, in a dialect's words

    def apply(self, conn: Any, dialect: str) -> None:
        scripts = ([webhook_tables(dialect)] if self.tables else []) + ([self.script(dialect)] if self.script else [])
        for script in scripts:
            for statement in filter(str.strip, script.split(";")):
                conn.execute(statement)
        for table, column, kind in self.columns:
            if dialect == "postgresql":
                kind = kind.replace("REAL", "DOUBLE PRECISION")
                conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {kind}")
            elif column not in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        for index in self.indexes:
            conn.execute(index)


STEPS = (
    Step(2, "chunk progress of long texts", (("memories", "progress", "TEXT"),)),
    Step(3, "when a text happened", (("memories", "occurred_at", "REAL"), ("memories", "occurred_day", "TEXT"))),
    Step(
        4,
        "job leases",
        (("memories", "lease_owner", "TEXT"), ("memories", "lease_until", "REAL")),
        ("CREATE INDEX IF NOT EXISTS memories_leases ON memories(status, lease_until)",),
    ),
    Step(
        5,
        "fact vectors written after the commit",
        (("facts", "indexed", "INTEGER NOT NULL DEFAULT 1"),),
        ("CREATE INDEX IF NOT EXISTS facts_unindexed ON facts(indexed) WHERE indexed = 0",),
    ),
    # a job queued before this step is taken as unpinned: the key that saved it was not recorded then
    Step(
        6,
        "pinned saves: a write touches only its writer's share",
        (("memories", "pinned", "INTEGER NOT NULL DEFAULT 0"), ("facts", "pinned", "INTEGER NOT NULL DEFAULT 0")),
    ),
    Step(7, "webhook subscriptions and their outbox", (), tables=True),
    Step(8, "mem0 updates' earlier versions, out of metadata", (), script=version_tables),
)
LATEST = STEPS[-1].version


def open_journal_schema(db: Database) -> None:
    """Bring the journal's tables to `LATEST`: upgrade an existing journal step by step, or create a new one."""
    with db.transaction() as conn:
        existed = _prepare(conn, db.dialect)
    if existed:
        for step in STEPS:
            with db.transaction() as conn:
                _prepare(conn, db.dialect)
                if read_version(conn, db.dialect) < step.version:  # re-read: another process may have done it
                    step.apply(conn, db.dialect)
                    _write_version(conn, db.dialect, step.version)
                    log.info("journal schema upgraded to version %d: %s", step.version, step.what)
    db.create_schema(SCHEMA, POSTGRES_SCHEMA)
    if not existed:
        with db.transaction() as conn:
            _prepare(conn, db.dialect)
            if read_version(conn, db.dialect) < LATEST:
                _write_version(conn, db.dialect, LATEST)


def read_version(conn: Any, dialect: str) -> int:
    """The journal's schema version (0: never recorded, a journal from before versioning or a new one)."""
    if dialect == "sqlite":
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    row = conn.execute("SELECT version FROM schema_version WHERE store = ?", (STORE,)).fetchone()
    return 0 if row is None else int(row[0])


def _prepare(conn: Any, dialect: str) -> bool:
    """Serialise schema work between processes and make the version readable; True if the journal existed."""
    if dialect == "sqlite":  # BEGIN IMMEDIATE already holds the file's write lock
        return (
            conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'memories'").fetchone()
            is not None
        )
    conn.execute(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK})")
    conn.execute(VERSION_TABLE)
    return (
        conn.execute(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = 'memories'"
        ).fetchone()
        is not None
    )


def _write_version(conn: Any, dialect: str, version: int) -> None:
    if dialect == "sqlite":
        conn.execute(f"PRAGMA user_version = {int(version)}")  # a pragma takes no parameters
    else:
        conn.execute(
            "INSERT INTO schema_version (store, version) VALUES (?, ?) "
            "ON CONFLICT (store) DO UPDATE SET version = excluded.version",
            (STORE, version),
        )
