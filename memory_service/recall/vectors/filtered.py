"""Filtered vector search, planned by how many of the team's vectors the filter keeps.

Chroma's own `where` scans metadata in SQLite on every query (about 100 ms for one agent at 100k facts).
Instead each team keeps a directory of its vectors (`directory`, `view`), loaded once from the
journal and kept current by the vector store's upserts and deletes, so the number of rows a filter keeps
is counted, not guessed:

- no filter: up to `UNFILTERED_EXACT_MAX_ROWS` vectors, exact search over all of them (cached); past
  that, an in-process clustered index (`clusters`, `clustered_indexes`), built in the background the
  first time the team is searched; until it is ready, or when it would not fit, Chroma's HNSW.
  Chroma's query costs ~3.5 ms however small the collection; these cost well under one;
- the filter keeps few rows (one agent's items): exact search, a matrix product over just their
  vectors, fetched from Chroma once and cached (`matrices`: a write or forget updates the cache);
- it keeps many: the clustered index with the filter as a mask when there is one; else over-fetch from
  HNSW and keep the matching ids; when that comes up short (one agent's items often sit together in
  vector space), exact search too, its vectors cached from then on;
- a filter too big to cache whose over-fetches come up short: Chroma's `where` query, as before.

Forgotten items are dropped by recall against the journal whatever path found them; the directory and
cache also drop them when their vectors are deleted.

A Chroma server (MEMORY_CHROMA_URL) is written by other processes too, whose writes this process never
hears of: there a filtered search always asks Chroma's `where`, which sees every write.
"""

from __future__ import annotations

import collections
import logging
import math
from dataclasses import dataclass
from functools import partial

import numpy as np

from ...storage.journal import Journal
from ...storage.vectors import VectorStore
from .background import BackgroundWork
from .clustered_indexes import ClusterBuilds, TeamKind
from .directory import Directory, VectorFilter
from .hub_scores import HubnessScores, prepare_pass
from .matrices import FilterKey, fetch_matrix, filter_key, nearest, whole_team_key
from .view import VectorView

__all__ = ["FilteredVectors", "VectorFilter"]

log = logging.getLogger("memory_service")

EXACT_MAX_ROWS = 5000  # exact search up to here: 5000 x 384 floats is well under a millisecond to score
OVERFETCH_MAX = 1000  # the most HNSW results asked for when post-filtering
OVERFETCH_FACTOR = 2.0  # margin on k / share
TIME_ONLY_EXACT_MAX_ROWS = 256  # a time window alone is not cached: its vectors are fetched per search
EXACT_FALLBACK_ROWS = 50_000  # a bigger filter whose over-fetch came up short: exact too, and cached
EXACT_CACHED_MAX_ROWS = 15_000  # once cached, exact beats a large over-fetch up to about here
UNFILTERED_EXACT_MAX_ROWS = 5000  # no filter: exact search over the whole team up to here (~0.5 ms)
CLUSTER_WIDEN = 4  # a filtered search that finds too few in the probed clusters probes this many times more

Found = list[tuple[str, float]]  # (item id, cosine similarity), best first


@dataclass
class _Selection:
    """What a filter keeps of one team's directory: the rows passing its agent and tags (`base`; None: no
    such filter) and, when counted, those also inside its time window (`rows`)."""

    team: str
    kind: str
    flt: VectorFilter
    d: Directory
    base: set[int] | None
    rows: np.ndarray | None
    kept: int  # rows the whole filter keeps
    total: int  # the team's live vectors of this kind

    @property
    def key(self) -> FilterKey:
        return filter_key(self.team, self.kind, self.flt.agent_id, self.flt.tags)

    @property
    def fits(self) -> bool:
        """Small enough to search exactly (and cache) when over-fetching comes up short."""
        return self.base is not None and len(self.base) <= EXACT_FALLBACK_ROWS


class FilteredVectors:
    """Vector search with recall's filters.

    Its `view` must hear every write to the vector store: Services makes one, registers it with the store
    before any worker starts, and passes it in. Without one, a view of `journal` is made here and registered
    now (for a store no one has written through yet). `background` runs the directory loads, index builds
    and hubness passes; its maker joins it at stop (one made here is joined by `close`).
    """

    def __init__(
        self,
        journal: Journal,
        vectors: VectorStore,
        *,
        view: VectorView | None = None,
        background: BackgroundWork | None = None,
    ) -> None:
        self.vectors = vectors
        if view is None:
            view = VectorView(journal)
            vectors.add_listener(view)
        self.view = view
        self._owned_background = background is None
        self.background = background if background is not None else BackgroundWork()
        fetch = partial(fetch_matrix, vectors)
        self._fetch = fetch
        self.builds = ClusterBuilds(view.clustered, view.lock, self.background, fetch)
        self.hub_scores = HubnessScores(view.lock, self.background)
        self._loading: set[TeamKind] = set()  # (team, kind) directories the background is loading
        self.last_plan = ""  # for benchmarks and tests: which path the last search took
        self.plans: collections.Counter[str] = collections.Counter()

    def close(self) -> None:
        """Join the background work if this made its runner (else its maker does)."""
        if self._owned_background:
            self.background.close()

    def clustered_indexes(self) -> int:
        """How many team-kinds are searched through a clustered index (for /metrics and benchmarks)."""
        with self.view.lock:
            return len(self.view.clustered)

    # -- search ----------------------------------------------------------------------------------------

    def search(self, team: str, kind: str, embedding: np.ndarray, k: int, flt: VectorFilter) -> Found:
        """The k nearest (id, similarity) of one kind that pass the filter, best first."""
        if not flt:
            found = None if self.vectors.shared else self._whole_team(team, kind, embedding, k)
            if found is not None:
                return found
            self._plan("hnsw")
            return self._chroma(team, kind, embedding, k)
        if self.vectors.shared:
            self._plan("where")
            return self._chroma(team, kind, embedding, k, flt)
        return self._filtered(team, kind, embedding, k, flt)

    def _plan(self, name: str) -> None:
        self.last_plan = name
        self.plans[name] += 1

    def _chroma(self, team: str, kind: str, embedding: np.ndarray, k: int, flt: VectorFilter | None = None) -> Found:
        """Chroma's HNSW, with the filter as its `where` when one is given."""
        where = flt.where() if flt is not None else None
        return [(h.id, h.similarity) for h in self.vectors.query(team, embedding, k, where, kind=kind, payload=False)]

    def _whole_team(self, team: str, kind: str, embedding: np.ndarray, k: int) -> Found | None:
        """No filter, in process: exact for a small team, else the clustered index (None: not ready).

        The first search of a team loads its directory in the background (a second or two at 100k) and is
        answered by Chroma meanwhile, so a service's first recalls after a start do not wait for it.
        """
        if not self.view.loaded(team, kind):
            self._load_later(team, kind)
            return None
        with self.view.lock:
            d = self.view.directory(team, kind)
            if d.live == 0:
                self._plan("empty")
                return []
            if d.live <= UNFILTERED_EXACT_MAX_ROWS:
                self._plan("exact")
                return self._exact(whole_team_key(team, kind), d, None, d.all_rows(), embedding, k, whole=True)
            index = self.view.clustered.current((team, kind), d.alive)
            if index is None:
                self.builds.start(team, kind, d)
                return None
            self._plan("clusters")
            return [(d.ids[r], similarity) for r, similarity in index.search(embedding, k, d.alive)]

    def _filtered(self, team: str, kind: str, embedding: np.ndarray, k: int, flt: VectorFilter) -> Found:
        """A filter in process: exact when it keeps few rows, else the clustered index masked by it, else an
        over-fetch from HNSW, else exact after all when its vectors fit, else Chroma's `where`."""
        with self.view.lock:
            sel = self._select(team, kind, flt)
            if sel.kept == 0:
                self._plan("empty")
                return []
            cached = sel.key in self.view.matrices and len(sel.base or ()) <= EXACT_CACHED_MAX_ROWS
            if sel.kept <= (EXACT_MAX_ROWS if sel.base is not None else TIME_ONLY_EXACT_MAX_ROWS) or cached:
                self._plan("exact")
                return self._exact(sel.key, sel.d, sel.base, sel.rows, embedding, k)
            if (team, kind) not in self.view.clustered and sel.total > UNFILTERED_EXACT_MAX_ROWS:
                self.builds.start(team, kind, sel.d)  # for the next searches
            found = self._clustered_filtered(sel, embedding, k)
        if found is not None:
            self._plan("clusters+mask")
            return found
        found = self._overfetch(sel, embedding, k)
        if found is not None:
            self._plan("overfetch")
            return found
        if sel.fits:
            with self.view.lock:
                self._plan("exact")
                return self._exact(sel.key, sel.d, sel.base, sel.rows, embedding, k)
        self._plan("where")
        return self._chroma(team, kind, embedding, k, flt)

    def _select(self, team: str, kind: str, flt: VectorFilter) -> _Selection:
        """Count what the filter keeps (its time window's rows are listed only when that is cheap to
        need: a window, no agent/tag filter, or few rows). The caller holds the lock."""
        d = self.view.directory(team, kind)
        base = d.select(flt)
        rows = d.rows(base, flt) if flt.timed or base is None or len(base) <= EXACT_MAX_ROWS else None
        kept = len(rows) if rows is not None else len(base or ())
        return _Selection(team, kind, flt, d, base, rows, kept, d.live)

    def _clustered_filtered(self, sel: _Selection, embedding: np.ndarray, k: int) -> Found | None:
        """The k nearest rows that pass the filter, through the clustered index: every probed cluster is
        scored and the filter applied as a mask before the top k are taken, so no over-fetched list is
        built and checked item by item. None when there is no index, or when even a wider probe finds
        fewer than k (the filter's rows sit outside the clusters near the query). Caller holds the lock."""
        index = self.view.clustered.current((sel.team, sel.kind), sel.d.alive)
        if index is None:
            return None
        allowed = sel.d.mask(sel.flt)
        for widen in (1, CLUSTER_WIDEN):
            found = index.search(embedding, k, allowed, widen=widen)
            if len(found) >= min(k, sel.kept):
                return [(sel.d.ids[r], similarity) for r, similarity in found]
        return None

    def _overfetch(self, sel: _Selection, embedding: np.ndarray, k: int) -> Found | None:
        """Ask HNSW for more than k and keep what passes the filter; None when that comes up short.

        Items of one agent or tag often sit together in vector space, so an over-fetch can come up short:
        then the caller searches the filter's vectors exactly if they fit (a second, larger over-fetch is
        tried first when they do not), else asks Chroma's `where`."""
        want = min(sel.total, math.ceil(k * sel.total / sel.kept * OVERFETCH_FACTOR))
        attempts = [(want, max(1, k // 2))]
        if not sel.fits:
            attempts.append((min(sel.total, max(want * 4, OVERFETCH_MAX)), 1))
        for attempt, need in attempts:
            if attempt > OVERFETCH_MAX:
                break
            if (sel.team, sel.kind) in self.view.clustered:
                break  # it came up short even on a wider probe: over-fetching would not find more
            near = self._chroma(sel.team, sel.kind, embedding, attempt)
            with self.view.lock:
                passed = [(item_id, s) for item_id, s in near if sel.d.passes(item_id, sel.base, sel.flt)]
            if len(passed) >= min(need, sel.kept) or attempt >= sel.total:
                return passed[:k]
        return None

    def _exact(
        self,
        key: FilterKey,
        d: Directory,
        base: set[int] | None,
        rows: np.ndarray | None,
        embedding: np.ndarray,
        k: int,
        whole: bool = False,
    ) -> Found:
        """Cosine by matrix product over the filter's rows (unit vectors); `rows` None means all of `base`.

        An agent/tag filter's vectors, and a small team's (`whole`), are cached (kept current by writes and
        forgets; a time window only masks them); a small time window alone fetches its rows' vectors each time.
        """
        team, kind = key[0], key[1]
        matrices = self.view.matrices
        if whole or (base is None and key in matrices) or (base is not None and len(base) <= EXACT_FALLBACK_ROWS):
            matrix = matrices.use(key)
            if matrix is None:
                source = rows if whole else np.fromiter(base or (), np.int64, len(base or ()))
                assert source is not None  # `whole` always comes with its rows
                matrix = matrices.put(key, self._fetch(team, kind, d, source))
        else:
            assert rows is not None  # a time window alone: its rows were listed
            matrix = self._fetch(team, kind, d, rows)
        return nearest(matrix, rows, embedding, k, d.ids)

    # -- background ------------------------------------------------------------------------------------

    def hubness(self, team: str, kind: str, ids: list[str]) -> np.ndarray:
        """Each item's hubness score (`hubness`), NaN where there is none yet; starts a refresh when due
        (`hub_scores`: in the background, never on the caller's thread)."""
        if self.vectors.shared or not self.view.loaded(team, kind):
            return np.full(len(ids), np.nan, dtype=np.float32)
        with self.view.lock:
            d = self.view.directories[(team, kind)]
            if self.hub_scores.due((team, kind), d):
                small = d.live <= UNFILTERED_EXACT_MAX_ROWS
                if small or (team, kind) in self.view.clustered:  # a large team waits for its clustered index
                    prepare = partial(prepare_pass, self.view, self._fetch, (team, kind), d, small)
                    self.hub_scores.start((team, kind), d, prepare)
            return self.hub_scores.of((team, kind), d, ids)

    def _load_later(self, team: str, kind: str) -> None:
        """Load the team's directory, then start its clustered index if it is large, in the background."""
        with self.view.lock:
            if (team, kind) in self._loading:
                return
            self._loading.add((team, kind))
        if not self.background.submit(self._load, team, kind):
            with self.view.lock:
                self._loading.discard((team, kind))  # stopping: Chroma answers meanwhile

    def _load(self, team: str, kind: str) -> None:
        try:
            with self.view.lock:
                d = self.view.directory(team, kind)
                if d.live > UNFILTERED_EXACT_MAX_ROWS:
                    self.builds.start(team, kind, d)
        except Exception:  # noqa: BLE001 - the next search tries to load it again
            log.exception("could not load the vector directory of a team")
        finally:
            with self.view.lock:
                self._loading.discard((team, kind))
