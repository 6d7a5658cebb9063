"""Chroma behind a small interface: one collection per team, ids we choose.

- One collection per team, so the hot path never pays for a `where` filter over
  other teams' rows (and a bug in a filter can't leak across teams).
- We always pass embeddings: Chroma's own embedding function would try a hub download.
- Deterministic ids + `upsert`, so a batch replayed after a crash stores nothing twice.
- Embedded `PersistentClient` allows one writer process per path; pointing
  `MEMORY_CHROMA_URL` at a Chroma server is the multi-process deployment.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAX_BATCH = 5000  # Chroma refuses more than 5,461 rows per call


@dataclass
class VectorItem:
    id: str
    text: str
    embedding: np.ndarray
    metadata: dict[str, Any]


@dataclass
class VectorHit:
    id: str
    text: str
    similarity: float
    metadata: dict[str, Any]


def collection_name(team: str) -> str:
    return "team_" + hashlib.sha256(team.encode()).hexdigest()[:40]


def tag_key(tag: str) -> str:
    return "tag:" + tag


class VectorStore:
    def __init__(self, path: Path | None = None, *, url: str | None = None) -> None:
        import chromadb
        from chromadb.config import Settings as ChromaSettings

        chroma_settings = ChromaSettings(anonymized_telemetry=False, allow_reset=False)
        if url:
            from urllib.parse import urlparse

            parsed = urlparse(url)
            self._client = chromadb.HttpClient(
                host=parsed.hostname or "127.0.0.1", port=parsed.port or 8000,
                ssl=parsed.scheme == "https", settings=chroma_settings,
            )
        else:
            assert path is not None
            path.mkdir(parents=True, exist_ok=True)
            self._client = chromadb.PersistentClient(path=str(path), settings=chroma_settings)
        self._collections: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _collection(self, team: str) -> Any:
        with self._lock:
            coll = self._collections.get(team)
            if coll is None:
                coll = self._client.get_or_create_collection(
                    collection_name(team), metadata={"hnsw:space": "cosine"}, embedding_function=None
                )
                self._collections[team] = coll
            return coll

    def upsert(self, team: str, items: list[VectorItem]) -> None:
        coll = self._collection(team)
        for start in range(0, len(items), MAX_BATCH):
            batch = items[start:start + MAX_BATCH]
            coll.upsert(
                ids=[i.id for i in batch],
                embeddings=np.stack([i.embedding for i in batch]),
                documents=[i.text for i in batch],
                metadatas=[i.metadata for i in batch],
            )

    def delete(self, team: str, ids: list[str]) -> None:
        if ids:
            self._collection(team).delete(ids=ids)

    def query(self, team: str, embedding: np.ndarray, k: int, where: dict[str, Any] | None = None) -> list[VectorHit]:
        coll = self._collection(team)
        result = coll.query(
            query_embeddings=[embedding], n_results=k, where=where or None,
            include=["documents", "metadatas", "distances"],
        )
        hits = []
        for id_, doc, meta, dist in zip(
            result["ids"][0], result["documents"][0], result["metadatas"][0], result["distances"][0]
        ):
            hits.append(VectorHit(id=id_, text=doc or "", similarity=1.0 - float(dist), metadata=dict(meta or {})))
        return hits

    def count(self, team: str) -> int:
        return self._collection(team).count()
