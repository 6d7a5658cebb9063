"""One way to run SQL on either engine: SQLite files (the embedded default) or PostgreSQL.

The stores (journal, limits, keys) write their SQL once, in the subset both engines share
(`?` placeholders, `ON CONFLICT`, `RETURNING`), and ask `Database` for a transaction or a
read. Where the engines really differ (full-text search, job claiming, JSON arrays) the
store looks at `db.dialect` and says so in place.

SQLite: one write connection behind a lock (`BEGIN IMMEDIATE`: SQLite has one writer anyway,
and a Python lock hands it over faster than SQLite's sleeping busy handler) and a few read
connections (WAL: reads never wait for the writer, nor for each other: recall's keyword legs read
beside the request's own reads, and concurrent recalls do not queue for one connection).
PostgreSQL: a connection pool shared by the threads; each transaction takes its own connection,
so several processes and threads write at once and row locks do the serialising.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Protocol

from .chroma_http import ChromaServerFault
from .chroma_process import ChromaCallError
from .pg_bounds import GRACE_S, Watchdog, with_statement_timeout

Dialect = Literal["sqlite", "postgresql"]

# The drivers' "operational" errors. SQLite files some of these for a busy database and others for bugs
# ("no such column"): `storage_unavailable` tells them apart.
DRIVER_ERRORS: tuple[type[BaseException], ...] = (sqlite3.OperationalError,)
try:  # the PostgreSQL driver is the [postgres] extra: a SQLite-only install has none
    import psycopg

    DRIVER_ERRORS += (psycopg.OperationalError,)
except ImportError:
    psycopg = None  # type: ignore[assignment]

POSTGRES_EXTRA = "pip install 'memory-service[postgres]'"


class PostgresDriverMissing(ValueError):
    """A postgresql:// URL on an install without the [postgres] extra; the message says what to install."""

    def __init__(self, url: str) -> None:
        super().__init__(
            f"{describe(url)} needs the PostgreSQL driver, which the default install leaves out: {POSTGRES_EXTRA} "
            "(from a clone: ./scripts/bootstrap.sh --postgres), or leave MEMORY_DATABASE_URL unset for the "
            "embedded SQLite files"
        )


class StorageClosed(RuntimeError):
    """A store was used after `close()`: the service is shutting down, so a retry reaches the next one."""


# SQLite's primary result codes that pass: another connection holds the lock (BUSY, LOCKED), or the disk
# failed or filled up (IOERR, FULL). The request was valid and nothing changed, so a retry can succeed.
_SQLITE_TRANSIENT = frozenset({5, 6, 10, 13})
_SQLITE_TRANSIENT_TEXT = (
    "database is locked",
    "database table is locked",
    "disk i/o error",
    "database or disk is full",
)
# PostgreSQL's SQLSTATE classes that pass: connection exception, transaction rollback (serialization,
# deadlock), insufficient resources (too many connections), operator intervention (shutdown, statement
# timeout), system error (I/O); and lock_not_available.
_PG_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57", "58"})


def storage_unavailable(exc: BaseException) -> bool:
    """Whether `exc` means "the database is busy or gone for now" (answer 503, retry) rather than a bug (500).

    Only what really passes counts: a locked or busy SQLite file, a failing or full disk, a PostgreSQL
    connection refused or lost (psycopg raises those, and the pool's timeout, with no SQLSTATE), a closed
    store, the vector store's child reporting its disk full or failing, a Chroma server past a call's deadline
    or broken off. "no such column", a syntax error or a constraint is a bug and never counts.
    """
    if isinstance(exc, StorageClosed):
        return True
    if isinstance(exc, ChromaCallError):  # the vector store's disk: full or failing, as SQLite's below
        return exc.storage_full_or_failing
    if isinstance(exc, ChromaServerFault):  # the Chroma server stuck past a call's deadline, gone, or sending junk
        return True
    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None:
            return code & 0xFF in _SQLITE_TRANSIENT
        return str(exc).lower().startswith(_SQLITE_TRANSIENT_TEXT)
    if psycopg is not None and isinstance(exc, psycopg.OperationalError):
        state = exc.sqlstate
        return state is None or state[:2] in _PG_TRANSIENT_CLASSES or state == "55P03"
    return False


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    """What the stores use of a connection: sqlite3's interface, rows by index or by column name."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor: ...
    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> Any: ...


class Database:
    dialect: Dialect
    url: str

    def transaction(self, *, durable: bool = True) -> Any:  # context manager yielding a Conn
        """A write transaction. `durable=False`: a write that may be lost in a power cut and redone (an
        index's bookkeeping), committed without waiting for the disk; the next durable commit flushes it."""
        raise NotImplementedError

    def reading(self) -> Any:  # context manager yielding a Conn
        raise NotImplementedError

    def create_schema(self, sqlite_schema: str, postgres_schema: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


READERS = 4  # read connections per SQLite file: a recall uses two at once; more only hold page caches


class SqliteDatabase(Database):
    dialect: Dialect = "sqlite"

    def __init__(self, path: Path, *, synchronous: Literal["NORMAL", "FULL"] = "FULL") -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.url = path, str(path)
        self._conn = _sqlite(path)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(f"PRAGMA synchronous={synchronous}")
        self._synchronous = synchronous
        self._lock = threading.RLock()
        self._idle: list[sqlite3.Connection] = [_sqlite(path)]  # read connections not in use
        self._readers = 1  # opened so far, at most READERS
        self._reader_setup: list[str] = []
        self._read_free = threading.Condition()
        self._closed = False

    def create_schema(self, sqlite_schema: str, postgres_schema: str) -> None:
        with self._lock:
            self._conn.executescript(sqlite_schema)

    @contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        relaxed = not durable and self._synchronous == "FULL"
        with self._lock:
            if relaxed:  # WAL + NORMAL: the commit is not synced; the next FULL commit's fsync covers it
                self._conn.execute("PRAGMA synchronous=NORMAL")
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self._conn
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
            finally:
                if relaxed:
                    self._conn.execute("PRAGMA synchronous=FULL")

    def on_reader(self, sql: str) -> None:
        """Run `sql` on every read connection, now and when one is opened (per-connection state: temp tables)."""
        with self._read_free:
            if len(self._idle) != self._readers:  # a connection in use would miss it
                raise RuntimeError("on_reader is for set-up: call it before any read starts")
            self._reader_setup.append(sql)
            for conn in self._idle:
                conn.execute(sql)

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        with self._read_free:
            while not self._idle and self._readers >= READERS and not self._closed:
                self._read_free.wait()
            if self._closed:
                raise sqlite3.ProgrammingError("Cannot operate on a closed database.")
            if self._idle:
                conn = self._idle.pop()
            else:
                self._readers += 1
                conn = None
        if conn is None:
            try:
                conn = _sqlite(self.path)
                for sql in self._reader_setup:
                    conn.execute(sql)
            except BaseException:
                with self._read_free:
                    self._readers -= 1
                    self._read_free.notify()
                raise
        try:
            yield conn
        finally:
            with self._read_free:
                if self._closed:  # closed while this read ran: nothing will hand the connection out again
                    conn.close()
                else:
                    self._idle.append(conn)
                    self._read_free.notify()

    def writer(self) -> sqlite3.Connection:
        """The write connection outside any transaction (pragmas, one-statement writes), lock held by caller."""
        return self._conn

    def close(self) -> None:
        with self._lock, self._read_free:
            self._closed = True
            for conn in self._idle:
                conn.close()
            self._idle.clear()
            self._read_free.notify_all()
            self._conn.close()


BUSY_TIMEOUT_S = 30  # how long a statement waits for another connection's lock before "database is locked"


def _sqlite(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=BUSY_TIMEOUT_S)
    conn.row_factory = sqlite3.Row
    return conn


# ---------------------------------------------------------------------------------------- PostgreSQL


class Row(tuple):
    """A result row readable by position or by column name, like `sqlite3.Row`."""

    _names: dict[str, int]

    def __new__(cls, values: Sequence[Any], names: dict[str, int]) -> Row:
        row = super().__new__(cls, values)
        row._names = names
        return row

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


def _row_factory(cursor: Any) -> Any:
    names = {column.name: i for i, column in enumerate(cursor.description or ())}
    return lambda values: Row(values, names)


_INDEX_HINT = re.compile(r"(?<=[\s(=])\+(?=[a-z_])")  # SQLite's `+column` (skip an index): no meaning here


@lru_cache(maxsize=2048)
def to_postgres(sql: str) -> str:
    """The shared SQL dialect in psycopg's terms: `%s` placeholders, no SQLite index hints."""
    return _INDEX_HINT.sub("", sql.replace("%", "%%").replace("?", "%s"))


class _PgConn:
    def __init__(self, conn: Any, watchdog: Watchdog | None = None) -> None:
        self._conn, self._watchdog = conn, watchdog

    def _watched(self) -> Any:
        return self._watchdog.statement(self._conn) if self._watchdog is not None else nullcontext()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        with self._watched():  # psycopg reads the whole result here: fetching later is no round trip
            return self._conn.execute(to_postgres(sql), tuple(params))

    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> Any:
        with self._conn.cursor() as cur, self._watched():
            cur.executemany(to_postgres(sql), [tuple(p) for p in params])
            return cur


CONNECT_TIMEOUT_S = 5  # a new connection, handshake included (libpq's connect_timeout)
POOL_TIMEOUT_S = 5  # waiting for a free connection of the pool


class PostgresDatabase(Database):
    dialect: Dialect = "postgresql"

    # a worker storing facts holds up to three at once (the team's decision lock, its reads, the commit),
    # next to the API's requests and the passage indexer: 16 a process, well under PostgreSQL's default 100
    # connections for a few processes
    # `statement_timeout_s` (MEMORY_DATABASE_STATEMENT_TIMEOUT_S for the service; 0: none, the one-shot commands'
    # default) bounds every statement: the server ends it at that, and a server too stuck to do so is cut off
    # GRACE_S later by the watchdog (pg_bounds.py). Connecting is bounded by CONNECT_TIMEOUT_S, taking a
    # connection from the pool by POOL_TIMEOUT_S: a stuck server holds a thread for a bounded time, never for good.
    def __init__(self, url: str, *, max_size: int = 16, statement_timeout_s: float = 0) -> None:
        if psycopg is None:
            raise PostgresDriverMissing(url)
        from psycopg_pool import ConnectionPool

        self.url = url
        psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S).close()  # fail fast, with the server's own words
        bounded = with_statement_timeout(url, statement_timeout_s) if statement_timeout_s > 0 else {}
        self._watchdog = Watchdog(statement_timeout_s + GRACE_S, describe(url)) if statement_timeout_s > 0 else None
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=max_size,
            open=False,
            timeout=POOL_TIMEOUT_S,
            kwargs={"autocommit": True, "row_factory": _row_factory, "connect_timeout": CONNECT_TIMEOUT_S, **bounded},
        )
        self._pool.open(wait=True, timeout=10)

    def create_schema(self, sqlite_schema: str, postgres_schema: str) -> None:
        # one process at a time: concurrent CREATE ... IF NOT EXISTS can still collide in the catalog
        with self.transaction() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(7263545)")
            for statement in filter(str.strip, postgres_schema.split(";")):
                conn.execute(statement)

    @contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[_PgConn]:
        with self._pool.connection() as conn:
            pg = _PgConn(conn, self._watchdog)
            tx = conn.transaction()
            with pg._watched():  # BEGIN and COMMIT are round trips too
                tx.__enter__()
            try:
                if not durable:
                    pg.execute("SET LOCAL synchronous_commit TO OFF")
                yield pg
            except BaseException as exc:
                with pg._watched():
                    if not tx.__exit__(type(exc), exc, exc.__traceback__):
                        raise
            else:
                with pg._watched():
                    tx.__exit__(None, None, None)

    @contextmanager
    def reading(self) -> Iterator[_PgConn]:
        with self._pool.connection() as conn:
            yield _PgConn(conn, self._watchdog)

    def close(self) -> None:
        self._pool.close()
        if self._watchdog is not None:
            self._watchdog.close()


def is_postgres_url(url: str | None) -> bool:
    return bool(url) and url.split(":", 1)[0] in ("postgresql", "postgres")  # type: ignore[union-attr]


_SECRET_PARAM = re.compile(
    r"(?i)\b(password|sslpassword|passwd|pwd|user|username|passfile|sslkey|token|secret)(\s*=\s*)"
    r"('(?:[^'\\]|\\.)*'|[^\s&;]*)"
)


def describe(url: str) -> str:
    """The URL (or key=value DSN) without credentials, for logs, errors and /ready: the whole `user:pass@`
    (up to its last @, a password may hold one) and every password- or user-like parameter."""
    return _SECRET_PARAM.sub(r"\1\2***", re.sub(r"://.*@", "://***@", url))


def open_database(settings: Any) -> Database | None:
    """The shared database `MEMORY_DATABASE_URL` names, or None for the data dir's SQLite files."""
    url = settings.database_url
    if not url:
        return None
    if not is_postgres_url(url):
        raise ValueError(
            f"MEMORY_DATABASE_URL={describe(url)!r}: only postgresql://… URLs are supported; "
            "leave it unset for the embedded SQLite files"
        )
    try:
        return PostgresDatabase(url, statement_timeout_s=settings.database_statement_timeout_s)
    except PostgresDriverMissing as exc:
        raise ValueError(f"MEMORY_DATABASE_URL={exc}") from None
    except Exception as exc:
        reason = " ".join(str(exc).split())
        raise ValueError(
            f"MEMORY_DATABASE_URL={describe(url)}: PostgreSQL is unreachable or refused the "
            f"connection ({reason}). Start it, or fix the URL."
        ) from None
