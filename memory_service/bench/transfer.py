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

import secrets
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from ..testbed.probes import machine_info
from ..testbed.results import pyplot, write_figure
from ..testbed.service_runner import ServiceRunner
from ..testbed.stats import goal, latency_summary
from .report import main_without_llama
from .transfer_data import BULK_AGENT, MAX_LIMIT, RARE_AGENT, TEAM, make_record, ndjson
from .transfer_forgotten import check_forgotten
from .transfer_timing import (
    export_all,
    forget_each,
    health_floor,
    log,
    sqlite_export,
    wait_indexed,
    walk,
)

DEAD_LLM_URL = "http://127.0.0.1:9"  # nothing here reaches the model, so none is started


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
            log("looking for forgotten ids through GET, list, export and recall")
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
    log(f"importing {n} memories ({len(payload) / 1e6:.1f} MB)")
    t0 = time.perf_counter()
    response = client.post("/v1/import", content=payload, headers={"content-type": "application/x-ndjson"})
    seconds = time.perf_counter() - t0
    response.raise_for_status()
    body = response.json()
    if body["imported"] != n:
        raise RuntimeError(f"import stored {body['imported']} of {n}: {body}")
    indexed_s = wait_indexed(db, TEAM, timeout_s=max(600.0, n * 0.5))
    log(f"imported in {seconds:.1f}s, passages embedded {indexed_s:.1f}s later")
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
    log("listing and exporting")
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
    log(f"forgetting {len(chosen)} memories one at a time, then agent {BULK_AGENT}")
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
