"""Webhook isolation: a quiet team's events arrive as soon while another team's receivers misbehave.

Against `memory-service serve` in its own process with two team keys. Team Q subscribes one well-behaved
receiver and saves texts one at a time; each event's delivery time is from its creation (the event's
`created_at`, when its extraction was stored) to its arrival at the receiver. First on a quiet service,
then after team H subscribed 10 hostile receivers (the most a team may have: a body trickled a byte every
3 s, receivers that never answer, 3 GB bodies; testbed/receivers.py) and saved texts whose events keep them
busy (quick retries keep H's rows due all along). The JSON gives Q's p50/p95 both ways and their ratio (the
goal: within 2x), how many of H's connections were held while Q measured, and the service's RSS before and
after (the goal: a few MB per stuck delivery, not the bodies).

The model: delivery does not depend on it, so without --llm-url the checkout's fake llama-server runs.

    python -m memory_service.bench.webhooks [--quick] [--llm-url URL] [--out DIR]
"""

from __future__ import annotations

import argparse
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from ..testbed.probes import machine_info, rss_mb
from ..testbed.receivers import Mode, Receivers
from ..testbed.results import pyplot, write_figure
from ..testbed.service_runner import ServiceRunner
from ..testbed.stats import goal, latency_summary
from .fairness import fake_llama
from .report import report

SAVES, QUICK_SAVES = 20, 8
HOSTILE: tuple[Mode, ...] = ("trickle",) * 4 + ("silent",) * 3 + ("endless",) * 3  # a team's 10 subscriptions
HOSTILE_SAVES = 20
GOAL_RATIO = 2.0
RSS_GOAL_MB_PER_STUCK = 4.0
ENV = {
    "MEMORY_WEBHOOK_ALLOW_PRIVATE": "1",  # the receivers are on loopback
    "MEMORY_WEBHOOK_RETRY_BASE_S": "0.5",  # H's failed rows come due again and again while Q measures
    "MEMORY_WEBHOOK_RETRY_MAX_S": "2",
}


def _subscribe(client: httpx.Client, url: str) -> None:
    client.post("/v1/webhooks", json={"url": url, "events": ["memory.extracted"]}).raise_for_status()


def _save(client: httpx.Client, text: str, wait_s: float) -> str:
    answer = client.post("/v1/remember", json={"text": text, "agent_id": "bench", "wait_s": wait_s})
    answer.raise_for_status()
    return str(answer.json()["id"])


def quiet_team(client: httpx.Client, receivers: Receivers, n: int, first: int, held: list[int]) -> dict[str, Any]:
    """Q's `n` saves, one at a time, each waited for; its events' delivery times in seconds. `held` gets the
    hostile receivers' open connections, sampled at each save."""
    ids = []
    for i in range(first, first + n):
        ids.append(_save(client, f"Team Q note {i:04d}: the invoice run {i:04d} closed at 04:{i % 60:02d}.", 30.0))
        held.append(sum(receivers.snapshot(mode).open_connections for mode in set(HOSTILE)))
        time.sleep(0.2)
    deadline = time.monotonic() + 90.0
    while time.monotonic() < deadline:
        arrived = {a.event["data"]["memory_id"]: a for a in receivers.snapshot("ok").arrivals}
        if arrived.keys() >= set(ids):
            break
        time.sleep(0.1)
    times = [arrived[mid].latency_s for mid in ids if mid in arrived]
    return {"times": times, "undelivered": len(ids) - len(times)}


def run(*, llm_url: str, quick: bool = False, workdir: Path, saves: int | None = None) -> dict[str, Any]:
    n = saves or (QUICK_SAVES if quick else SAVES)
    key_q, key_h = secrets.token_urlsafe(12), secrets.token_urlsafe(12)
    service = ServiceRunner(
        workdir / "webhooks-data", api_keys={key_q: "team-q", key_h: "team-h"}, llm_url=llm_url, env=ENV
    )
    service.start()
    held: list[int] = []
    try:
        service.wait_model_ready()
        with (
            Receivers() as receivers,
            service.client(key_q, timeout=60.0) as q,
            service.client(key_h, timeout=60.0) as h,
        ):
            _subscribe(q, receivers.url("ok"))
            quiet_team(q, receivers, 2, 0, [])  # the first saves load what they need: not measured
            rss_quiet = rss_mb(service.pid)["rss_mb"]
            quiet = quiet_team(q, receivers, n, 100, [])
            for mode in HOSTILE:
                _subscribe(h, receivers.url(mode))
            for i in range(HOSTILE_SAVES):
                _save(h, f"Team H note {i:04d}: the cache of shard {i:04d} was warmed.", 0.0)
            started = time.monotonic()
            while time.monotonic() - started < 60 and not receivers.snapshot("silent").open_connections:
                time.sleep(0.1)
            hostile = quiet_team(q, receivers, n, 200, held)
            rss_hostile = rss_mb(service.pid)["rss_mb"]
            hostile_counts = {mode: vars(receivers.snapshot(mode)) for mode in sorted(set(HOSTILE))}
    finally:
        service.stop()
    return summarize(quiet, hostile, held, rss_quiet, rss_hostile, hostile_counts, llm_url)


def summarize(
    quiet: dict[str, Any],
    hostile: dict[str, Any],
    held: list[int],
    rss_quiet: float | None,
    rss_hostile: float | None,
    hostile_counts: dict[Mode, dict[str, Any]],
    llm_url: str,
) -> dict[str, Any]:
    q, f = latency_summary(quiet["times"]), latency_summary(hostile["times"])
    ratio = {p: round(f[p] / q[p], 2) if q[p] and f[p] else None for p in ("p50_ms", "p95_ms")}
    grown = None if rss_quiet is None or rss_hostile is None else round(rss_hostile - rss_quiet, 1)
    failed = []
    if quiet["undelivered"] or hostile["undelivered"]:
        failed.append(f"{quiet['undelivered'] + hostile['undelivered']} of team Q's events did not arrive in 90 s")
    if not any(held):
        failed.append("no hostile receiver held a connection while team Q measured: the figures saw no attack")
    return {
        "benchmark": "webhooks",
        "llm_url": llm_url,
        "team_q_quiet": q,
        "team_q_with_hostile_team": f,
        "ratio_hostile_to_quiet": ratio,
        "team_q_undelivered": {"quiet": quiet["undelivered"], "hostile": hostile["undelivered"]},
        "team_h": {
            "subscriptions": {mode: HOSTILE.count(mode) for mode in sorted(set(HOSTILE))},
            "saves": HOSTILE_SAVES,
            "held_connections_while_q_measured": {"min": min(held, default=0), "max": max(held, default=0)},
            "receivers": {
                mode: {k: v for k, v in counts.items() if k != "arrivals"} for mode, counts in hostile_counts.items()
            },
        },
        "service_rss_mb": {"quiet": rss_quiet, "with_hostile_team": rss_hostile, "grown": grown},
        "goals": {
            **{f"{p}_ratio": goal(ratio[p], GOAL_RATIO) for p in ("p50_ms", "p95_ms")},
            "rss_grown_mb": goal(grown, RSS_GOAL_MB_PER_STUCK * max(held, default=1)),
        },
        "failed_checks": failed,
        "machine": machine_info(),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    """Team Q's event delivery p50/p95, quiet and with team H's hostile receivers."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    names = ["team_q_quiet", "team_q_with_hostile_team"]
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [result[n]["p50_ms"] or 0 for n in names], 0.4, label="p50")
    ax.bar([x + 0.2 for x in xs], [result[n]["p95_ms"] or 0 for n in names], 0.4, label="p95")
    ax.set_xticks(list(xs), ["quiet", "team H's 10 hostile receivers"])
    ax.set_ylabel("event created to received, ms")
    ax.legend(fontsize=8)
    ax.set_title("team Q's webhook delivery while team H's receivers misbehave")
    write_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memory_service.bench.webhooks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SAVES} saves of team Q each way")
    parser.add_argument("--llm-url", help="a running llama-server (default: the checkout's fake)")
    parser.add_argument("--out", type=Path, help="also write JSON and PNG here")
    args = parser.parse_args(argv)

    fake = None
    url = args.llm_url
    if url is None:
        fake, url = fake_llama(tokens_per_s=5000.0)
    try:
        with tempfile.TemporaryDirectory(prefix="memory-bench-webhooks-") as tmp:
            result = run(llm_url=url, quick=args.quick, workdir=Path(tmp))
    finally:
        if fake is not None:
            fake.terminate()
            fake.wait(10)
    return report(result, "webhooks", plot, args.out, failed=bool(result["failed_checks"]))


if __name__ == "__main__":
    raise SystemExit(main())
