"""`memory-service migrate --to postgresql://…`: move an embedded data dir's SQLite stores into PostgreSQL.

Every row is copied as it is (ids, timestamps, statuses, facts with their supersession links and sources,
limit counters and idempotency records, handled keys, the gate's reservations, API key hashes), oldest first,
so listing and keyword search order stay the same. Re-running is safe: rows already there are skipped. Jobs that were
mid-extraction go back to the queue. Then the vectors are rebuilt from the copied journal into the store
the settings name (MEMORY_CHROMA_URL, or the data dir's `chroma/`): Chroma is derived state.

The service must be stopped: the command takes the data dir's exclusive lock.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from ..config import Settings
from ..storage.database import PostgresDatabase, PostgresDriverMissing, describe, is_postgres_url
from ..storage.datadir import JOURNAL_FILE, KEYS_FILE, LIMITS_FILE, DataDir, DataDirBusy

# (SQLite file, tables in copy order); each table is copied in its rowid order
SOURCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (JOURNAL_FILE, ("memories", "facts", "fact_sources", "fact_purges", "job_attempts", "memory_versions")),
    (LIMITS_FILE, ("limit_defs", "limit_usage", "limit_idempotency", "handled", "gate_reservations")),
    (KEYS_FILE, ("api_keys",)),
)
BATCH = 500


class MigrateError(RuntimeError):
    """A migration that cannot go ahead; the message says why and what to do."""


def run_migrate(settings: Settings, url: str, *, reindex_vectors: bool = True) -> dict[str, Any]:
    if not is_postgres_url(url):
        raise MigrateError(f"--to {describe(url)!r}: give a postgresql://user@host:port/database URL")
    data = DataDir(settings.data_dir.absolute())
    if not data.has_journal():
        raise MigrateError(
            f"no {JOURNAL_FILE} in {data.path}: is it a memory-service data dir? (--data-dir, env MEMORY_DATA_DIR)"
        )
    try:
        lock = data.lock(exclusive=True)
    except DataDirBusy:
        raise MigrateError(f"a memory-service is running on {data.path}: stop it, then migrate") from None
    try:
        try:
            database = PostgresDatabase(url)
        except PostgresDriverMissing as exc:
            raise MigrateError(f"--to {exc}") from None
        except Exception as exc:
            raise MigrateError(
                f"PostgreSQL at {describe(url)} is unreachable or refused the connection: {exc}"
            ) from None
        try:
            copied = copy_stores(data.path, database)
        finally:
            database.close()
    finally:
        lock.release()
    summary: dict[str, Any] = {"to": describe(url), "copied": copied}
    if reindex_vectors:
        from .reindex import run_reindex

        summary["reindex"] = run_reindex(settings.with_overrides(database_url=url))
    return summary


def copy_stores(data_dir: Path, database: PostgresDatabase) -> dict[str, int]:
    """Copy every table the data dir has into `database` (schema created first); rows newly copied per table."""
    data = DataDir(data_dir)
    # the stores create their PostgreSQL schema; none of them owns (or closes) the shared database
    data.open_journal(database), data.open_limits(database), data.open_keys(database)
    copied: dict[str, int] = {}
    for filename, tables in SOURCES:
        path = data_dir / filename
        if not path.is_file():
            continue
        source = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            present = {r[0] for r in source.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            for table in tables:
                if table in present:
                    copied[table] = _copy_table(source, database, table)
        finally:
            source.close()
    with database.transaction() as conn:  # whoever had these is gone: they start again
        conn.execute(
            "UPDATE memories SET status = 'queued', started_at = NULL, lease_owner = NULL, "
            "lease_until = NULL WHERE status = 'extracting'"
        )
        conn.execute("UPDATE job_attempts SET ended_at = started_at, outcome = 'migrated' WHERE ended_at IS NULL")
    return copied


def _copy_table(source: sqlite3.Connection, database: PostgresDatabase, table: str) -> int:
    with database.reading() as conn:
        target = {
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ? AND is_generated = 'NEVER' "
                "AND column_name != 'rowid'",
                (table,),
            )
        }
    columns = [r[1] for r in source.execute(f"PRAGMA table_info({table})") if r[1] in target]
    names = ", ".join(columns)
    insert = f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(columns))}) ON CONFLICT DO NOTHING"
    order = "rowid" if table not in ("limit_defs", "limit_usage") else "1"  # WITHOUT ROWID tables
    copied = 0
    cursor = source.execute(f"SELECT {names} FROM {table} ORDER BY {order}")
    while rows := cursor.fetchmany(BATCH):
        with database.transaction() as conn:
            for row in rows:
                copied += conn.execute(insert, row).rowcount
    return copied
