"""The earlier versions of a memory that replaced another (mem0's update), in the journal's `memory_versions`.

A saved text is never rewritten: an update saves the new text as a new memory and forgets the old one. The
new memory's history is the old one's, then the old one itself, at most `keep` versions of at most `chars`
characters each. It was kept in the memory's metadata until issue 53: a few updates of a long note grew the
metadata past its 8 KiB bound, and the exported line no longer imported. Here it is bounded by rows, and a
forget takes a memory's versions with it (storage/forget.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .journal import Journal


@dataclass(frozen=True)
class Version:
    id: str  # the id the version had while it was the memory
    text: str
    at: float  # when that version was saved


def carry(
    journal: Journal, team: str, old: Version, earlier: list[Version], new_id: str, *, keep: int, chars: int
) -> list[Version]:
    """Give `new_id` the history of the memory it replaces: `old`'s stored versions (or `earlier`, those a
    journal from before this table kept in metadata, when it has none), then `old` itself; the last `keep`."""
    with journal.transaction() as conn:
        rows = conn.execute(
            "SELECT version_id, text, at FROM memory_versions WHERE team = ? AND memory_id = ? ORDER BY seq",
            (team, old.id),
        ).fetchall()
        stored = [Version(r["version_id"], r["text"], float(r["at"])) for r in rows] or earlier
        chain = [*stored, Version(old.id, old.text[:chars], old.at)][-keep:]
        conn.executemany(
            "INSERT INTO memory_versions (team, memory_id, seq, version_id, text, at) VALUES (?,?,?,?,?,?) "
            "ON CONFLICT DO NOTHING",
            [(team, new_id, n, v.id, v.text[:chars], v.at) for n, v in enumerate(chain)],
        )
    return chain


def versions(journal: Journal, team: str, memory_id: str) -> list[Version]:
    """The memory's earlier versions, oldest first (none for a memory no update made)."""
    with journal.reading() as conn:
        rows = conn.execute(
            "SELECT version_id, text, at FROM memory_versions WHERE team = ? AND memory_id = ? ORDER BY seq",
            (team, memory_id),
        ).fetchall()
    return [Version(r["version_id"], r["text"], float(r["at"])) for r in rows]


def forget_versions(conn: Any, team: str, memory_ids: list[str]) -> None:
    """In a forget's transaction: the forgotten memories' earlier texts go with them."""
    for start in range(0, len(memory_ids), 500):
        chunk = memory_ids[start : start + 500]
        marks = ",".join("?" * len(chunk))
        conn.execute(f"DELETE FROM memory_versions WHERE team = ? AND memory_id IN ({marks})", (team, *chunk))
