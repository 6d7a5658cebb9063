"""Recent query vectors, so a repeated query skips the embedder (agents repeat queries; embedding is ~5 ms)."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from ..embedding.embedder import Embedder

QUERY_CACHE_SIZE = 1024


class QueryEmbeddings:
    """A small LRU of one embedder's query vectors by text, shared by every recall that holds it.

    Services owns one for the service's life; a one-shot caller (a script, a test) may make its own.
    """

    def __init__(self, embedder: Embedder, size: int = QUERY_CACHE_SIZE) -> None:
        self.embedder = embedder
        self._size = size
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def vector(self, text: str) -> np.ndarray:
        """The text's vector (read-only: shared by every recall of the same text)."""
        with self._lock:
            vector = self._vectors.get(text)
            if vector is not None:
                self._vectors.move_to_end(text)
                return vector
        vector = self.embedder.embed_one(text)  # outside the lock: other queries are not held up
        vector.flags.writeable = False
        with self._lock:
            self._vectors[text] = vector
            while len(self._vectors) > self._size:
                self._vectors.popitem(last=False)
        return vector
