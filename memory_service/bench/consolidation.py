"""Consolidation never delays a save: ack and extraction latency with a consolidation call in flight.

Two services on the same llama-server, one after the other, each filled through POST /v1/import with
the same facts (many subjects, each with several facts, so consolidation always has groups due):

- baseline: `MEMORY_CONSOLIDATE=0`; each save arrives on an idle model;
- consolidating: `MEMORY_CONSOLIDATE=1`; each save is sent while a consolidation pass is running and
  its model call is in flight (the llama-server's slot is busy with it when the save is sent; the JSON
  counts how often that held).

Per save: the ack (POST /v1/remember until its 202), the extraction wall time (from the ack until the
memory is done, polled every 20 ms) and the extraction's own model calls (prompt tokens read and taken
from cache, model ms), so a slower extraction shows whether it waited for the slot or re-read its prompt.

    python -m memory_service.bench.consolidation [--quick] [--llm-url URL] [--out DIR]
"""

from __future__ import annotations

import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from ..client.service import service_client
from ..testbed.probes import machine_info
from ..testbed.results import pyplot, write_figure
from ..testbed.service_runner import ServiceRunner, llama_busy
from ..testbed.stats import goal, latency_summary
from .report import main_with_llama
from .texts import agent_text
from .transfer_data import ndjson
from .transfer_timing import wait_indexed

TEAM = "bench-consolidation"
SUBJECTS = (
    "Amara",
    "Bruno",
    "Chiara",
    "Dmitri",
    "Elena",
    "Farid",
    "Greta",
    "Hiro",
    "Ines",
    "Jonas",
    "Kavya",
    "Lars",
    "Mei",
    "Nadia",
    "Oskar",
    "Priya",
    "Quentin",
    "Rosa",
    "Soren",
    "Tamsin",
    "Ugo",
    "Vera",
    "Wendell",
    "Ximena",
    "Yusuf",
    "Zofia",
)
DOINGS = (
    "leads the {p} migration to the new billing cluster",
    "prefers written status updates over calls",
    "is on call for the {p} pipeline this week",
    "asked for the {p} report to be sent every Friday",
    "moved the {p} standup to 9:30 UTC",
    "owns the vendor contract for {p}",
    "reported a timeout in the {p} export job",
    "approved the {p} budget for the next quarter",
)
PROJECTS = ("Kestrel", "Osprey", "Heron", "Falcon", "Merlin", "Harrier")
FACTS_PER_SUBJECT = 6
QUIET_WAIT_S = 3.0  # the baseline waits as long as consolidation needs to start again (its 2 s quiet + a plan)
IN_FLIGHT_S = 1.0  # with consolidation: wait this long after a pass starts, so its model call is being served
RATIO_GOAL = 1.15  # "unchanged within noise": consolidating / baseline, on a shared 2-core machine


def _log(message: str) -> None:
    print(f"[consolidation] {message}", file=sys.stderr, flush=True)


def records(epoch: float) -> list[dict[str, Any]]:
    """Export lines, done, with grounded facts: every subject gets FACTS_PER_SUBJECT facts, two a memory."""
    out: list[dict[str, Any]] = []
    for number, name in enumerate(SUBJECTS):
        facts = [
            f"{name} {DOINGS[(number + j) % len(DOINGS)].format(p=PROJECTS[(number + j) % len(PROJECTS)])}."
            for j in range(FACTS_PER_SUBJECT)
        ]
        for first in range(0, len(facts), 2):
            pair = facts[first : first + 2]
            n = len(out)
            created = epoch + n * 60.0
            text = " ".join(pair)
            starts = [0, len(pair[0]) + 1][: len(pair)]
            out.append(
                {
                    "id": f"seed-{n}",
                    "text": text,
                    "agent_id": "team-notes",
                    "tags": [],
                    "metadata": {},
                    "created_at": created,
                    "status": "done",
                    "facts": [
                        {
                            "id": f"seed-{n}-{j}",
                            "text": fact,
                            "spans": [[start, start + len(fact)]],
                            "created_at": created,
                        }
                        for j, (fact, start) in enumerate(zip(pair, starts))
                    ],
                }
            )
    return out


def _consolidation(client: httpx.Client) -> dict[str, Any]:
    return client.get("/v1/stats").json().get("consolidation") or {}


def _wait_running(client: httpx.Client, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _consolidation(client).get("running"):
            return True
        time.sleep(0.05)
    return False


def _save_and_wait(client: httpx.Client, i: int, timeout_s: float) -> dict[str, Any]:
    started = time.perf_counter()
    response = client.post("/v1/remember", json={"text": agent_text(50_000 + i), "agent_id": "bench"})
    ack = time.perf_counter() - started
    response.raise_for_status()
    memory_id = response.json()["id"]
    deadline = time.monotonic() + timeout_s
    while True:
        memory = client.get(f"/v1/memories/{memory_id}").json()
        if memory["status"] in ("done", "failed") or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    totals = memory.get("timings") or {}  # llama.cpp's timings, summed over the extraction's calls
    return {
        "ack_s": ack,
        "extraction_s": time.perf_counter() - started - ack,
        "status": memory["status"],
        "prompt_n": totals.get("prompt_n") or 0,
        "cache_n": totals.get("cache_n") or 0,
        "model_ms": (totals.get("prompt_ms") or 0) + (totals.get("predicted_ms") or 0),
    }


def arm(root: Path, llm_url: str, *, consolidate: bool, saves: int) -> dict[str, Any]:
    """One service, filled with the same facts; `saves` saves, each on an idle model or mid-consolidation."""
    key = secrets.token_urlsafe(12)
    name = "consolidating" if consolidate else "baseline"
    service = ServiceRunner(
        root / name, api_keys={key: TEAM}, llm_url=llm_url, env={"MEMORY_CONSOLIDATE": "1" if consolidate else "0"}
    ).start()
    samples: list[dict[str, Any]] = []
    busy_at_save = not_running = 0
    try:
        service.wait_model_ready()
        with service_client(service.url, key, timeout=60) as client:
            seed = records(time.time() - 86_400)
            imported = client.post("/v1/import", content=ndjson(seed), headers={"content-type": "application/x-ndjson"})
            imported.raise_for_status()
            wait_indexed(service.data_dir / "journal.sqlite3", TEAM, timeout_s=600)
            for i in range(saves):
                if consolidate:
                    if not _wait_running(client, timeout_s=120):
                        not_running += 1
                    time.sleep(IN_FLIGHT_S)
                    busy_at_save += llama_busy(llm_url)
                else:
                    time.sleep(QUIET_WAIT_S + IN_FLIGHT_S)
                samples.append(_save_and_wait(client, i, timeout_s=300))
                _log(
                    f"{name}: save {i + 1}/{saves}: ack {samples[-1]['ack_s'] * 1000:.1f} ms, "
                    f"extraction {samples[-1]['extraction_s']:.2f} s"
                )
        with service.operator() as operator:  # the runs span every team: a team's key sees none of them
            status = _consolidation(operator)
    finally:
        service.stop()
    runs = status.get("runs") or []
    return {
        "saves": len(samples),
        "not_done": sum(1 for s in samples if s["status"] != "done"),
        "ack": latency_summary([s["ack_s"] for s in samples]),
        "extraction_wall": latency_summary([s["extraction_s"] for s in samples]),
        "extraction_model_ms_p50": round(statistics.median(s["model_ms"] for s in samples), 1) if samples else None,
        "prompt_tokens_read_mean": round(statistics.fmean(s["prompt_n"] for s in samples), 1) if samples else None,
        "prompt_tokens_from_cache_mean": round(statistics.fmean(s["cache_n"] for s in samples), 1) if samples else None,
        **(
            {
                "model_busy_with_consolidation_at_save": busy_at_save,
                "pass_not_running_at_save": not_running,
                "consolidated_items": status.get("items"),
                "latest_runs": [{k: r.get(k) for k in ("outcome", "groups_due", "written")} for r in runs],
            }
            if consolidate
            else {}
        ),
    }


def run(*, llm_url: str, quick: bool = False, workdir: Path | None = None) -> dict[str, Any]:
    saves = 6 if quick else 20
    tmp = tempfile.TemporaryDirectory(prefix="bench-consolidation-") if workdir is None else None
    root = Path(tmp.name) if tmp else workdir / "consolidation"  # type: ignore[operator]
    root.mkdir(parents=True, exist_ok=True)
    try:
        baseline = arm(root, llm_url, consolidate=False, saves=saves)
        consolidating = arm(root, llm_url, consolidate=True, saves=saves)
    finally:
        if tmp:
            tmp.cleanup()

    def ratio(section: str, stat: str) -> float | None:
        a, b = consolidating[section][stat], baseline[section][stat]
        return round(a / b, 2) if a and b else None

    return {
        "benchmark": "consolidation_yields",
        "seed": f"{len(SUBJECTS)} subjects x {FACTS_PER_SUBJECT} facts, imported (no model work)",
        "baseline": baseline,
        "consolidating": consolidating,
        "goals": {
            "ack_p50_ratio": goal(ratio("ack", "p50_ms"), RATIO_GOAL),
            "ack_p99_ratio": goal(ratio("ack", "p99_ms"), RATIO_GOAL),
            "extraction_p50_ratio": goal(ratio("extraction_wall", "p50_ms"), RATIO_GOAL),
        },
        "notes": "one save at a time, so each ack and extraction is the save's own; the consolidating arm sends "
        "each save while a pass runs (model_busy_with_consolidation_at_save counts the saves that found "
        "llama-server's slot busy), and its extraction includes cancelling that call.",
        "machine": machine_info(),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.5))
    names = ["p50_ms", "p95_ms", "max_ms"]
    for ax, section, title in ((axes[0], "ack", "ack (ms)"), (axes[1], "extraction_wall", "extraction (ms)")):
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [result["baseline"][section][n] or 0 for n in names], 0.4, label="idle model")
        ax.bar(
            [x + 0.2 for x in xs],
            [result["consolidating"][section][n] or 0 for n in names],
            0.4,
            label="consolidation in flight",
        )
        ax.set_xticks(list(xs), names)
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    write_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    return main_with_llama(argv, doc=__doc__, name="consolidation", run=run, plot=plot)


if __name__ == "__main__":
    raise SystemExit(main())
