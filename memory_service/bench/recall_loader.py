"""Loads the recall benchmark's team straight into a stopped service's data dir: journal rows and vectors.

Facts are loaded through the storage layer while the service is stopped (one writer per
Chroma path): the journal's tables (memories, facts, fact_sources, and through their triggers
the FTS5 keyword index) and Chroma (fact vectors, plus one passage vector per 5-fact memory),
so both legs of recall see the data. Real embeddings would take ~10 min per 100k, so every fact
beyond the pool reuses its pool sentence's vector plus small Gaussian noise, renormalised.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..testbed.stats import latency_summary
from .recall_data import FACTS_PER_MEMORY, SMALL_AGENT, TAGS, TEAM, agent_of, fact_text

if TYPE_CHECKING:
    from ..storage.vectors import VectorItem

NOISE_SIGMA = 0.012  # per dimension on a unit 384-d vector: cosine to the pool vector ~0.97
UPSERT_BATCH = 5000
IN_PROCESS_STEPS = (
    "chroma_query_k30",
    "hnsw_k30_ids_only",
    "chroma_where_agent_2pct_k30",
    "keyword_leg_limit30",
    "keyword_leg_limit30_agent_2pct",
)


class Loader:
    """Adds facts to one team through the journal schema and the VectorStore, from fact index `loaded` on."""

    def __init__(self, data_dir: Path, pool_vectors: np.ndarray, chroma_url: str | None = None) -> None:
        self.data_dir = data_dir
        self.chroma_url = chroma_url  # vectors on a Chroma server instead of the embedded store
        self.pool_vectors = pool_vectors
        self.loaded = 0
        self.load_s = 0.0
        self.epoch = time.time() - 90 * 86400.0
        self.seen: set[str] = set()
        self.rows_in_collection = 0
        self.facts_in_journal = 0

    def load_to(self, total: int) -> None:
        from ..storage.journal import Journal
        from ..storage.vectors import VectorStore

        started = time.monotonic()
        Journal(self.data_dir / "journal.sqlite3").close()  # creates the schema and triggers
        conn = sqlite3.connect(self.data_dir / "journal.sqlite3", isolation_level=None)
        conn.execute("PRAGMA synchronous=OFF")
        vectors = VectorStore(self.data_dir / "chroma", url=self.chroma_url)
        rng = np.random.default_rng(self.loaded + 1)
        now = time.time()
        items: list[VectorItem] = []
        conn.execute("BEGIN")
        for first in range(self.loaded - self.loaded % FACTS_PER_MEMORY, total, FACTS_PER_MEMORY):
            items += self._add_memory(conn, range(first, min(first + FACTS_PER_MEMORY, total)), rng, now)
            if len(items) >= UPSERT_BATCH:
                vectors.upsert(TEAM, items)
                items = []
        conn.execute("COMMIT")
        if items:
            vectors.upsert(TEAM, items)
        self.rows_in_collection = vectors.count(TEAM)
        self.facts_in_journal = conn.execute("SELECT COUNT(*) FROM facts WHERE team = ?", (TEAM,)).fetchone()[0]
        conn.close()
        del vectors
        forget_chroma_clients()
        self.loaded = total
        self.load_s += time.monotonic() - started

    def _add_memory(
        self, conn: sqlite3.Connection, group: range, rng: np.random.Generator, now: float
    ) -> list[VectorItem]:
        """One memory of up to FACTS_PER_MEMORY facts: its journal rows, and the vector items to upsert."""
        from ..storage.vectors import VectorItem, tag_key

        first = group.start
        memory_no = first // FACTS_PER_MEMORY
        memory_id = f"mem_bench{memory_no:09d}"
        agent = agent_of(memory_no)
        tags = [f"project-{memory_no % TAGS}"]
        created = self.epoch + first * 30.0
        texts, vecs = self._fact_vectors(group, rng)
        memory_text = " ".join(texts)
        conn.execute(
            "INSERT OR REPLACE INTO memories (id, team, agent_id, run_id, text, tags, metadata, created_at, "
            "status, attempts, next_attempt_at, deadline_at, finished_at, indexed) "
            "VALUES (?,?,?,NULL,?,?,?,?, 'done', 1, ?, ?, ?, 1)",
            (memory_id, TEAM, agent, memory_text, json.dumps(tags), "{}", created, created, created, created),
        )
        meta = {
            "memory_id": memory_id,
            "agent_id": agent,
            "run_id": "",
            "created_at": created,
            **{tag_key(t): True for t in tags},
        }
        items = self._add_facts(conn, group, texts, vecs, meta, tags, now)
        passage = np.mean(vecs, axis=0)
        items.append(
            VectorItem(
                f"p:{memory_id}:0",
                memory_text,
                passage / np.linalg.norm(passage),
                {**meta, "kind": "passage", "start": 0},
            )
        )
        return items

    def _fact_vectors(self, group: range, rng: np.random.Generator) -> tuple[list[str], list[np.ndarray]]:
        """Each fact's text and vector: its pool sentence's vector, with noise beyond the pool."""
        texts, vecs = [], []
        for i in group:
            text, base = fact_text(i, len(self.pool_vectors))
            vec = self.pool_vectors[base]
            if i >= len(self.pool_vectors):
                vec = vec + rng.normal(0.0, NOISE_SIGMA, vec.shape).astype(np.float32)
                vec = vec / np.linalg.norm(vec)
            texts.append(text)
            vecs.append(vec)
        return texts, vecs

    def _add_facts(
        self,
        conn: sqlite3.Connection,
        group: range,
        texts: list[str],
        vecs: list[np.ndarray],
        meta: dict[str, Any],
        tags: list[str],
        now: float,
    ) -> list[VectorItem]:
        """The facts not loaded before: rows in facts and fact_sources, and their vector items."""
        from ..extraction.grounding import normalize, shape
        from ..pipeline.dedup import fact_id
        from ..storage.vectors import VectorItem

        items = []
        memory_id, agent, created = meta["memory_id"], meta["agent_id"], meta["created_at"]
        for text, vec, i in zip(texts, vecs, group):
            if i < self.loaded:
                continue
            norm = normalize(text)
            fid = fact_id(TEAM, norm)
            if fid in self.seen:  # the same text twice (rare): one fact, as the service would keep it
                continue
            self.seen.add(fid)
            conn.execute(
                "INSERT OR IGNORE INTO facts (id, team, agent_id, memory_id, text, norm, shape, tags, created_at) "
                "VALUES (?,?,?,?,?,?,?,?,?)",
                (fid, TEAM, agent, memory_id, text, norm, shape(norm), json.dumps(tags), created),
            )
            conn.execute("INSERT OR IGNORE INTO fact_sources VALUES (?,?,0,?,?)", (fid, memory_id, len(text), now))
            items.append(VectorItem(fid, text, vec, {**meta, "kind": "fact"}))
        return items

    def inprocess_timings(self, query_vectors: np.ndarray, query_texts: list[str]) -> dict[str, Any]:
        """Chroma and FTS alone, in this process, before the service opens the path (breakdown only)."""
        from ..storage.journal import Journal
        from ..storage.vectors import VectorStore

        vectors = VectorStore(self.data_dir / "chroma", url=self.chroma_url)
        journal = Journal(self.data_dir / "journal.sqlite3")
        timings: dict[str, list[float]] = {name: [] for name in IN_PROCESS_STEPS}
        try:
            for vec, text in zip(query_vectors, query_texts):
                search = journal.keyword_search
                steps: list[Callable[[], object]] = [
                    partial(vectors.query, TEAM, vec, 30),
                    partial(vectors.query, TEAM, vec, 30, payload=False),
                    partial(vectors.query, TEAM, vec, 30, where={"agent_id": SMALL_AGENT}),
                    partial(search, TEAM, text, kinds={"fact", "passage"}, limit=30),
                    partial(search, TEAM, text, kinds={"fact", "passage"}, limit=30, agent_id=SMALL_AGENT),
                ]
                for name, step in zip(IN_PROCESS_STEPS, steps):
                    t0 = time.perf_counter()
                    step()
                    timings[name].append(time.perf_counter() - t0)
        finally:
            journal.close()
            del vectors
            forget_chroma_clients()
        return {name: latency_summary(values) for name, values in timings.items()}


def forget_chroma_clients() -> None:
    """Drop this process's cached Chroma client before the service (another process) opens the path."""
    try:
        from chromadb.api.client import SharedSystemClient

        SharedSystemClient.clear_system_cache()
    except Exception:  # an older/newer chromadb without it: the next open still works, just cached
        pass
