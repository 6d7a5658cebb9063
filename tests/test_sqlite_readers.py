"""SQLite reads run side by side on their own connections, each with the per-connection set-up the keyword
search needs (its fts5vocab tables)."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from memory_service.storage import database
from memory_service.storage.journal import Journal


def _journal(tmp_path) -> Journal:
    journal = Journal(tmp_path / "journal.sqlite3")
    for _n, text in enumerate(("the invoice ZX-41 is overdue", "lunch with Dana on Friday", "quartz lamp repair")):
        journal.insert(
            team="t",
            agent_id="a",
            text=text,
            run_id=None,
            tags=[],
            metadata={},
            idempotency_key=None,
            budget_s=10.0,
            occurred_at=None,
            occurred_day=None,
        )
    return journal


def test_reads_run_side_by_side(tmp_path):
    journal = _journal(tmp_path)
    both_inside = threading.Barrier(2, timeout=10)
    errors: list[BaseException] = []

    def read() -> None:
        try:
            with journal.reading() as conn:
                both_inside.wait()  # with one shared connection the second reader never gets here
                assert conn.execute("SELECT COUNT(*) FROM memories").fetchone()[0] == 3
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    journal.close()


def test_keyword_search_works_on_every_read_connection(tmp_path):
    journal = _journal(tmp_path)
    held = [journal.db.reading() for _ in range(database.READERS - 1)]
    for ctx in held:  # every connection but one in use: the search gets a connection opened just now
        ctx.__enter__()
    try:
        hits = journal.keyword_search("t", "invoice ZX-41", kinds={"passage"}, limit=5)
        assert [h.text for h in hits] == ["the invoice ZX-41 is overdue"]
    finally:
        for ctx in held:
            ctx.__exit__(None, None, None)
    journal.close()


def test_readers_are_bounded_and_handed_over(tmp_path):
    journal = _journal(tmp_path)
    held = [journal.db.reading() for _ in range(database.READERS)]
    for ctx in held:
        ctx.__enter__()
    got: list[int] = []
    waiter = threading.Thread(
        target=lambda: got.append(len(journal.keyword_search("t", "lunch Dana", kinds={"passage"}, limit=5)))
    )
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and got == []  # all connections in use: it waits, it does not open a fifth
    held.pop().__exit__(None, None, None)
    waiter.join(30)
    assert got == [1]
    for ctx in held:
        ctx.__exit__(None, None, None)
    journal.close()


def test_reader_set_up_after_a_read_started_is_refused(tmp_path):
    journal = _journal(tmp_path)
    with journal.reading():
        with pytest.raises(RuntimeError, match="before any read"):
            journal.db.on_reader("SELECT 1")
    journal.close()


def test_a_read_after_close_is_refused(tmp_path):
    journal = _journal(tmp_path)
    journal.close()
    with pytest.raises(sqlite3.ProgrammingError):
        with journal.reading():
            pass
