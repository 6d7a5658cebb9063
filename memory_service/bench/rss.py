"""Service memory without llama-server: VmRSS / VmHWM of the `memory-service serve` process and the child
that serves its embedded Chroma store.

The service runs against an external llama-server (MEMORY_LLM_URL), so the
process measured holds only the API, the journal, Chroma and the embedder.
Read from /proc/<pid>/status after start, after saves with extraction running,
and after recalls. Goal: <= 500 MB.

    python -m memory_service.bench.rss [--quick] [--llm-url URL] [--out DIR]
"""

from __future__ import annotations

import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

from ..testbed.probes import machine_info
from ..testbed.results import pyplot, write_figure
from ..testbed.service_runner import ServiceRunner, wait_queue_empty
from ..testbed.stats import goal
from .report import main_with_llama
from .texts import agent_text

GOAL_MB = 500.0


def run(
    *, llm_url: str, quick: bool = False, workdir: Path | None = None, observed_elsewhere: dict[str, Any] | None = None
) -> dict[str, Any]:
    saves = 30 if quick else 120
    recalls = 100 if quick else 300
    key = secrets.token_urlsafe(12)
    tmp = tempfile.TemporaryDirectory(prefix="bench-rss-") if workdir is None else None
    root = Path(tmp.name) if tmp else workdir
    assert root is not None
    service = ServiceRunner(root / "rss-data", api_keys={key: "bench-rss"}, llm_url=llm_url).start()
    points: dict[str, Any] = {}
    try:
        service.wait_model_ready()
        time.sleep(1.0)
        points["after_start"] = service.rss()
        with service.client(key, timeout=120) as client:
            for i in range(saves):
                client.post(
                    "/v1/remember", json={"text": agent_text(i), "agent_id": f"agent-{i % 4}", "tags": [f"t{i % 3}"]}
                ).raise_for_status()
            wait_queue_empty(
                service.url,
                timeout_s=saves * 30.0,
                progress="rss extraction",
                total=saves,
                keys=[service.metrics_token],
            )
            points[f"after_{saves}_saves_extracted"] = service.rss()
            for i in range(recalls):
                client.post("/v1/recall", json={"query": agent_text(i * 7)[:80], "k": 20}).raise_for_status()
            points[f"after_{recalls}_recalls"] = service.rss()
    finally:
        service.stop()
        if tmp:
            tmp.cleanup()
    peak = max((p.get("peak_rss_mb") or 0.0) for p in points.values())
    elsewhere_peak = max([(v or {}).get("peak_rss_mb") or 0.0 for v in (observed_elsewhere or {}).values()] or [0.0])
    return {
        "benchmark": "service_rss",
        "points": points,
        "goals": {
            "peak_rss_mb_this_run": goal(peak, GOAL_MB),
            **({"peak_rss_mb_other_benchmarks": goal(elsewhere_peak, GOAL_MB)} if observed_elsewhere else {}),
        },
        "observed_in_other_benchmarks": observed_elsewhere or {},
        "what": "VmRSS (now) and VmHWM (peak) of the service process plus its vector store's process (peaks summed); "
        "llama-server is a separate process, not counted",
        "machine": machine_info(),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    rows = {**result["points"], **{f"[{k}]": v for k, v in result["observed_in_other_benchmarks"].items()}}
    fig, ax = plt.subplots(figsize=(9, 4))
    names = list(rows)
    ax.barh(names, [(rows[n] or {}).get("rss_mb") or 0 for n in names], label="VmRSS")
    ax.scatter(
        [(rows[n] or {}).get("peak_rss_mb") or 0 for n in names], names, color="black", zorder=3, label="VmHWM (peak)"
    )
    ax.axvline(GOAL_MB, color="red", ls="--", lw=1, label="goal 500 MB")
    ax.set_xlabel("MB")
    ax.set_title("memory-service process RSS (without llama-server)")
    ax.legend(fontsize=8)
    write_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    return main_with_llama(argv, doc=__doc__, name="rss", run=run, plot=plot)


if __name__ == "__main__":
    raise SystemExit(main())
