"""Forgotten stays forgotten: every forgotten id looked for through GET, the list, the export and recall."""

from __future__ import annotations

from typing import Any

import httpx

from .transfer_data import BULK_AGENT, MAX_LIMIT
from .transfer_timing import export_all, walk

# the ways a forgotten memory could come back; their sum must be 0
LEAK_COUNTS = (
    "get_not_404",
    "in_list",
    "in_export",
    "facts_in_export",
    "in_recall",
    "recall_scoped_to_forgotten_agent_items",
)


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
    out: dict[str, Any] = {
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
    leaks = sum(out[k] for k in LEAK_COUNTS)
    out["returned_total"] = leaks
    expected = out["expected_count"]
    out["count_off_by"] = abs(out["list_count"] - expected) + abs(out["export_count"] - expected)
    return out
