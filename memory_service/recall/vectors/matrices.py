"""Vectors held in memory for exact search: one matrix per agent/tag filter, kept current by writes.

Exact search over a few thousand vectors is a matrix product well under a millisecond, cheaper than
Chroma's query (~3.5 ms however small the collection). Fetching them from Chroma is what costs, so a
filter's vectors are fetched once and cached; writes and forgets queue on the matrix and are folded in
by the next search. The cache is bounded (`CACHE_BYTES_MAX`, least recently used filters go first).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np

from ...storage.vectors import VectorStore
from .clusters import scores
from .directory import Directory

CACHE_BYTES_MAX = 96 << 20  # vectors kept for exact search, all teams; least recently used go first

FilterKey = tuple[str, str, str | None, tuple[str, ...]]  # team, kind, agent, tags


@dataclass
class Matrix:
    """The vectors of one agent/tag filter's rows; writes queue here until the next search folds them in."""

    rows: np.ndarray
    vectors: np.ndarray
    added: dict[int, np.ndarray] = field(default_factory=dict)
    dropped: set[int] = field(default_factory=set)

    def current(self) -> Matrix:
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


def filter_key(team: str, kind: str, agent_id: str | None, tags: tuple[str, ...]) -> FilterKey:
    return (team, kind, agent_id, tuple(sorted(tags)))


def whole_team_key(team: str, kind: str) -> FilterKey:
    return (team, kind, None, ())


class MatrixCache:
    """The cached matrices of every team, least recently used first. The caller holds the search lock."""

    def __init__(self) -> None:
        self._matrices: collections.OrderedDict[FilterKey, Matrix] = collections.OrderedDict()

    def __contains__(self, key: FilterKey) -> bool:
        return key in self._matrices

    def peek(self, key: FilterKey) -> Matrix | None:
        """The matrix without marking it used (for a background pass)."""
        return self._matrices.get(key)

    def use(self, key: FilterKey) -> Matrix | None:
        """The matrix, its queued writes folded in, now the most recently used; None when not cached."""
        matrix = self._matrices.get(key)
        if matrix is None:
            return None
        self._matrices.move_to_end(key)
        return matrix.current()

    def put(self, key: FilterKey, matrix: Matrix) -> Matrix:
        """Cache a newly fetched matrix (the last one in is never the one evicted) and return it current."""
        self._matrices[key] = matrix
        while len(self._matrices) > 1 and sum(m.nbytes for m in self._matrices.values()) > CACHE_BYTES_MAX:
            self._matrices.popitem(last=False)
        return matrix.current()

    def written(
        self, team: str, kind: str, old: int | None, row: int, agent: str, tags: tuple[str, ...], vector: np.ndarray
    ) -> None:
        """An upsert: the old row leaves every matrix of the team's kind, the new one joins those it matches."""
        for key, matrix in self._of(team, kind):
            if old is not None:
                matrix.dropped.add(old)
            if (key[2] is None or key[2] == agent) and all(tag in tags for tag in key[3]):
                matrix.added[row] = np.asarray(vector, dtype=np.float32)

    def deleted(self, team: str, kind: str, row: int) -> None:
        for _, matrix in self._of(team, kind):
            matrix.added.pop(row, None)
            matrix.dropped.add(row)

    def _of(self, team: str, kind: str) -> list[tuple[FilterKey, Matrix]]:
        return [(key, m) for key, m in self._matrices.items() if key[0] == team and key[1] == kind]


def fetch_matrix(vectors: VectorStore, team: str, kind: str, d: Directory, rows: np.ndarray) -> Matrix:
    """These rows' vectors from Chroma (rows whose vector is not written yet are left out)."""
    got = vectors.embeddings(team, kind, [d.ids[r] for r in rows])
    have = [r for r in rows.tolist() if d.ids[r] in got]
    stacked = np.stack([got[d.ids[r]] for r in have]) if have else np.zeros((0, 0), np.float32)
    return Matrix(np.asarray(have, dtype=np.int64), stacked)


def nearest(
    matrix: Matrix, rows: np.ndarray | None, embedding: np.ndarray, k: int, ids: list[str]
) -> list[tuple[str, float]]:
    """The k best (id, cosine) of the matrix (unit vectors) by matrix product, kept to `rows` when given."""
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
    return [(ids[have[i]], float(sims[i])) for i in top]
