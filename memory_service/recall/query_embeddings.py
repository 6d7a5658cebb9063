"""Recent query vectors, so a repeated query skips the embedder (agents repeat queries; embedding is ~5 ms).

Keyed by team and text: a query another team asked a moment ago is embedded again for this one. A shared
key made a team's recall 7 ms instead of 200 ms for a text another team had just asked, which told it
what the other team was asking."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from ..embedding.embedder import Embedder

QUERY_CACHE_SIZE = 1024


class QueryEmbeddings:
    """A small LRU of one embedder's query vectors by (team, text), shared by every recall that holds it.

    Services owns one for the service's life; a one-shot caller (a script, a test) may make its own.
    `hits` and `misses` count look-ups (for tests and diagnosis, never timing).
    """

    def __init__(self, embedder: Embedder, size: int = QUERY_CACHE_SIZE) -> None:
        self.embedder = embedder
        self._size = size
        self._vectors: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def vector(self, team: str, text: str) -> np.ndarray:
        """The text's vector for `team` (read-only: shared by every recall of the same team and text)."""
        key = (team, text)
        with self._lock:
            vector = self._vectors.get(key)
            if vector is not None:
                self._vectors.move_to_end(key)
                self.hits += 1
                return vector
            self.misses += 1
        vector = self.embedder.embed_one(text)  # outside the lock: other queries are not held up
        vector.flags.writeable = False
        with self._lock:
            self._vectors[key] = vector
            while len(self._vectors) > self._size:
                self._vectors.popitem(last=False)
        return vector
