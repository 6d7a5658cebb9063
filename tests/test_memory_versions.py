"""The earlier versions of an updated memory (mem0's update) as rows of the journal, on SQLite and PostgreSQL:
carried to the memory that replaces them, bounded, forgotten with it, and added to an older journal by its
schema upgrade (issue 53: they were kept in metadata, which a few updates of a long note grew past 8 KiB)."""

from __future__ import annotations

import logging

import pytest

from memory_service.storage.database import Database
from memory_service.storage.forget import mark_forgotten
from memory_service.storage.journal import Journal
from memory_service.storage.schema_upgrades import LATEST, read_version
from memory_service.storage.versions import Version, carry, versions

TEAM = "team-v"
NOTE = "会议纪要：" + "本周发布推迟到周五，负责人是王芳。" * 24  # a long Chinese note, 400+ characters


def _save(journal: Journal, text: str) -> str:
    memory, created = journal.insert(
        team=TEAM, agent_id="notes", text=text, run_id=None, tags=[], metadata={}, idempotency_key=None, budget_s=60
    )
    assert created
    return memory.id


def test_updates_carry_a_bounded_history_and_a_forget_takes_it(journal: Journal) -> None:
    current = _save(journal, NOTE + "第0版")
    for n in range(1, 15):
        new = _save(journal, NOTE + f"第{n}版")
        old = journal.get(TEAM, current)
        assert old is not None
        carry(journal, TEAM, Version(old.id, old.text[:400], old.created_at), [], new, keep=10, chars=400)
        mark_forgotten(journal, TEAM, memory_ids=[current])
        assert versions(journal, TEAM, current) == []  # the replaced memory's rows went with it
        current = new
    kept = versions(journal, TEAM, current)
    assert len(kept) == 10  # the last 10 of 14 earlier versions
    assert [v.text for v in kept] == [(NOTE + f"第{n}版")[:400] for n in range(4, 14)]
    assert all(len(v.text) == 400 for v in kept) and [v.at for v in kept] == sorted(v.at for v in kept)
    mark_forgotten(journal, TEAM, memory_ids=[current])
    assert versions(journal, TEAM, current) == []
    with journal.reading() as conn:
        assert conn.execute("SELECT COUNT(*) FROM memory_versions").fetchone()[0] == 0


def test_a_journal_from_before_the_versions_table_gets_it(database: Database, caplog: pytest.LogCaptureFixture) -> None:
    Journal(database)
    with database.transaction() as conn:  # the journal as version 7 left it: no versions table
        conn.execute("DROP TABLE memory_versions")
        if database.dialect == "sqlite":
            conn.execute("PRAGMA user_version = 7")
        else:
            conn.execute("UPDATE schema_version SET version = 7 WHERE store = 'journal'")
    with caplog.at_level(logging.INFO, logger="memory_service"):
        journal = Journal(database)
    assert "journal schema upgraded to version 8: mem0 updates' earlier versions, out of metadata" in [
        r.getMessage() for r in caplog.records
    ]
    with journal.reading() as conn:
        assert read_version(conn, journal.dialect) == LATEST >= 8
    first, second = _save(journal, "v1"), _save(journal, "v2")
    carry(journal, TEAM, Version(first, "v1", 1.0), [], second, keep=10, chars=400)
    assert versions(journal, TEAM, second) == [Version(first, "v1", 1.0)]
