"""Each large team's clustered index (`clusters`): kept current by writes, built off the request path.

A build fetches every vector of a team's kind from Chroma and clusters them (seconds at 100k), so it runs
in the background while recall goes on through Chroma; the writes that land during it are kept and added
to the index when it is ready. A build that failed is tried again after `BUILD_RETRY_S`; indexes that
would not fit `CLUSTERED_BYTES_MAX` are not built at all (Chroma's HNSW serves those teams).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from ...embedding.embedder import DIMENSIONS
from .background import BackgroundWork
from .clusters import ClusteredVectors
from .directory import Directory
from .matrices import Matrix

log = logging.getLogger("memory_service")

CLUSTERED_BYTES_MAX = 1 << 30  # clustered indexes, all teams (~650k vectors); past it, Chroma's HNSW
BUILD_RETRY_S = 60.0  # a clustered index whose build failed is tried again after this

TeamKind = tuple[str, str]


class ClusteredIndexes:
    """The ready indexes, and the writes each build in progress must not miss. The caller holds the lock."""

    def __init__(self) -> None:
        self.ready: dict[TeamKind, ClusteredVectors] = {}
        self.building: dict[TeamKind, dict[int, np.ndarray]] = {}  # row -> vector written during the build

    def __contains__(self, team_kind: TeamKind) -> bool:
        return team_kind in self.ready

    def __len__(self) -> int:
        return len(self.ready)

    def nbytes(self) -> int:
        return sum(index.nbytes for index in self.ready.values())

    def written(self, team_kind: TeamKind, row: int, vector: np.ndarray) -> None:
        """An upsert (the old row is dropped by the directory's `alive`, at search)."""
        index = self.ready.get(team_kind)
        if index is not None:
            index.add(row, vector)
        elif team_kind in self.building:
            self.building[team_kind][row] = np.asarray(vector, dtype=np.float32)

    def current(self, team_kind: TeamKind, alive: np.ndarray) -> ClusteredVectors | None:
        """The team's index with its pending writes folded in when due (on this thread); None: not built."""
        index = self.ready.get(team_kind)
        if index is not None and index.needs_fold():
            index = self.ready[team_kind] = index.folded(alive)
        return index


class ClusterBuilds:
    """Starts the builds: one per team and kind at a time, on the background runner."""

    def __init__(
        self,
        indexes: ClusteredIndexes,
        lock: threading.RLock,
        background: BackgroundWork,
        fetch: Callable[[str, str, Directory, np.ndarray], Matrix],
    ) -> None:
        self._indexes = indexes
        self._lock = lock
        self._background = background
        self._fetch = fetch
        self._failed: dict[TeamKind, float] = {}  # when a build last failed: retried later

    def start(self, team: str, kind: str, d: Directory) -> None:
        """Build the team's clustered index in the background, if it fits. The caller holds the lock."""
        team_kind = (team, kind)
        if team_kind in self._indexes.building:
            return
        if time.monotonic() - self._failed.get(team_kind, -BUILD_RETRY_S) < BUILD_RETRY_S:
            return
        if self._indexes.nbytes() + d.live * DIMENSIONS * 4 > CLUSTERED_BYTES_MAX:
            return
        rows = d.all_rows()
        self._indexes.building[team_kind] = {}
        if not self._background.submit(self._build, team, kind, d, rows):
            self._indexes.building.pop(team_kind, None)  # stopping: nothing more is started

    def _build(self, team: str, kind: str, d: Directory, rows: np.ndarray) -> None:
        started = time.monotonic()
        index: ClusteredVectors | None
        try:
            matrix = self._fetch(team, kind, d, rows)  # outside the lock: recall goes on through Chroma
            index = ClusteredVectors.build(matrix.rows, matrix.vectors) if len(matrix.rows) else None
        except Exception:  # noqa: BLE001 - the cache is optional: recall keeps using Chroma
            log.exception("could not build the in-process vector index of a team's %ss", kind)
            index = None
        with self._lock:
            written = self._indexes.building.pop((team, kind), {})
            if index is None:  # failed, or no vector written yet: not fetched again on every search
                self._failed[(team, kind)] = time.monotonic()
                return
            index.added.update(written)
            self._indexes.ready[(team, kind)] = index
            log.info("in-process vector index of %d %ss ready in %.1f s", len(index), kind, time.monotonic() - started)
