"""The transfer benchmark's timed steps: list walks, the export (and its SQLite floor), forgets.

Each one is a single client's sequential requests; the client's own JSON parsing stays
outside the clock.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..testbed.stats import latency_summary


def log(message: str) -> None:
    print(f"[transfer] {message}", file=sys.stderr, flush=True)


@dataclass
class Walk:
    """A whole list walked page by page: ids in order and each page's request time."""

    ids: list[str] = field(default_factory=list)
    page_s: list[float] = field(default_factory=list)
    total_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "items": len(self.ids),
            "pages": len(self.page_s),
            "total_s": round(self.total_s, 3),
            "items_per_s": round(len(self.ids) / self.total_s) if self.total_s else None,
            "per_page": latency_summary(self.page_s),
        }


def walk(client: httpx.Client, limit: int, **params: str) -> Walk:
    """Every page of GET /v1/memories, following next_cursor to the end."""
    out, cursor = Walk(), None
    started = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        page: dict[str, str | int] = {**params, "limit": limit, **({"cursor": cursor} if cursor else {})}
        response = client.get("/v1/memories", params=page)
        out.page_s.append(time.perf_counter() - t0)
        response.raise_for_status()
        body = response.json()
        out.ids += [item["id"] for item in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            out.total_s = time.perf_counter() - started
            return out


@dataclass
class Export:
    records: list[dict[str, Any]]
    nbytes: int
    total_s: float
    first_byte_s: float

    def summary(self) -> dict[str, Any]:
        return {
            "lines": len(self.records),
            "mb": round(self.nbytes / 1e6, 2),
            "total_s": round(self.total_s, 3),
            "lines_per_s": round(len(self.records) / self.total_s) if self.total_s else None,
            "mb_per_s": round(self.nbytes / 1e6 / self.total_s, 2) if self.total_s else None,
            "first_byte_ms": round(self.first_byte_s * 1000.0, 1),
        }


def export_all(client: httpx.Client) -> Export:
    """GET /v1/export read to the end; lines are parsed after the clock stops (the client's own cost)."""
    chunks: list[bytes] = []
    first: float | None = None
    started = time.perf_counter()
    with client.stream("GET", "/v1/export") as response:
        response.raise_for_status()
        for chunk in response.iter_bytes():
            if first is None:
                first = time.perf_counter() - started
            chunks.append(chunk)
    total = time.perf_counter() - started
    body = b"".join(chunks)
    records = [json.loads(line) for line in body.splitlines() if line.strip()]
    return Export(records, len(body), total, first or total)


def sqlite_export(db: Path, team: str) -> dict[str, Any]:
    """The export's lines built straight from SQLite in this process: the floor under the HTTP export."""
    started = time.perf_counter()
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        facts: dict[str, dict[str, dict[str, Any]]] = {}
        for row in conn.execute(
            "SELECT s.memory_id, s.span_start, s.span_end, f.* FROM fact_sources s "
            "JOIN facts f ON f.id = s.fact_id WHERE f.team = ? ORDER BY f.created_at, s.span_start",
            (team,),
        ):
            fact = facts.setdefault(row["memory_id"], {}).setdefault(
                row["id"],
                {
                    "id": row["id"],
                    "text": row["text"],
                    "spans": [],
                    "created_at": row["created_at"],
                    "superseded_by": row["superseded_by"],
                    "superseded_at": row["superseded_at"],
                },
            )
            fact["spans"].append([row["span_start"], row["span_end"]])
        lines = nbytes = 0
        for row in conn.execute(
            "SELECT * FROM memories WHERE team = ? AND status != 'deleted' ORDER BY created_at, id", (team,)
        ):
            record = {
                "id": row["id"],
                "text": row["text"],
                "agent_id": row["agent_id"],
                "run_id": row["run_id"],
                "tags": json.loads(row["tags"]),
                "metadata": json.loads(row["metadata"]),
                "created_at": row["created_at"],
                "status": row["status"],
                "idempotency_key": row["idempotency_key"],
                "facts": list(facts.get(row["id"], {}).values()),
            }
            nbytes += len((json.dumps(record, ensure_ascii=False) + "\n").encode())
            lines += 1
    finally:
        conn.close()
    total = time.perf_counter() - started
    return {
        "lines": lines,
        "mb": round(nbytes / 1e6, 2),
        "total_s": round(total, 3),
        "lines_per_s": round(lines / total) if total else None,
    }


def unindexed(db: Path, team: str) -> int:
    """Texts whose passage vectors the service has not written yet."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(
            "SELECT COUNT(*) FROM memories WHERE team = ? AND indexed = 0 AND status != 'deleted'", (team,)
        ).fetchone()[0]
    finally:
        conn.close()


def wait_indexed(db: Path, team: str, timeout_s: float) -> float:
    """Seconds until every passage is embedded: until then the indexer would compete with what is timed."""
    started = time.monotonic()
    last = 0.0
    while (left := unindexed(db, team)) > 0:
        elapsed = time.monotonic() - started
        if elapsed > timeout_s:
            raise TimeoutError(f"{left} passages still not indexed after {timeout_s:.0f}s")
        if elapsed - last >= 15:
            last = elapsed
            log(f"passages left to embed: {left}, {elapsed:.0f}s")
        time.sleep(0.5)
    return time.monotonic() - started


def health_floor(client: httpx.Client, n: int) -> dict[str, Any]:
    seconds = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.get("/health").raise_for_status()
        seconds.append(time.perf_counter() - t0)
    return latency_summary(seconds)


def forget_each(client: httpx.Client, ids: list[str]) -> list[float]:
    """DELETE /v1/memories/{id} one at a time; every one must answer 204."""
    seconds = []
    for memory_id in ids:
        t0 = time.perf_counter()
        response = client.delete(f"/v1/memories/{memory_id}")
        seconds.append(time.perf_counter() - t0)
        if response.status_code != 204:
            raise RuntimeError(f"forget {memory_id}: {response.status_code} {response.text[:200]}")
    return seconds
