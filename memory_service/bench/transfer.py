"""List, export and forget at 10k memories over HTTP, and proof that a forgotten memory stays forgotten.

The team is filled through POST /v1/import with facts kept (status done), so no model work is
done and none is timed: 10k generated memories, 1-3 facts each, over several agents (one with
30% of the memories, one with 2%, the rest spread over eight). Everything is real: the service
in a process of its own, SQLite, Chroma and the embedder (the import embeds every fact; the
passage indexer then embeds every text, and is waited for before anything else is timed).

Timed: the import; walking the whole list a page at a time (limit 100 and the largest limit);
a filtered list (the 2% agent); the export; 200 single forgets; the bulk forget of the 30%
agent. Baselines in the same run: GET /health (the HTTP floor), and the export's rows read and
serialised straight from SQLite in this process (what the export costs without HTTP).
Afterwards every forgotten id is looked for through GET, the list, the export and recall;
`forgotten_never_returned` is false (and the exit code 1) if one comes back.

    python -m memory_service.bench.transfer [--quick] [--out DIR]
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from memory_service.bench.common import (
    ServiceRunner,
    goal,
    latency_summary,
    machine_info,
    main_without_llama,
    pyplot,
    write_figure,
)
from memory_service.bench.recall import fact_text

TEAM = "bench-transfer"
BULK_AGENT, RARE_AGENT = "agent-bulk", "agent-rare"  # 30% and 2% of the memories
OTHER_AGENTS = 8
MAX_LIMIT = 500  # the largest `limit` GET /v1/memories accepts
DEAD_LLM_URL = "http://127.0.0.1:9"  # nothing here reaches the model, so none is started
FACT_POOL = 1 << 30  # larger than any fact index: every generated fact gets words of its own


def _log(message: str) -> None:
    print(f"[transfer] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- data


def agent_of(i: int) -> str:
    """30% to one agent (bulk-forgotten), 2% to another (filtered list), the rest over eight."""
    slot = i % 50
    if slot < 15:
        return BULK_AGENT
    if slot == 15:
        return RARE_AGENT
    return f"agent-{i % OTHER_AGENTS}"


def make_record(i: int, epoch: float) -> dict[str, Any]:
    """The i-th memory as an export line: 1-3 grounded facts (spans into the text), done, no model needed."""
    created = epoch + i * 60.0
    parts: list[str] = []
    facts: list[dict[str, Any]] = []
    pos = 0
    for j in range(1 + i % 3):
        text, _ = fact_text(3 * i + j, FACT_POOL)
        facts.append({"id": f"orig-{i}-{j}", "text": text, "spans": [[pos, pos + len(text)]], "created_at": created})
        parts.append(text)
        pos += len(text) + 1
    return {
        "id": f"orig-{i}",
        "text": " ".join(parts) + f" (ref {i})",
        "agent_id": agent_of(i),
        "run_id": f"run-{i % 100}",
        "tags": [f"project-{i % 10}"],
        "metadata": {"seq": i},
        "created_at": created,
        "status": "done",
        "facts": facts,
    }


def ndjson(records: list[dict[str, Any]]) -> bytes:
    """The import body, as `/v1/export` would have written it."""
    return b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in records)


# ---------------------------------------------------------------- measurements


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
        page = {**params, "limit": limit, **({"cursor": cursor} if cursor else {})}
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
            _log(f"passages left to embed: {left}, {elapsed:.0f}s")
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


# ---------------------------------------------------------------- forgotten stays forgotten


def recall_leaks(client: httpx.Client, queries: list[str], gone: set[str], gone_facts: set[str]) -> int:
    """Items naming a forgotten memory or fact, over recalls of the forgotten texts' own facts."""
    leaks = 0
    for query in queries:
        response = client.post("/v1/recall", json={"query": query, "k": 10})
        response.raise_for_status()
        for item in response.json()["items"]:
            named = {item["memory_id"], *item["source_memory_ids"]}
            leaks += int(bool(named & gone) or item.get("fact_id") in gone_facts)
    return leaks


def recall_finds(client: httpx.Client, wanted: dict[str, str]) -> int:
    """How many surviving memories recall finds by one of their facts: the leak check is not vacuous."""
    found = 0
    for memory_id, query in wanted.items():
        response = client.post("/v1/recall", json={"query": query, "k": 10})
        response.raise_for_status()
        found += any(memory_id in {i["memory_id"], *i["source_memory_ids"]} for i in response.json()["items"])
    return found


def check_forgotten(
    client: httpx.Client, before: dict[str, dict[str, Any]], gone: set[str], samples: int
) -> dict[str, Any]:
    """Look for every forgotten id through GET, the list, the export and recall."""
    gone_facts = {f["id"] for memory_id in gone for f in before[memory_id]["facts"]}
    not_404 = sum(client.get(f"/v1/memories/{memory_id}").status_code != 404 for memory_id in sorted(gone))
    listed = walk(client, MAX_LIMIT)
    exported = export_all(client)
    exported_facts = {f["id"] for r in exported.records for f in r["facts"]}
    probes = sorted(gone)[:: max(1, len(gone) // samples)][:samples]
    survivors = sorted(set(before) - gone)[:: max(1, (len(before) - len(gone)) // samples)][:samples]
    scoped = client.post(
        "/v1/recall",
        json={"query": before[probes[0]]["facts"][0]["text"], "k": 10, "agent_id": BULK_AGENT, "scope": "agent"},
    )
    scoped.raise_for_status()
    out = {
        "forgotten": len(gone),
        "forgotten_facts": len(gone_facts),
        "get_not_404": not_404,
        "in_list": len(set(listed.ids) & gone),
        "list_count": len(listed.ids),
        "in_export": sum(r["id"] in gone for r in exported.records),
        "facts_in_export": len(exported_facts & gone_facts),
        "export_count": len(exported.records),
        "expected_count": len(before) - len(gone),
        "recall_queries": len(probes),
        "in_recall": recall_leaks(client, [before[m]["facts"][0]["text"] for m in probes], gone, gone_facts),
        "recall_scoped_to_forgotten_agent_items": len(scoped.json()["items"]),
        "recall_control_found": recall_finds(client, {m: before[m]["facts"][0]["text"] for m in survivors}),
        "recall_control_queries": len(survivors),
        "export_after": exported.summary(),
    }
    leaks = sum(
        out[k]
        for k in (
            "get_not_404",
            "in_list",
            "in_export",
            "facts_in_export",
            "in_recall",
            "recall_scoped_to_forgotten_agent_items",
        )
    )
    out["returned_total"] = leaks
    expected = out["expected_count"]
    out["count_off_by"] = abs(out["list_count"] - expected) + abs(out["export_count"] - expected)
    return out


# ---------------------------------------------------------------- the run


def run(*, quick: bool = False, workdir: Path | None = None) -> dict[str, Any]:
    n = 500 if quick else 10_000
    singles = min(200, n // 25)
    samples = 10 if quick else 40
    key = secrets.token_urlsafe(12)
    tmp = tempfile.TemporaryDirectory(prefix="bench-transfer-") if workdir is None else None
    root = Path(tmp.name) if tmp else workdir
    assert root is not None
    epoch = time.time() - n * 60.0 - 86400.0
    records = [make_record(i, epoch) for i in range(n)]
    payload = ndjson(records)
    result: dict[str, Any] = {
        "benchmark": "transfer",
        "memories": n,
        "facts": sum(len(r["facts"]) for r in records),
        "agents": dict(Counter(r["agent_id"] for r in records).most_common()),
    }
    service = ServiceRunner(root / "transfer-data", api_keys={key: TEAM}, llm_url=DEAD_LLM_URL).start()
    db = service.data_dir / "journal.sqlite3"
    try:
        with service.client(key, timeout=3600) as client:
            result.update(_populate(client, db, payload, n, result["facts"]))
            result["baseline_same_run"] = {"GET /health (HTTP floor)": health_floor(client, 200)}
            before = _read_side(client, service, result)
            result.update(_forgets(client, before, singles))
            gone = set(result.pop("_gone"))
            _log("looking for forgotten ids through GET, list, export and recall")
            result["after_forget"] = check_forgotten(client, before, gone, samples)
        result["service_rss_end"] = service.rss()
    finally:
        service.stop()
        if tmp:
            tmp.cleanup()
    after = result["after_forget"]
    result["forgotten_never_returned"] = after["returned_total"] == 0
    result["goals"] = {
        "forgotten_ids_returned": goal(after["returned_total"], 0),
        "list_and_export_count_off_by": goal(after["count_off_by"], 0),
    }
    result["failed_checks"] = [name for name, g in result["goals"].items() if g["met"] is False]
    result["notes"] = (
        "one client, sequential requests, on the same machine as the service; "
        "timings include the client's HTTP overhead (not its JSON parsing of the export)"
    )
    result["machine"] = machine_info()
    return result


def _populate(client: httpx.Client, db: Path, payload: bytes, n: int, facts: int) -> dict[str, Any]:
    """POST /v1/import of every memory, then wait for the passage indexer to finish."""
    _log(f"importing {n} memories ({len(payload) / 1e6:.1f} MB)")
    t0 = time.perf_counter()
    response = client.post("/v1/import", content=payload, headers={"content-type": "application/x-ndjson"})
    seconds = time.perf_counter() - t0
    response.raise_for_status()
    body = response.json()
    if body["imported"] != n:
        raise RuntimeError(f"import stored {body['imported']} of {n}: {body}")
    indexed_s = wait_indexed(db, TEAM, timeout_s=max(600.0, n * 0.5))
    _log(f"imported in {seconds:.1f}s, passages embedded {indexed_s:.1f}s later")
    return {
        "import": {
            "total_s": round(seconds, 2),
            "memories_per_s": round(n / seconds, 1),
            "facts_per_s": round(facts / seconds, 1),
            "body_mb": round(len(payload) / 1e6, 2),
            "failed": body["failed"],
            "what": "facts kept and embedded during the request; passages embedded afterwards",
            "passages_indexed_s_after_import": round(indexed_s, 1),
        }
    }


def _read_side(client: httpx.Client, service: ServiceRunner, result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """List walks, the filtered list and the export (with its baselines); returns the export by id."""
    _log("listing and exporting")
    walk(client, MAX_LIMIT)  # warm-up: SQLite's page cache and the first requests' costs
    lists = {f"limit_{limit}": walk(client, limit) for limit in (100, MAX_LIMIT)}
    for name, one in lists.items():
        if len(set(one.ids)) != result["memories"]:
            raise RuntimeError(f"list {name} returned {len(set(one.ids))} distinct ids of {result['memories']}")
    result["list"] = {name: one.summary() for name, one in lists.items()}
    result["list_filtered"] = {
        "agent_id": RARE_AGENT,
        **{f"limit_{limit}": walk(client, limit, agent_id=RARE_AGENT).summary() for limit in (100, MAX_LIMIT)},
    }
    rss_before = service.rss()  # VmHWM rising here would mean the export is held in memory, not streamed
    exported = export_all(client)
    result["export"] = {**exported.summary(), "service_rss_before": rss_before, "service_rss_after": service.rss()}
    direct = sqlite_export(service.data_dir / "journal.sqlite3", TEAM)
    base = result["baseline_same_run"]
    base["sqlite_direct_export"] = {"what": "the same lines built from SQLite in this process, no HTTP", **direct}
    base["export_over_sqlite_direct"] = round(exported.total_s / direct["total_s"], 2) if direct["total_s"] else None
    base["export_over_list_walk_limit_500"] = round(exported.total_s / lists[f"limit_{MAX_LIMIT}"].total_s, 2)
    return {r["id"]: r for r in exported.records}


def _forgets(client: httpx.Client, before: dict[str, dict[str, Any]], singles: int) -> dict[str, Any]:
    """Single forgets spread over the non-bulk agents, then the bulk forget of the 30% agent."""
    others = [
        m
        for m, r in sorted(before.items(), key=lambda kv: kv[1]["created_at"])
        if r["agent_id"] not in (BULK_AGENT, RARE_AGENT)
    ]
    chosen = others[:: max(1, len(others) // singles)][:singles]
    _log(f"forgetting {len(chosen)} memories one at a time, then agent {BULK_AGENT}")
    single_s = forget_each(client, chosen)
    expected = sum(r["agent_id"] == BULK_AGENT for r in before.values())
    t0 = time.perf_counter()
    response = client.delete("/v1/memories", params={"agent_id": BULK_AGENT, "confirm": "true"})
    bulk_s = time.perf_counter() - t0
    response.raise_for_status()
    deleted = response.json()["deleted"]
    if deleted != expected:
        raise RuntimeError(f"bulk forget deleted {deleted}, expected {expected}")
    bulk_ids = [m for m, r in before.items() if r["agent_id"] == BULK_AGENT]
    return {
        "forget_one": latency_summary(single_s),
        "forget_bulk": {
            "agent_id": BULK_AGENT,
            "deleted": deleted,
            "total_s": round(bulk_s, 3),
            "memories_per_s": round(deleted / bulk_s, 1) if bulk_s else None,
        },
        "_gone": chosen + bulk_ids,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    """Per-page list latency by variant, and the wall time of each bulk operation."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    pages = {f"all\n{k}": v["per_page"] for k, v in result["list"].items()}
    pages.update(
        {f"{RARE_AGENT}\n{k}": v["per_page"] for k, v in result["list_filtered"].items() if k.startswith("limit_")}
    )
    names = list(pages)
    xs = range(len(names))
    left.bar([x - 0.2 for x in xs], [pages[n]["p50_ms"] or 0 for n in names], 0.4, label="p50")
    left.bar([x + 0.2 for x in xs], [pages[n]["p95_ms"] or 0 for n in names], 0.4, label="p95")
    left.set_xticks(list(xs), names, fontsize=8)
    left.set_ylabel("ms per page")
    left.set_title("GET /v1/memories")
    left.legend(fontsize=8)
    base = result["baseline_same_run"]
    totals = {
        "import": result["import"]["total_s"],
        "export": result["export"]["total_s"],
        "export from SQLite (baseline)": base["sqlite_direct_export"]["total_s"],
        f"list walk, {MAX_LIMIT}/page": result["list"][f"limit_{MAX_LIMIT}"]["total_s"],
        f"bulk forget ({result['forget_bulk']['deleted']})": result["forget_bulk"]["total_s"],
    }
    right.barh(list(totals), list(totals.values()))
    right.set_xscale("log")
    right.set_xlabel("seconds")
    right.set_title(f"{result['memories']:,} memories; forgotten never returned: {result['forgotten_never_returned']}")
    write_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    """Exit 1 when a forgotten id came back (or the counts after forgetting are wrong)."""
    return main_without_llama(
        argv,
        doc=__doc__,
        name="transfer",
        run=run,
        plot=plot,
        quick="500 memories instead of 10k",
        failed=lambda result: bool(result["failed_checks"]),
    )


if __name__ == "__main__":
    raise SystemExit(main())
