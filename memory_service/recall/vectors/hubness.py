"""Hubness: how close an item sits to everything else of its team, so recall can discount it.

In a small sentence-embedding space some items are near every query: short, generic texts that mostly
name a person ("Maria is a family member", "John is stumped about something"). Raw cosine ranks them
above the item that answers the question. The correction is the one known as CSLS (cross-domain
similarity local scaling): an item's hubness `r(x)` is its mean cosine to its `NEIGHBOURS` nearest items
of the same team and kind, and the vector leg ranks by `cos(q, x) - r(x) / 2` instead of `cos(q, x)`.

On the LoCoMo dev conversations (same stored facts, only the ranking changed) it raised default recall@10
from 0.764 to 0.787 and 0.737 to 0.743, facts-only from 0.713 to 0.762 and 0.708 to 0.711, and multi-hop
questions from 0.618 to 0.634 and 0.412 to 0.456.

Scores are computed off the request path (see `FilteredVectors`), from vectors already in memory:
- a team of up to a few thousand vectors: exactly, in blocks;
- a larger team: within each cluster of its clustered index (its members are each other's nearest
  neighbours, nearly always), about half a second at 100k vectors.

Only the team's own vectors enter a score (its clusters too are built from them alone), and a pass is due
when the team itself grew: another team's saves cannot move this team's ranking (tests/
test_team_isolation_scores.py). One input is shared: the clustered indexes' memory budget, all teams
(`CLUSTERED_BYTES_MAX`, ~650k vectors). Past it a team of over 5,000 vectors keeps Chroma's search and
goes without hubness: that tells it only that the store's large teams together are that big, never what
another team holds.
"""

from __future__ import annotations

import numpy as np

NEIGHBOURS = 10  # CSLS's usual neighbourhood
WEIGHT = 0.5  # cos(q, x) - WEIGHT * r(x): CSLS's ranking (2 cos - r(x) - r(q), r(q) the same for all x)
BLOCK_ROWS = 1024  # rows scored at once: a bounded score matrix (1024 x n floats)


def exact(vectors: np.ndarray) -> np.ndarray:
    """r(x) for every row: mean cosine to its nearest other rows (unit vectors), exactly."""
    n = len(vectors)
    out = np.zeros(n, dtype=np.float32)
    if n < 2:
        return out
    k = min(NEIGHBOURS, n - 1)
    for start in range(0, n, BLOCK_ROWS):
        block = vectors[start : start + BLOCK_ROWS] @ vectors.T
        block[np.arange(len(block)), np.arange(start, start + len(block))] = -np.inf  # not its own neighbour
        out[start : start + len(block)] = np.partition(-block, k - 1, axis=1)[:, :k].mean(axis=1) * -1
    return out


def clustered(vectors: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """r(x) with neighbours sought in x's own cluster only (`vectors` grouped, cluster c at
    offsets[c]:offsets[c + 1]); a row alone in its cluster gets 0 (no discount)."""
    out = np.zeros(len(vectors), dtype=np.float32)
    for c in range(len(offsets) - 1):
        lo, hi = int(offsets[c]), int(offsets[c + 1])
        out[lo:hi] = exact(vectors[lo:hi])
    return out


def rerank(found: list[tuple[str, float]], scores: np.ndarray, keep: int) -> list[tuple[str, float]]:
    """The vector leg's (id, cosine) list ordered by cos - WEIGHT * r, the first `keep`; cosines unchanged.

    `scores`: r per item, NaN where not computed yet (an item saved since the last pass): it takes the
    median of the others, so it is neither favoured nor buried."""
    if not found:
        return found
    known = scores[~np.isnan(scores)]
    if not len(known):
        return found[:keep]
    filled = np.where(np.isnan(scores), np.median(known), scores)
    adjusted = np.fromiter((similarity for _, similarity in found), np.float64, len(found)) - WEIGHT * filled
    order = np.argsort(-adjusted, kind="stable")[:keep]
    return [found[i] for i in order]
