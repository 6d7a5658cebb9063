"""A stand-in embedder for recall tests that need many vectors fast and a meaning they can predict.

Each word gets one fixed random unit vector (seeded by its sha256); a text is the normalised sum of its
words' vectors, so texts sharing words are similar and unrelated ones nearly orthogonal. The real embedder
is exercised by the service tests; these test what recall does with the vectors, not the vectors.
"""

from __future__ import annotations

import hashlib

import numpy as np

from memory_service.contract.text import normalize


class WordEmbedder:
    """Sum of one fixed random unit vector per word, normalised: shared words mean similar vectors."""

    def __init__(self, dimensions: int = 384) -> None:
        self.dimensions = dimensions
        self._words: dict[str, np.ndarray] = {}

    def _word(self, word: str) -> np.ndarray:
        if word not in self._words:
            seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "little")
            self._words[word] = np.random.default_rng(seed).normal(size=self.dimensions).astype(np.float32)
        return self._words[word]

    def embed(self, texts: list[str]) -> np.ndarray:
        out = []
        for text in texts:
            vec = sum((self._word(w) for w in normalize(text).split()), np.zeros(self.dimensions, np.float32))
            out.append(vec / (np.linalg.norm(vec) or 1.0))
        return np.array(out, dtype=np.float32).reshape(len(texts), self.dimensions)

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]
