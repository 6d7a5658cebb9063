"""API keys with roles, stored as hashes in `keys.sqlite3`, so keys can be created and revoked while the
service runs (no restart) and a stolen database holds no usable key.

A key is `msk_<id>_<secret>`: the id names it in listings and revocations; the 32-byte random secret is
what proves it. Only sha256 of the whole key is stored. A fast hash is enough because the secret has 256
bits of entropy: there is nothing to brute-force, unlike a password.

Every check reads the key's own row by its hash (a unique-index lookup: about 10 µs a request on SQLite,
3 µs more than the in-memory check it replaced; one round trip on PostgreSQL): a key revoked by any
connection or process (the CLI, an admin route, another API worker) is refused at the very next request.
A cache keyed on `PRAGMA data_version` cannot do that: the value is per connection, and the reads come
from a pool of connections. Only "is there any key at all" (keyless mode) is cached on PostgreSQL, for a
second.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contract.roles import ROLES, Role
from .database import Database, SqliteDatabase

PREFIX = "msk_"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    team TEXT NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('read', 'write', 'admin')),
    agent_id TEXT,
    label TEXT,
    created_at REAL NOT NULL,
    revoked_at REAL
);
CREATE INDEX IF NOT EXISTS api_keys_team ON api_keys(team);
CREATE TABLE IF NOT EXISTS console_sessions (
    hash TEXT PRIMARY KEY,
    key_hash TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
"""
_POSTGRES_SCHEMA = _SCHEMA.replace("REAL", "DOUBLE PRECISION").rstrip().rstrip(";")
POSTGRES_RELOAD_S = 1.0
SESSION_PREFIX = "mss_"
SESSION_TTL_S = 12 * 3600.0  # a console login lasts this long at most, then the key is asked for again


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class KeyInfo:
    """A key as listed: never its secret."""

    id: str
    team: str
    role: Role
    agent_id: str | None
    label: str | None
    created_at: float
    revoked_at: float | None


@dataclass(frozen=True)
class NewKey:
    info: KeyInfo
    key: str  # shown once, at creation


class KeyNotFound(LookupError):
    pass


class LastKey(RuntimeError):
    """Revoking the last active key would turn authentication off (keyless mode): only on an explicit choice."""


class KeyStore:
    """The keys database. Thread-safe (the database's connections; a lock around the PostgreSQL copy)."""

    def __init__(self, store: Path | Database) -> None:
        self._owns = not isinstance(store, Database)
        self.db: Database = store if isinstance(store, Database) else SqliteDatabase(store, synchronous="FULL")
        self.db.create_schema(_SCHEMA, _POSTGRES_SCHEMA)
        self._lock = threading.Lock()
        self._version: object = None
        self._active: dict[str, KeyInfo] = {}

    # -- managing ------------------------------------------------------------------

    def create(self, team: str, role: Role, *, agent_id: str | None = None, label: str | None = None) -> NewKey:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}")
        key_id = secrets.token_hex(4)
        key = f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
        info = KeyInfo(key_id, team, role, agent_id, label, time.time(), None)
        with self.db.transaction() as conn:
            conn.execute(
                "INSERT INTO api_keys (id, hash, team, role, agent_id, label, created_at) VALUES (?,?,?,?,?,?,?)",
                (key_id, key_hash(key), team, role, agent_id, label, info.created_at),
            )
        self._version = None
        return NewKey(info, key)

    def list(self, team: str | None = None, *, include_revoked: bool = False) -> list[KeyInfo]:
        sql, args = "SELECT * FROM api_keys WHERE 1=1", []
        if team is not None:
            sql += " AND team = ?"
            args.append(team)
        if not include_revoked:
            sql += " AND revoked_at IS NULL"
        with self.db.reading() as conn:
            rows = conn.execute(sql + " ORDER BY created_at", args).fetchall()
        return [_info(row) for row in rows]

    def revoke(self, key_id: str, *, team: str | None = None, keyless: bool = False) -> KeyInfo:
        """Revoke a key by id (within `team` when given: an admin key reaches only its own team).

        The last active key is revoked only with `keyless`: with no key left (and no MEMORY_API_KEYS) a
        loopback service answers everyone as admin of team `local`, so that switch is never a side effect
        (`LastKey` otherwise). The other active keys are read in the same transaction (BEGIN IMMEDIATE on
        SQLite, row locks on PostgreSQL), so two revocations at once cannot both pass as "not the last".
        """
        lock = " FOR UPDATE" if self.db.dialect == "postgresql" else ""
        with self.db.transaction() as conn:
            row = conn.execute("SELECT * FROM api_keys WHERE id = ?", (key_id,)).fetchone()
            if row is None or (team is not None and row["team"] != team):
                raise KeyNotFound(f"no key with id {key_id!r}" + (" in this team" if team else ""))
            if row["revoked_at"] is None and not keyless:
                others = conn.execute(
                    "SELECT id FROM api_keys WHERE revoked_at IS NULL AND id != ?" + lock, (key_id,)
                ).fetchall()
                if not others:
                    raise LastKey(
                        f"key {key_id} is the last active key: revoking it turns authentication off (keyless "
                        "mode: on a loopback address everyone is admin of team 'local'; elsewhere every request "
                        f"is refused). Create another key first, or run `memory-service keys revoke {key_id} --keyless` "
                        "to choose keyless mode"
                    )
            if row["revoked_at"] is None:
                conn.execute("UPDATE api_keys SET revoked_at = ? WHERE id = ?", (time.time(), key_id))
            row = conn.execute("SELECT * FROM api_keys WHERE id = ?", (key_id,)).fetchone()
        self._version = None
        return _info(row)

    # -- checking --------------------------------------------------------------------

    def lookup(self, presented: str) -> KeyInfo | None:
        """The active key matching `presented`, read from its row at every request (one primary-key lookup),
        so a revocation by any process or connection is refused at the next request, on either database."""
        with self.db.reading() as conn:
            row = conn.execute(
                "SELECT * FROM api_keys WHERE hash = ? AND revoked_at IS NULL", (key_hash(presented),)
            ).fetchone()
        return None if row is None else _info(row)

    # -- console sessions ------------------------------------------------------------
    # The web console's cookie holds a session id, not the key: a fresh random id at each login, of which only
    # sha256 is stored beside the key's hash, ended server-side at logout, at the key's revocation (its hash no
    # longer resolves) and after SESSION_TTL_S. Kept here so every API process sees the same sessions.

    def open_session(self, key: str, now: float | None = None) -> str:
        """A new session id for a verified `key` (expired sessions are swept on the way)."""
        now = time.time() if now is None else now
        session = f"{SESSION_PREFIX}{secrets.token_urlsafe(32)}"
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM console_sessions WHERE expires_at < ?", (now,))
            conn.execute(
                "INSERT INTO console_sessions (hash, key_hash, created_at, expires_at) VALUES (?, ?, ?, ?)",
                (key_hash(session), key_hash(key), now, now + SESSION_TTL_S),
            )
        return session

    def session_key_hash(self, session: str, now: float | None = None) -> str | None:
        """The hash of the key a live session was opened with, or None (unknown, ended or expired)."""
        now = time.time() if now is None else now
        if not session.startswith(SESSION_PREFIX):
            return None
        with self.db.reading() as conn:
            row = conn.execute(
                "SELECT key_hash FROM console_sessions WHERE hash = ? AND expires_at >= ?", (key_hash(session), now)
            ).fetchone()
        return None if row is None else str(row[0])

    def end_session(self, session: str) -> None:
        with self.db.transaction() as conn:
            conn.execute("DELETE FROM console_sessions WHERE hash = ?", (key_hash(session),))

    def lookup_hash(self, digest: str) -> KeyInfo | None:
        """The active key whose sha256 is `digest`, or None (as `lookup`, for a console session)."""
        with self.db.reading() as conn:
            row = conn.execute("SELECT * FROM api_keys WHERE hash = ? AND revoked_at IS NULL", (digest,)).fetchone()
        return None if row is None else _info(row)

    def has_keys(self) -> bool:
        if self.db.dialect == "sqlite":
            with self.db.reading() as conn:
                return conn.execute("SELECT 1 FROM api_keys WHERE revoked_at IS NULL LIMIT 1").fetchone() is not None
        self._refresh()
        return bool(self._active)

    def _refresh(self) -> None:
        """PostgreSQL only: reload the active keys once a second (a change made here resets `_version`)."""
        with self._lock, self.db.reading() as conn:
            version = int(time.monotonic() / POSTGRES_RELOAD_S)
            if version == self._version:
                return
            rows = conn.execute("SELECT * FROM api_keys WHERE revoked_at IS NULL").fetchall()
            self._active = {row["hash"]: _info(row) for row in rows}
            self._version = version

    def close(self) -> None:
        if self._owns:
            self.db.close()


def _info(row: Any) -> KeyInfo:
    return KeyInfo(
        row["id"], row["team"], row["role"], row["agent_id"], row["label"], row["created_at"], row["revoked_at"]
    )
