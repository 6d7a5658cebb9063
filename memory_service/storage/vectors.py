"""Chroma behind a small interface: one collection per team, ids we choose.

- One collection per team and kind (passage | fact), so the hot path never pays for a `where`
  filter over other teams' rows (a bug in a filter can't leak across teams), and passages and
  facts each get a full candidate list instead of crowding each other out of one.
- We always pass embeddings: Chroma's own embedding function would try a hub download.
- Deterministic ids + `upsert`, so a batch replayed after a crash stores nothing twice.
- The service runs the embedded store in a child process of its own (`process=True`, see
  `chroma_process`; on by default through `MEMORY_CHROMA_PROCESS`): chromadb's calls hold Python's
  lock, and requests must not wait behind them. The class's own default is in-process, for the
  one-shot commands (reindex, restore) that have no requests to keep waiting.
- Embedded `PersistentClient` allows one writer process per path; pointing
  `MEMORY_CHROMA_URL` at a Chroma server is the multi-process deployment. Its client gets a
  heartbeat at start-up (an unreachable server is one clear error, not a traceback mid-request)
  and, on every request, a total deadline, a capped answer and a bounded share of the threads
  (`chroma_http`; chromadb's own HTTP client waits for ever).
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .chroma_http import BoundedTransport, ChromaServerFault
from .chroma_process import CALL_TIMEOUT_S, ChromaProcess, chroma_settings

MAX_BATCH = 5000  # Chroma refuses more than 5,461 rows per call
CONNECT_TIMEOUT_S = 5.0  # the heartbeat at start-up, in all
MAX_REPLY_BYTES = 256 << 20  # MEMORY_CHROMA_MAX_REPLY_BYTES' default: a get of MAX_BATCH embeddings is ~40 MB


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


KINDS = ("passage", "fact", "consolidated")


class VectorListener(Protocol):
    def upserted(self, team: str, items: list[VectorItem]) -> None: ...

    def deleted(self, team: str, ids: list[str]) -> None: ...


class ChromaUnreachable(RuntimeError):
    """The Chroma server named by MEMORY_CHROMA_URL does not answer; the message says what to do."""


def collection_name(team: str, kind: str) -> str:
    return f"team_{hashlib.sha256(team.encode()).hexdigest()[:40]}_{kind}"


OUR_COLLECTION = re.compile(r"^team_[0-9a-f]{40}_(passage|fact|consolidated)$")


def kind_of_id(item_id: str) -> str:
    if item_id.startswith("c:"):
        return "consolidated"
    return "fact" if item_id.startswith("f:") else "passage"


def tag_key(tag: str) -> str:
    return "tag:" + tag


class VectorStore:
    def __init__(
        self,
        path: Path | None = None,
        *,
        url: str | None = None,
        process: bool = False,
        call_timeout_s: float = CALL_TIMEOUT_S,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ) -> None:
        if url:
            self._client = _http_client(url, call_timeout_s, max_reply_bytes)
        else:
            assert path is not None
            path.mkdir(parents=True, exist_ok=True)
            if process:  # chromadb is imported by the child only
                self._client = ChromaProcess(path, call_timeout_s=call_timeout_s)
            else:
                import chromadb

                self._client = chromadb.PersistentClient(path=str(path), settings=chroma_settings())
        # the child's store is the embedded one, whose limit is known: asking would wait for it to start
        self._batch = MAX_BATCH if process and not url else min(MAX_BATCH, _max_batch(self._client))
        # a server is written by other processes too: caches of its vectors in this one cannot be kept current
        self.shared = bool(url)
        self._collections: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()
        self._listeners: list[VectorListener] = []

    @property
    def child_pid(self) -> int | None:
        """The pid of the child serving the embedded store (`process=True`), else None: for operators' dumps."""
        return self._client.pid if isinstance(self._client, ChromaProcess) else None

    def add_listener(self, listener: VectorListener) -> None:
        """Told of every upsert and delete after it is applied: what keeps caches of vectors consistent."""
        self._listeners.append(listener)

    def _collection(self, team: str, kind: str) -> Any:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}")
        with self._lock:
            coll = self._collections.get((team, kind))
            if coll is None:
                coll = self._client.get_or_create_collection(
                    collection_name(team, kind), metadata={"hnsw:space": "cosine"}, embedding_function=None
                )
                self._collections[(team, kind)] = coll
            return coll

    def upsert(self, team: str, items: list[VectorItem]) -> None:
        """Each item goes to the collection of its `metadata["kind"]`."""
        for kind in KINDS:
            of_kind = [i for i in items if i.metadata.get("kind", "passage") == kind]
            if not of_kind:
                continue
            coll = self._collection(team, kind)
            for start in range(0, len(of_kind), self._batch):
                batch = of_kind[start : start + self._batch]
                coll.upsert(
                    ids=[i.id for i in batch],
                    embeddings=np.stack([i.embedding for i in batch]),
                    documents=[i.text for i in batch],
                    metadatas=[i.metadata for i in batch],
                )
        for listener in self._listeners:
            listener.upserted(team, items)

    def delete(self, team: str, ids: list[str]) -> None:
        for kind in KINDS:
            of_kind = [i for i in ids if kind_of_id(i) == kind]
            for start in range(0, len(of_kind), self._batch):
                self._collection(team, kind).delete(ids=of_kind[start : start + self._batch])
        for listener in self._listeners:
            listener.deleted(team, ids)

    def query(
        self,
        team: str,
        embedding: np.ndarray,
        k: int,
        where: dict[str, Any] | None = None,
        kind: str | None = None,
        *,
        payload: bool = True,
    ) -> list[VectorHit]:
        """The k nearest items of one kind, or of both merged by similarity when `kind` is None.

        `payload=False` returns ids and similarities only (empty text and metadata): about half the cost,
        for callers that read the items from the journal anyway.
        """
        if kind is None:
            merged = [h for one in KINDS for h in self.query(team, embedding, k, where, one, payload=payload)]
            return sorted(merged, key=lambda h: h.similarity, reverse=True)[:k]
        include = ["documents", "metadatas", "distances"] if payload else ["distances"]
        result = self._collection(team, kind).query(
            query_embeddings=[embedding],
            n_results=k,
            where=where or None,
            include=include,
        )
        ids, dists = result["ids"][0], result["distances"][0]
        docs = result["documents"][0] if payload else [""] * len(ids)
        metas = result["metadatas"][0] if payload else [None] * len(ids)
        return [
            VectorHit(id=id_, text=doc or "", similarity=1.0 - float(dist), metadata=dict(meta or {}))
            for id_, doc, meta, dist in zip(ids, docs, metas, dists)
        ]

    def embeddings(self, team: str, kind: str, ids: list[str]) -> dict[str, np.ndarray]:
        """The stored vectors of these ids (ids with none are left out)."""
        out: dict[str, np.ndarray] = {}
        for start in range(0, len(ids), self._batch):
            got = self._collection(team, kind).get(ids=ids[start : start + self._batch], include=["embeddings"])
            for id_, vec in zip(got["ids"], got["embeddings"]):
                out[id_] = np.asarray(vec, dtype=np.float32)
        return out

    def size(self, team: str, kind: str) -> int:
        return self._collection(team, kind).count()

    def count(self, team: str) -> int:
        return sum(self._collection(team, kind).count() for kind in KINDS)

    def close(self) -> None:
        """Let go of the client: an embedded store's files are closed once no client in this process uses them."""
        close = getattr(self._client, "close", None)
        if close is not None:
            close()
        self._collections.clear()

    def collection_names(self) -> list[str]:
        """The names of this service's collections in the store (other collections are left out)."""
        return sorted(c.name for c in self._client.list_collections() if OUR_COLLECTION.match(c.name))

    def drop(self, team: str | None = None) -> int:
        """Delete the collections of `team` (of every team when None), for a rebuild; returns how many."""
        names = [collection_name(team, kind) for kind in KINDS] if team is not None else self.collection_names()
        present = set(self.collection_names())
        with self._lock:
            for name in names:
                if name in present:
                    self._client.delete_collection(name)
            self._collections = {
                key: coll for key, coll in self._collections.items() if team is not None and key[0] != team
            }
        return len(present.intersection(names))


def probe_server(url: str) -> tuple[str, int, bool]:
    """(host, port, ssl) of the Chroma server at `url` once its heartbeat answers; `ChromaUnreachable` if not."""
    from urllib.parse import urlparse

    import httpx

    parsed = urlparse(url)
    host, ssl = parsed.hostname or "127.0.0.1", parsed.scheme == "https"
    port = parsed.port or (443 if ssl else 8000)
    transport = BoundedTransport(url, total_s=CONNECT_TIMEOUT_S, max_reply_bytes=64 << 10, slots=1)
    try:
        with httpx.Client(transport=transport, timeout=CONNECT_TIMEOUT_S, trust_env=False) as http:
            response = http.get(f"{parsed.scheme}://{host}:{port}/api/v2/heartbeat")
            response.raise_for_status()
    except (httpx.HTTPError, ChromaServerFault) as exc:
        why = (
            f"HTTP {exc.response.status_code}"
            if isinstance(exc, httpx.HTTPStatusError)
            else (str(exc) or type(exc).__name__)
        )
        raise ChromaUnreachable(
            f"no Chroma server answers at MEMORY_CHROMA_URL={url} ({why}): start it (chroma run --path DIR "
            f"--port {port}), fix the URL, or unset MEMORY_CHROMA_URL to use the embedded store in the data dir"
        ) from None
    return host, port, ssl


def _http_client(url: str, call_timeout_s: float, max_reply_bytes: int) -> Any:
    """A client of the Chroma server at `url`, after its heartbeat answered, whose every request goes through a
    `BoundedTransport`: a total deadline of `call_timeout_s` (plus an upload's allowance), a capped answer."""
    import chromadb
    import httpx

    host, port, ssl = probe_server(url)
    try:
        client = chromadb.HttpClient(host=host, port=port, ssl=ssl, settings=chroma_settings())
    except ValueError as exc:  # chromadb's words for a server that went away or lacks the default tenant
        raise ChromaUnreachable(f"the Chroma server at MEMORY_CHROMA_URL={url} refused the client: {exc}") from None
    server = getattr(client, "_server", None)
    session = getattr(server, "_session", None)
    if not isinstance(session, httpx.Client):  # a chromadb whose client we do not know: refuse, never run unbounded
        raise ChromaUnreachable(f"this chromadb's HTTP client cannot be given a deadline ({type(server).__name__})")
    transport = BoundedTransport(url, total_s=call_timeout_s, max_reply_bytes=max_reply_bytes)
    server._session = httpx.Client(  # type: ignore[union-attr]
        transport=transport, headers=session.headers, timeout=call_timeout_s, trust_env=False
    )
    session.close()
    return client


def _max_batch(client: Any) -> int:
    """The most rows the store takes in one call (a server may allow fewer than the embedded store)."""
    try:
        return int(client.get_max_batch_size())
    except Exception:  # an older client without the call: the embedded limit
        return MAX_BATCH
