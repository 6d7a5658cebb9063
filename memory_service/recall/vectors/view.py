"""What this process holds of each team's vectors, kept current by every write to the vector store.

Each team's directory (`directory`) is loaded once from the journal, the first time the team is searched;
the cached matrices (`matrices`) and clustered indexes (`clustered_indexes`) are filled by searches. Every
upsert and delete reaches them through `VectorView`, the vector store's listener: it must be registered
before any write (Services does so before a worker starts), or a write could be missed for good.

A write to a team whose directory is not loaded yet is remembered (the last `REPLAY_EVENTS` per team) and
replayed on load, in case the journal did not show it yet then.
"""

from __future__ import annotations

import collections
import json
import threading
from typing import Any

from ...pipeline.passages import window_starts
from ...storage.consolidation import store_for
from ...storage.journal import DELETED, Journal
from ...storage.vectors import KINDS, VectorItem, kind_of_id
from .clustered_indexes import ClusteredIndexes, TeamKind
from .directory import Directory
from .matrices import MatrixCache

REPLAY_EVENTS = 4096  # writes remembered for a team whose directory is not loaded yet

Meta = tuple[str, tuple[str, ...], float]  # agent, tags, created_at
Replayed = tuple[str, str, Meta | None]  # "upsert" | "delete", item id, its metadata (upserts)


class VectorView:
    """Directories, cached matrices and clustered indexes of every team, behind one lock (reentrant: a
    search holds it across its steps, and the background passes take it to publish what they made)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.lock = threading.RLock()
        self.directories: dict[TeamKind, Directory] = {}
        self.matrices = MatrixCache()
        self.clustered = ClusteredIndexes()
        self._unloaded: dict[str, collections.deque[Replayed]] = {}

    # -- the vector store's listener ------------------------------------------------------------------

    def upserted(self, team: str, items: list[VectorItem]) -> None:
        with self.lock:
            for item in items:
                kind = item.metadata.get("kind", "passage")
                meta = _meta_of(item.metadata)
                d = self.directories.get((team, kind))
                if d is None:
                    self._remember(team, ("upsert", item.id, meta))
                    continue
                old = d.row.get(item.id)
                r = d.add(item.id, *meta)
                self.matrices.written(team, kind, old, r, meta[0], meta[1], item.embedding)
                self.clustered.written((team, kind), r, item.embedding)

    def deleted(self, team: str, ids: list[str]) -> None:
        with self.lock:
            for item_id in ids:
                kind = kind_of_id(item_id)
                d = self.directories.get((team, kind))
                if d is None:
                    self._remember(team, ("delete", item_id, None))
                    continue
                r = d.row.get(item_id)
                d.remove(item_id)
                if r is not None:
                    self.matrices.deleted(team, kind, r)

    def _remember(self, team: str, event: Replayed) -> None:
        """A write to a team not loaded yet: replayed on load, in case the journal did not show it then."""
        self._unloaded.setdefault(team, collections.deque(maxlen=REPLAY_EVENTS)).append(event)

    # -- directories ----------------------------------------------------------------------------------

    def loaded(self, team: str, kind: str) -> bool:
        """Whether the team's directory is loaded (read without the lock: a loading thread may hold it)."""
        return (team, kind) in self.directories

    def directory(self, team: str, kind: str) -> Directory:
        """The team's directory, loaded from the journal the first time (both kinds at once: the replayed
        writes are kept per team). The caller holds the lock."""
        d = self.directories.get((team, kind))
        if d is not None:
            return d
        for one in KINDS:
            loaded = Directory()
            for item_id, agent, tags, created_at in _journal_rows(self.journal, team, one):
                loaded.add(item_id, agent, tags, created_at)
            self.directories[(team, one)] = loaded
        for op, item_id, meta in self._unloaded.pop(team, ()):
            target = self.directories[(team, kind_of_id(item_id))]
            if op == "upsert" and meta is not None:
                target.add(item_id, *meta)
            else:
                target.remove(item_id)
        return self.directories[(team, kind)]


def _meta_of(meta: dict[str, Any]) -> Meta:
    tags = tuple(sorted(key[4:] for key, value in meta.items() if key.startswith("tag:") and value))
    return str(meta.get("agent_id", "")), tags, float(meta.get("created_at", 0.0))


def _journal_rows(journal: Journal, team: str, kind: str) -> list[tuple[str, str, tuple[str, ...], float]]:
    """The vectors the journal says the team has: active facts, consolidated items, or the windows of live texts."""
    if kind == "consolidated":
        return store_for(journal).vector_rows(team)
    with journal.reading() as conn:
        if kind == "fact":
            rows = conn.execute(
                "SELECT id, agent_id, tags, created_at FROM facts WHERE team = ? AND superseded_by IS NULL", (team,)
            ).fetchall()
            return [(r[0], r[1], tuple(sorted(json.loads(r[2]))), float(r[3])) for r in rows]
        rows = conn.execute(
            "SELECT id, agent_id, tags, created_at, LENGTH(text) FROM memories WHERE team = ? AND status != ?",
            (team, DELETED),
        ).fetchall()
    return [
        (f"p:{r[0]}:{start}", r[1], tuple(sorted(json.loads(r[2]))), float(r[3]))
        for r in rows
        for start in window_starts(int(r[4]))
    ]
