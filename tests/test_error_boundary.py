"""One error boundary: a database bug is a 500 with the request id, a locked database a 503 with Retry-After.

In process, the real app on real SQLite files: a second sqlite3 connection to the data dir's database
breaks a table the route reads (a bug, as a bad migration or a typo in SQL would be) or holds the write
lock (storage busy, as another process would). Before the boundary was narrowed, both answered 503.
"""

from __future__ import annotations

import logging
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient
from psycopg import errors as pg_errors
from psycopg_pool import PoolTimeout

from memory_service.app import create_app
from memory_service.config import Settings
from memory_service.services import Services
from memory_service.storage import database
from memory_service.storage.database import StorageClosed, storage_unavailable

KEYS = {"key-a": "team-a"}
LIMIT = {"daily_limit": 5, "timezone": "UTC"}
SAVE = {"text": "Ines approved the Plover plan.", "agent_id": "agent-1"}


class App:
    """The real app and stores on a fresh data dir, with a short SQLite busy timeout (a locked write fails
    in a fifth of a second, not thirty)."""

    def __init__(self, data_dir: Path) -> None:
        # a port nothing listens on: nothing here reaches the model
        self.settings = Settings(data_dir=data_dir, api_keys=KEYS, llm_url="http://127.0.0.1:9", chroma_process=False)
        self.services = Services.open(self.settings)
        self.app = create_app(self.settings, services=self.services)
        self.api = TestClient(self.app, headers={"Authorization": "Bearer key-a"})

    def sql(self, file: str, statement: str) -> None:
        """Run `statement` through a connection of its own, as another process would."""
        conn = sqlite3.connect(self.settings.data_dir / file, isolation_level=None)
        try:
            conn.execute(statement)
        finally:
            conn.close()

    @contextmanager
    def locked(self, file: str) -> Iterator[None]:
        """Another connection holds the write lock of `file` for the duration."""
        conn = sqlite3.connect(self.settings.data_dir / file, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
            conn.close()


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[App]:
    monkeypatch.setattr(database, "BUSY_TIMEOUT_S", 0.2)  # read when each connection opens
    made = App(tmp_path / "data")
    yield made
    made.services.close()


def assert_bug_answer(response, request_id: str) -> None:
    assert response.status_code == 500, response.text
    body = response.json()
    assert body["error"] == "internal" and body["detail"].startswith("internal error: OperationalError")
    assert body["request_id"] == request_id and response.headers["X-Request-ID"] == request_id
    assert "Retry-After" not in response.headers


def assert_busy_answer(response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"] == "1" and response.headers["X-Request-ID"]
    body = response.json()
    assert body["error"] == "unavailable" and "database is locked" in body["detail"]


def logged_bug(caplog: pytest.LogCaptureFixture, path: str) -> bool:
    """The 500 is logged with its traceback."""
    return any(
        r.levelno == logging.ERROR and path in r.getMessage() and r.exc_info and "no such column" in str(r.exc_info[1])
        for r in caplog.records
    )


# ---------------------------------------------------------------- a database bug: 500 with the request id


def test_a_missing_column_on_a_limits_route_is_a_500_with_the_request_id(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    assert app.api.put("/v1/limits/mail", json=LIMIT).status_code == 201
    app.sql("limits.sqlite3", "ALTER TABLE limit_defs RENAME COLUMN timezone TO timezone_gone")
    with caplog.at_level(logging.ERROR, logger="memory_service.api"):
        assert_bug_answer(app.api.get("/v1/limits", headers={"X-Request-ID": "bug-limits-1"}), "bug-limits-1")
    assert logged_bug(caplog, "GET /v1/limits")
    fresh = app.api.get("/v1/limits/mail")  # no id given: the service's own, in the body and the header
    assert_bug_answer(fresh, fresh.headers["X-Request-ID"])


def test_a_missing_column_on_a_memories_route_is_a_500_with_the_request_id(
    app: App, caplog: pytest.LogCaptureFixture
) -> None:
    assert app.api.post("/v1/remember", json=SAVE).status_code == 202
    app.sql("journal.sqlite3", "ALTER TABLE memories RENAME COLUMN created_at TO created_gone")
    with caplog.at_level(logging.ERROR, logger="memory_service.api"):
        assert_bug_answer(app.api.get("/v1/memories", headers={"X-Request-ID": "bug-list-1"}), "bug-list-1")
    assert logged_bug(caplog, "GET /v1/memories")


# ---------------------------------------------------------------- a locked database: 503, retry


def test_a_locked_database_on_a_limits_route_is_a_503_with_retry_after(app: App) -> None:
    with app.locked("limits.sqlite3"):
        assert_busy_answer(app.api.put("/v1/limits/mail", json=LIMIT))
    assert app.api.get("/v1/limits").json() == []  # nothing changed
    assert app.api.put("/v1/limits/mail", json=LIMIT).status_code == 201  # and the retry works


def test_a_locked_database_on_a_memories_route_is_a_503_with_retry_after(app: App) -> None:
    with app.locked("journal.sqlite3"):
        assert_busy_answer(app.api.post("/v1/remember", json=SAVE))
    assert app.api.get("/v1/memories").json()["items"] == []  # nothing changed
    assert app.api.post("/v1/remember", json=SAVE).status_code == 202


# ---------------------------------------------------------------- the console: the same classification, as a page


def console(app: App) -> TestClient:
    client = TestClient(app.app)
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', client.get("/ui/login").text)
    assert token is not None
    form = {"key": "key-a", "csrf": token.group(1), "next": "/ui/limits"}
    assert client.post("/ui/login", data=form, follow_redirects=False).status_code == 303
    return client


def test_the_consoles_page_for_a_database_bug_is_a_500_page(app: App) -> None:
    assert app.api.put("/v1/limits/mail", json=LIMIT).status_code == 201
    browser = console(app)
    assert browser.get("/ui/limits").status_code == 200
    app.sql("limits.sqlite3", "ALTER TABLE limit_defs RENAME COLUMN timezone TO timezone_gone")
    page = browser.get("/ui/limits", headers={"X-Request-ID": "bug-page-1"})
    assert page.status_code == 500 and page.headers["content-type"].startswith("text/html")
    assert "Retry-After" not in page.headers and page.headers["X-Request-ID"] == "bug-page-1"
    assert '<code id="request-id">bug-page-1</code>' in page.text and "Storage busy" not in page.text


# ---------------------------------------------------------------- what counts as "storage unavailable"


def sqlite_error(statement: str, path: Path | str = ":memory:") -> sqlite3.OperationalError:
    conn = sqlite3.connect(path, timeout=0)
    try:
        conn.execute(statement)
    except sqlite3.OperationalError as exc:
        return exc
    finally:
        conn.close()
    raise AssertionError(f"{statement!r} did not fail")


def test_only_what_passes_counts_as_storage_unavailable(tmp_path: Path) -> None:
    holder = sqlite3.connect(tmp_path / "held.sqlite3", isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    assert storage_unavailable(sqlite_error("INSERT INTO t VALUES (1)", tmp_path / "held.sqlite3"))  # locked
    assert storage_unavailable(sqlite3.OperationalError("database table is locked"))
    assert storage_unavailable(StorageClosed("limit store is closed"))
    for bug in ("SELECT nope FROM sqlite_master", "SELECT * FROM no_such_table", "SELEC 1"):
        assert not storage_unavailable(sqlite_error(bug)), bug
    assert not storage_unavailable(RuntimeError("anything else"))
    holder.execute("ROLLBACK")
    # PostgreSQL: a connection refused or lost and the pool's timeout have no SQLSTATE; shutdown, too many
    # connections, a serialization failure or a lock timeout pass; a bad column never does
    assert storage_unavailable(psycopg.OperationalError("connection refused"))
    assert storage_unavailable(PoolTimeout("couldn't get a connection after 5.00 sec"))
    for passing in ("08006", "57P01", "53300", "40001", "55P03", "57014"):
        assert storage_unavailable(pg_errors.lookup(passing)("")), passing
    for bug in ("42703", "42P01", "55000"):
        assert not storage_unavailable(pg_errors.lookup(bug)("")), bug
