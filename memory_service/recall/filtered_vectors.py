"""Filtered vector search, planned by how many of the team's vectors the filter keeps.

Chroma's own `where` scans metadata in SQLite on every query (about 100 ms for one agent at 100k facts).
Instead each team keeps a directory of its vectors (id, agent, tags, time), loaded once from the journal
and kept current by the vector store's upserts and deletes, so the number of rows a filter keeps is
counted, not guessed:

- no filter: up to `UNFILTERED_EXACT_MAX_ROWS` vectors, exact search over all of them (cached); past
  that, an in-process clustered index (`vector_clusters`), built in the background the first time the
  team is searched; until it is ready, or when it would not fit `CLUSTERED_BYTES_MAX`, Chroma's HNSW.
  Chroma's query costs ~3.5 ms however small the collection; these cost well under one;
- the filter keeps few rows (one agent's items): exact search, a matrix product over just their
  vectors, fetched from Chroma once and cached (a write or forget updates the cache);
- it keeps many: over-fetch from HNSW and keep the matching ids; when that comes up short (one agent's
  items often sit together in vector space), exact search too, its vectors cached from then on;
- a filter too big to cache whose over-fetches come up short: Chroma's `where` query, as before.

The cached vectors are bounded (`CACHE_BYTES_MAX`, least recently used filters go first).

Forgotten items are dropped by recall against the journal whatever path found them; the directory and
cache also drop them when their vectors are deleted.

A Chroma server (MEMORY_CHROMA_URL) is written by other processes too, whose writes this process never
hears of: there a filtered search always asks Chroma's `where`, which sees every write.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memory_service.embedding.embedder import DIMENSIONS
from memory_service.pipeline.passages import window_starts
from memory_service.recall import hubness
from memory_service.recall.clusters import ClusteredVectors, scores
from memory_service.storage.consolidation import store_for
from memory_service.storage.journal import DELETED, Journal
from memory_service.storage.vectors import KINDS, VectorItem, VectorStore, kind_of_id, tag_key

log = logging.getLogger("memory_service")

EXACT_MAX_ROWS = 5000  # exact search up to here: 5000 x 384 floats is well under a millisecond to score
OVERFETCH_MAX = 1000  # the most HNSW results asked for when post-filtering
OVERFETCH_FACTOR = 2.0  # margin on k / share
CACHE_BYTES_MAX = 96 << 20  # vectors kept for exact search, all teams; least recently used go first
TIME_ONLY_EXACT_MAX_ROWS = 256  # a time window alone is not cached: its vectors are fetched per search
EXACT_FALLBACK_ROWS = 50_000  # a bigger filter whose over-fetch came up short: exact too, and cached
EXACT_CACHED_MAX_ROWS = 15_000  # once cached, exact beats a large over-fetch up to about here
REPLAY_EVENTS = 4096  # writes remembered for a team whose directory is not loaded yet
UNFILTERED_EXACT_MAX_ROWS = 5000  # no filter: exact search over the whole team up to here (~0.5 ms)
CLUSTERED_BYTES_MAX = 1 << 30  # clustered indexes, all teams (~650k vectors); past it, Chroma's HNSW
BUILD_RETRY_S = 60.0  # a clustered index whose build failed is tried again after this
TAG_MASKS_MAX = 64  # tag masks kept per team and kind (a byte per row each)
CLUSTER_WIDEN = 4  # a filtered search that finds too few in the probed clusters probes this many times more
HUB_REFRESH_SHARE = 0.1  # hubness scores are computed again once the team's vectors grew by this share
HUB_REFRESH_MIN = 20  # ... and by at least this many

FilterKey = tuple[str, str, str | None, tuple[str, ...]]  # team, kind, agent, tags


@dataclass
class _Matrix:
    """The vectors of one agent/tag filter's rows; writes queue here until the next search folds them in."""

    rows: np.ndarray
    vectors: np.ndarray
    added: dict[int, np.ndarray] = field(default_factory=dict)
    dropped: set[int] = field(default_factory=set)

    def current(self) -> _Matrix:
        if self.added or self.dropped:
            gone = list(self.dropped | set(self.added))
            keep = ~np.isin(self.rows, gone)
            rows, vectors = [self.rows[keep]], [self.vectors[keep]] if len(self.rows) else []
            if self.added:
                rows.append(np.fromiter(self.added, dtype=np.int64, count=len(self.added)))
                vectors.append(np.stack(list(self.added.values())))
            self.rows = np.concatenate(rows)
            self.vectors = np.concatenate(vectors) if vectors else np.zeros((0, 0), np.float32)
            self.added, self.dropped = {}, set()
        return self

    @property
    def nbytes(self) -> int:
        return self.vectors.nbytes


@dataclass
class _Hubness:
    """One team and kind's hubness scores by directory row (NaN: not computed yet), and when they were."""

    scores: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    live_at: int = -1  # vectors the team had when they were computed; -1: never
    running: bool = False


@dataclass(frozen=True)
class VectorFilter:
    agent_id: str | None = None
    tags: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None

    def __bool__(self) -> bool:
        return bool(self.agent_id or self.tags or self.since is not None or self.until is not None)

    def where(self) -> dict[str, Any] | None:
        """The same filter as a Chroma `where` clause (the fallback path)."""
        clauses: list[dict[str, Any]] = []
        if self.agent_id:
            clauses.append({"agent_id": self.agent_id})
        clauses += [{tag_key(tag): True} for tag in self.tags]
        if self.since is not None:
            clauses.append({"created_at": {"$gte": self.since}})
        if self.until is not None:
            clauses.append({"created_at": {"$lte": self.until}})
        if not clauses:
            return None
        return clauses[0] if len(clauses) == 1 else {"$and": clauses}


@dataclass
class _Directory:
    """The vectors of one team and kind: row number per id, and the sets a filter intersects."""

    ids: list[str] = field(default_factory=list)
    row: dict[str, int] = field(default_factory=dict)
    agent: list[str] = field(default_factory=list)
    tags: list[tuple[str, ...]] = field(default_factory=list)
    created: np.ndarray = field(default_factory=lambda: np.zeros(1024))
    alive: np.ndarray = field(default_factory=lambda: np.zeros(1024, dtype=bool))
    by_agent: dict[str, set[int]] = field(default_factory=dict)
    by_tag: dict[str, set[int]] = field(default_factory=dict)
    live: int = 0
    # the same filters as arrays over the rows, for the clustered index: an agent's code per row, and a
    # mask per tag a search has asked for (kept current from then on; the least recently asked go first)
    agent_code: np.ndarray = field(default_factory=lambda: np.zeros(1024, dtype=np.int32))
    codes: dict[str, int] = field(default_factory=dict)
    tag_masks: collections.OrderedDict[str, np.ndarray] = field(default_factory=collections.OrderedDict)

    def add(self, item_id: str, agent: str, tags: tuple[str, ...], created_at: float) -> int:
        self.remove(item_id)
        r = len(self.ids)
        if r >= len(self.created):
            self.created = np.concatenate([self.created, np.zeros(len(self.created))])
            self.alive = np.concatenate([self.alive, np.zeros(len(self.alive), dtype=bool)])
            self.agent_code = np.concatenate([self.agent_code, np.zeros(len(self.agent_code), dtype=np.int32)])
            for tag, mask in self.tag_masks.items():
                self.tag_masks[tag] = np.concatenate([mask, np.zeros(len(mask), dtype=bool)])
        self.ids.append(item_id)
        self.agent.append(agent)
        self.tags.append(tags)
        self.row[item_id] = r
        self.created[r] = created_at
        self.alive[r] = True
        self.agent_code[r] = self.codes.setdefault(agent, len(self.codes) + 1)
        self.by_agent.setdefault(agent, set()).add(r)
        for tag in tags:
            self.by_tag.setdefault(tag, set()).add(r)
            if tag in self.tag_masks:
                self.tag_masks[tag][r] = True
        self.live += 1
        return r

    def remove(self, item_id: str) -> None:
        r = self.row.pop(item_id, None)
        if r is None:
            return
        self.alive[r] = False
        self.by_agent[self.agent[r]].discard(r)
        for tag in self.tags[r]:
            self.by_tag[tag].discard(r)
            if tag in self.tag_masks:
                self.tag_masks[tag][r] = False
        self.live -= 1

    def mask(self, flt: VectorFilter) -> np.ndarray:
        """Live rows that pass the whole filter, as a boolean array over the rows (~0.1 ms at 100k)."""
        keep = self.alive.copy()
        if flt.agent_id:
            keep &= self.agent_code == self.codes.get(flt.agent_id, -1)
        for tag in flt.tags:
            keep &= self._tag_mask(tag)
        if flt.since is not None:
            keep &= self.created >= flt.since
        if flt.until is not None:
            keep &= self.created <= flt.until
        return keep

    def _tag_mask(self, tag: str) -> np.ndarray:
        mask = self.tag_masks.get(tag)
        if mask is None:
            mask = np.zeros(len(self.alive), dtype=bool)
            mask[np.fromiter(self.by_tag.get(tag, ()), dtype=np.int64)] = True
            self.tag_masks[tag] = mask
            while len(self.tag_masks) > TAG_MASKS_MAX:
                self.tag_masks.popitem(last=False)
        self.tag_masks.move_to_end(tag)
        return mask

    def select(self, flt: VectorFilter) -> set[int] | None:
        """Rows that pass the agent and tag filters (None: no such filter, every row); time is separate."""
        sets = ([self.by_agent.get(flt.agent_id, set())] if flt.agent_id else []) + [
            self.by_tag.get(tag, set()) for tag in flt.tags
        ]
        if not sets:
            return None
        sets.sort(key=len)
        return sets[0].intersection(*sets[1:]) if len(sets) > 1 else sets[0]

    def rows(self, base: set[int] | None, flt: VectorFilter) -> np.ndarray:
        """The rows of `base` (or all live rows) inside the filter's time window."""
        if base is None:
            rows = np.flatnonzero(self.alive[: len(self.ids)])
        else:
            rows = np.fromiter(base, dtype=np.int64, count=len(base))
        if flt.since is not None:
            rows = rows[self.created[rows] >= flt.since]
        if flt.until is not None:
            rows = rows[self.created[rows] <= flt.until]
        return rows

    def passes(self, item_id: str, base: set[int] | None, flt: VectorFilter) -> bool:
        r = self.row.get(item_id)
        if r is None or (base is not None and r not in base):
            return False
        created = self.created[r]
        return not ((flt.since is not None and created < flt.since) or (flt.until is not None and created > flt.until))


class FilteredVectors:
    """Vector search with recall's filters. Make one per vector store, next to it (the service's lifespan
    does): it listens to the store's writes to keep its counts and cached vectors current."""

    def __init__(self, journal: Journal, vectors: VectorStore) -> None:
        self.journal = journal
        self.vectors = vectors
        self._dirs: dict[tuple[str, str], _Directory] = {}
        self._unloaded: dict[str, collections.deque] = {}
        self._matrices: collections.OrderedDict[FilterKey, _Matrix] = collections.OrderedDict()
        self._clustered: dict[tuple[str, str], ClusteredVectors] = {}
        self._building: dict[tuple[str, str], dict[int, np.ndarray]] = {}  # writes during a build
        self._build_failed: dict[tuple[str, str], float] = {}  # when a build last failed: retried later
        self._loading: set[tuple[str, str]] = set()  # (team, kind) directories a thread is loading
        self._hubness: dict[tuple[str, str], _Hubness] = {}
        self._lock = threading.RLock()
        self.last_plan = ""  # for benchmarks and tests: which path the last search took
        self.plans: collections.Counter[str] = collections.Counter()
        vectors.add_listener(self)

    # -- kept current by the vector store --------------------------------------------------------------

    def upserted(self, team: str, items: list[VectorItem]) -> None:
        with self._lock:
            for item in items:
                kind = item.metadata.get("kind", "passage")
                d = self._dirs.get((team, kind))
                if d is None:
                    self._remember(team, ("upsert", item.id, _meta_of(item.metadata)))
                    continue
                old = d.row.get(item.id)
                agent, tags, created_at = _meta_of(item.metadata)
                r = d.add(item.id, agent, tags, created_at)
                for key, matrix in self._matrices_of(team, kind):
                    if old is not None:
                        matrix.dropped.add(old)
                    if _key_matches(key, agent, tags):
                        matrix.added[r] = np.asarray(item.embedding, dtype=np.float32)
                # a clustered index drops the old row by the directory's `alive`, at search
                if (team, kind) in self._clustered:
                    self._clustered[(team, kind)].add(r, item.embedding)
                elif (team, kind) in self._building:
                    self._building[(team, kind)][r] = np.asarray(item.embedding, dtype=np.float32)

    def deleted(self, team: str, ids: list[str]) -> None:
        with self._lock:
            for item_id in ids:
                d = self._dirs.get((team, kind_of_id(item_id)))
                if d is None:
                    self._remember(team, ("delete", item_id, None))
                else:
                    r = d.row.get(item_id)
                    d.remove(item_id)
                    for _, matrix in self._matrices_of(team, kind_of_id(item_id)):
                        if r is not None:
                            matrix.added.pop(r, None)
                            matrix.dropped.add(r)

    def _matrices_of(self, team: str, kind: str) -> list[tuple[FilterKey, _Matrix]]:
        return [(key, m) for key, m in self._matrices.items() if key[0] == team and key[1] == kind]

    def _remember(self, team: str, event: tuple) -> None:
        """A write to a team not loaded yet: replayed on load, in case the journal did not show it then."""
        self._unloaded.setdefault(team, collections.deque(maxlen=REPLAY_EVENTS)).append(event)

    # -- search ----------------------------------------------------------------------------------------

    def search(self, team: str, kind: str, embedding: np.ndarray, k: int, flt: VectorFilter) -> list[tuple[str, float]]:
        """The k nearest (id, similarity) of one kind that pass the filter, best first."""
        if not flt:
            found = None if self.vectors.shared else self._whole_team(team, kind, embedding, k)
            if found is not None:
                return found
            self._plan("hnsw")
            return [(h.id, h.similarity) for h in self.vectors.query(team, embedding, k, kind=kind, payload=False)]
        if self.vectors.shared:
            self._plan("where")
            return [
                (h.id, h.similarity)
                for h in self.vectors.query(team, embedding, k, where=flt.where(), kind=kind, payload=False)
            ]
        with self._lock:
            d = self._directory(team, kind)
            base = d.select(flt)
            timed = flt.since is not None or flt.until is not None
            rows = d.rows(base, flt) if timed or base is None or len(base) <= EXACT_MAX_ROWS else None
            kept, total = (len(rows) if rows is not None else len(base or ())), d.live
            if kept == 0:
                self._plan("empty")
                return []
            key: FilterKey = (team, kind, flt.agent_id, tuple(sorted(flt.tags)))
            cached = key in self._matrices and len(base or ()) <= EXACT_CACHED_MAX_ROWS
            if kept <= (EXACT_MAX_ROWS if base is not None else TIME_ONLY_EXACT_MAX_ROWS) or cached:
                self._plan("exact")
                return self._exact(key, d, base, rows, embedding, k)
        # items of one agent or tag often sit together in vector space, so an over-fetch can come up short:
        # then exact search over the filter's vectors (cached from then on) if they fit, else a larger
        # over-fetch, then Chroma's `where`
        fits = base is not None and len(base) <= EXACT_FALLBACK_ROWS
        with self._lock:
            if (team, kind) not in self._clustered and d.live > UNFILTERED_EXACT_MAX_ROWS:
                self._start_build(team, kind, d)  # for the next searches
            found = self._clustered_filtered(team, kind, d, flt, embedding, k, kept)
        if found is not None:
            self._plan("clusters+mask")
            return found
        want = min(total, math.ceil(k * total / kept * OVERFETCH_FACTOR))
        attempts = [(want, max(1, k // 2))] + ([] if fits else [(min(total, max(want * 4, OVERFETCH_MAX)), 1)])
        for attempt, need in attempts:
            if attempt > OVERFETCH_MAX:
                break
            if (team, kind) in self._clustered:
                break  # it came up short even on a wider probe: over-fetching would not find more
            near = [
                (h.id, h.similarity) for h in self.vectors.query(team, embedding, attempt, kind=kind, payload=False)
            ]
            with self._lock:
                passed = [(item_id, similarity) for item_id, similarity in near if d.passes(item_id, base, flt)]
            if len(passed) >= min(need, kept) or attempt >= total:
                self._plan("overfetch")
                return passed[:k]
        if fits:
            with self._lock:
                self._plan("exact")
                return self._exact(key, d, base, rows, embedding, k)
        self._plan("where")
        return [
            (h.id, h.similarity)
            for h in self.vectors.query(team, embedding, k, where=flt.where(), kind=kind, payload=False)
        ]

    def _plan(self, name: str) -> None:
        self.last_plan = name
        self.plans[name] += 1

    def _whole_team(self, team: str, kind: str, embedding: np.ndarray, k: int) -> list[tuple[str, float]] | None:
        """No filter, in process: exact for a small team, else the clustered index (None: not ready).

        The first search of a team loads its directory on another thread (a second or two at 100k) and is
        answered by Chroma meanwhile, so a service's first recalls after a start do not wait for it.
        """
        if (team, kind) not in self._dirs:  # read without the lock: the loading thread holds it
            self._load_later(team, kind)
            return None
        with self._lock:
            d = self._directory(team, kind)
            if d.live == 0:
                self._plan("empty")
                return []
            if d.live <= UNFILTERED_EXACT_MAX_ROWS:
                self._plan("exact")
                return self._exact(
                    (team, kind, None, ()), d, None, d.rows(None, VectorFilter()), embedding, k, whole=True
                )
            found = self._clustered_search(team, kind, d, embedding, k)
            if found is None:
                self._start_build(team, kind, d)
                return None
            self._plan("clusters")
            return found

    def _clustered_search(
        self, team: str, kind: str, d: _Directory, embedding: np.ndarray, k: int
    ) -> list[tuple[str, float]] | None:
        """The k nearest through the team's clustered index, its pending writes folded in when due; None
        when it has none. Caller holds the lock."""
        index = self._clustered.get((team, kind))
        if index is None:
            return None
        if index.needs_fold():
            index = self._clustered[(team, kind)] = index.folded(d.alive)
        return [(d.ids[r], similarity) for r, similarity in index.search(embedding, k, d.alive)]

    def _clustered_filtered(
        self, team: str, kind: str, d: _Directory, flt: VectorFilter, embedding: np.ndarray, k: int, kept: int
    ) -> list[tuple[str, float]] | None:
        """The k nearest rows that pass the filter, through the clustered index: every probed cluster is
        scored and the filter applied as a mask before the top k are taken, so no over-fetched list is
        built and checked item by item. None when there is no index, or when even a wider probe finds
        fewer than k (the filter's rows sit outside the clusters near the query). Caller holds the lock."""
        index = self._clustered.get((team, kind))
        if index is None:
            return None
        if index.needs_fold():
            index = self._clustered[(team, kind)] = index.folded(d.alive)
        allowed = d.mask(flt)
        for widen in (1, CLUSTER_WIDEN):
            found = index.search(embedding, k, allowed, widen=widen)
            if len(found) >= min(k, kept):
                return [(d.ids[r], similarity) for r, similarity in found]
        return None

    def hubness(self, team: str, kind: str, ids: list[str]) -> np.ndarray:
        """Each item's hubness score (`hubness`), NaN where there is none yet; starts a refresh when due.

        Scores are computed on a thread of their own from vectors this process already holds, never on
        the caller's: until then (a team's first recall, a save since) the scores are NaN or a little old.
        """
        out = np.full(len(ids), np.nan, dtype=np.float32)
        if self.vectors.shared or (team, kind) not in self._dirs:
            return out
        with self._lock:
            d = self._dirs[(team, kind)]
            state = self._hubness.setdefault((team, kind), _Hubness())
            grown = d.live - max(state.live_at, 0)
            due = state.live_at < 0 or grown >= max(HUB_REFRESH_MIN, state.live_at * HUB_REFRESH_SHARE)
            if due and not state.running:
                small = d.live <= UNFILTERED_EXACT_MAX_ROWS
                if small or (team, kind) in self._clustered:  # a large team waits for its clustered index
                    state.running = True
                    threading.Thread(
                        target=self._compute_hubness,
                        args=(team, kind, d, state, small),
                        daemon=True,
                        name=f"vector-hubness-{kind}",
                    ).start()
            scores = state.scores
            for i, item_id in enumerate(ids):
                r = d.row.get(item_id)
                if r is not None and r < len(scores):
                    out[i] = scores[r]
        return out

    def _compute_hubness(self, team: str, kind: str, d: _Directory, state: _Hubness, small: bool) -> None:
        try:
            with self._lock:
                live = d.live
                if small:
                    rows = d.rows(None, VectorFilter())
                    cached = self._matrices.get((team, kind, None, ()))
                    matrix = None
                    if cached is not None:  # its arrays, not the object: a search may fold writes into it
                        cached.current()
                        matrix = _Matrix(cached.rows, cached.vectors)
                else:
                    index = self._clustered[(team, kind)]  # replaced, never changed, by a fold
            if small:
                if matrix is None:  # not searched whole yet: its vectors from the store, outside the lock
                    matrix = self._fetch(team, kind, d, rows)
                have, scores = matrix.rows, hubness.exact(matrix.vectors) if len(matrix.rows) else np.zeros(0)
            else:
                have, scores = index.rows, hubness.clustered(index.vectors, index.offsets)
            with self._lock:
                full = np.full(len(d.alive), np.nan, dtype=np.float32)
                full[have] = scores
                state.scores, state.live_at = full, live
        except Exception:  # noqa: BLE001 - a ranking prior: recall goes on with the scores it has
            log.exception("could not compute the hubness scores of a team's %ss", kind)
            with self._lock:
                state.live_at = d.live  # not tried again on every search
        finally:
            with self._lock:
                state.running = False

    def _load_later(self, team: str, kind: str) -> None:
        """Load the team's directory, then start its clustered index if it is large, on a thread of its own."""
        with self._lock:
            if (team, kind) in self._loading:
                return
            self._loading.add((team, kind))

        def load() -> None:
            try:
                with self._lock:
                    d = self._directory(team, kind)
                    if d.live > UNFILTERED_EXACT_MAX_ROWS:
                        self._start_build(team, kind, d)
            except Exception:  # noqa: BLE001 - the next search loads it in its own thread instead
                log.exception("could not load the vector directory of a team")
            finally:
                with self._lock:
                    self._loading.discard((team, kind))

        threading.Thread(target=load, daemon=True, name="vector-directory").start()

    def _start_build(self, team: str, kind: str, d: _Directory) -> None:
        """Build the team's clustered index on a thread of its own (seconds at 100k), if it fits."""
        if (team, kind) in self._building or time.monotonic() - self._build_failed.get(
            (team, kind), -BUILD_RETRY_S
        ) < BUILD_RETRY_S:
            return
        used = sum(index.nbytes for index in self._clustered.values())
        if used + d.live * DIMENSIONS * 4 > CLUSTERED_BYTES_MAX:
            return
        rows = d.rows(None, VectorFilter())
        self._building[(team, kind)] = {}
        threading.Thread(
            target=self._build, args=(team, kind, d, rows), daemon=True, name=f"vector-clusters-{kind}"
        ).start()

    def _build(self, team: str, kind: str, d: _Directory, rows: np.ndarray) -> None:
        started = time.monotonic()
        try:
            matrix = self._fetch(team, kind, d, rows)  # outside the lock: recall goes on through Chroma
            index = ClusteredVectors.build(matrix.rows, matrix.vectors) if len(matrix.rows) else None
        except Exception:  # noqa: BLE001 - the cache is optional: recall keeps using Chroma
            log.exception("could not build the in-process vector index of a team's %ss", kind)
            index = None
        with self._lock:
            written = self._building.pop((team, kind), {})
            if index is None:  # failed, or no vector written yet: not fetched again on every search
                self._build_failed[(team, kind)] = time.monotonic()
            else:
                index.added.update(written)
                self._clustered[(team, kind)] = index
                log.info(
                    "in-process vector index of %d %ss ready in %.1f s", len(index), kind, time.monotonic() - started
                )

    def clustered_indexes(self) -> int:
        """How many team-kinds are searched through a clustered index (for /metrics and benchmarks)."""
        with self._lock:
            return len(self._clustered)

    def _exact(
        self,
        key: FilterKey,
        d: _Directory,
        base: set[int] | None,
        rows: np.ndarray | None,
        embedding: np.ndarray,
        k: int,
        whole: bool = False,
    ) -> list[tuple[str, float]]:
        """Cosine by matrix product over the filter's rows (unit vectors); `rows` None means all of `base`.

        An agent/tag filter's vectors, and a small team's (`whole`), are cached (kept current by writes and
        forgets; a time window only masks them); a small time window alone fetches its rows' vectors each time.
        """
        team, kind = key[0], key[1]
        if whole or (base is None and key in self._matrices) or (base is not None and len(base) <= EXACT_FALLBACK_ROWS):
            matrix = self._matrices.get(key)
            if matrix is None:
                source = rows if whole else np.fromiter(base or (), np.int64, len(base or ()))
                assert source is not None
                matrix = self._matrices[key] = self._fetch(team, kind, d, source)
                self._evict()
            self._matrices.move_to_end(key)
            matrix = matrix.current()
        else:
            assert rows is not None
            matrix = self._fetch(team, kind, d, rows)
        if not len(matrix.rows):
            return []
        have, sims = matrix.rows, scores(matrix.vectors, np.asarray(embedding, dtype=np.float32))
        if rows is not None and len(have) != len(rows):  # the time window keeps part of the cached rows
            keep = np.isin(have, rows)
            have, sims = have[keep], sims[keep]
        if not len(have):
            return []
        top = np.argpartition(-sims, k - 1)[:k] if len(sims) > k else np.arange(len(sims))
        top = top[np.argsort(-sims[top], kind="stable")]
        return [(d.ids[have[i]], float(sims[i])) for i in top]

    def _fetch(self, team: str, kind: str, d: _Directory, rows: np.ndarray) -> _Matrix:
        """These rows' vectors from Chroma (rows whose vector is not written yet are left out)."""
        got = self.vectors.embeddings(team, kind, [d.ids[r] for r in rows])
        have = [r for r in rows.tolist() if d.ids[r] in got]
        vectors = np.stack([got[d.ids[r]] for r in have]) if have else np.zeros((0, 0), np.float32)
        return _Matrix(np.asarray(have, dtype=np.int64), vectors)

    def _evict(self) -> None:
        while len(self._matrices) > 1 and sum(m.nbytes for m in self._matrices.values()) > CACHE_BYTES_MAX:
            self._matrices.popitem(last=False)

    def _directory(self, team: str, kind: str) -> _Directory:
        d = self._dirs.get((team, kind))
        if d is not None:
            return d
        for one in KINDS:  # both kinds at once: the replayed writes are kept per team
            loaded = _Directory()
            for item_id, agent, tags, created_at in _journal_rows(self.journal, team, one):
                loaded.add(item_id, agent, tags, created_at)
            self._dirs[(team, one)] = loaded
        for op, item_id, meta in self._unloaded.pop(team, ()):
            target = self._dirs[(team, kind_of_id(item_id))]
            if op == "upsert":
                target.add(item_id, *meta)
            else:
                target.remove(item_id)
        return self._dirs[(team, kind)]


def _key_matches(key: FilterKey, agent: str, tags: tuple[str, ...]) -> bool:
    return (key[2] is None or key[2] == agent) and all(tag in tags for tag in key[3])


def _meta_of(meta: dict[str, Any]) -> tuple[str, tuple[str, ...], float]:
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
