"""The transfer benchmark's team: 1-3 grounded facts per memory over several agents, as an import body.

Facts are kept (status done), so importing the team costs no model work.
"""

from __future__ import annotations

import json
from typing import Any

from .recall_data import fact_text

TEAM = "bench-transfer"
BULK_AGENT, RARE_AGENT = "agent-bulk", "agent-rare"  # 30% and 2% of the memories
OTHER_AGENTS = 8
MAX_LIMIT = 500  # the largest `limit` GET /v1/memories accepts
FACT_POOL = 1 << 30  # larger than any fact index: every generated fact gets words of its own


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
