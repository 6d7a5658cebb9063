"""Fair extraction: one team's saves are extracted about as soon while another team floods the queue.

Against `memory-service serve` in its own process with two team keys: team A saves one text at a time
(`wait_s`, so each save's time is save to extracted, as the client sees it), at random moments, first on
a quiet service, then right after team B queued a flood of saves (500; 60 with --quick). The JSON gives A's
p50/p95 both ways and their ratio; the goal is flooded within 2x quiet (in global order A's save would
wait behind B's whole backlog). It also says how many of B's jobs were still queued when A finished, so a
flood that drained early cannot pass for fairness.

The model: fairness is about queue order, not the model's speed, so without --llm-url the benchmark runs
the checkout's fake llama-server (`tests/fakes/fake_llama_server.py`, real HTTP and llama.cpp's API) at a
fixed generation speed, which makes each extraction call take about the same time (~0.2 s here). With
--llm-url (a real llama-server) the same figures are measured on the real model, only more slowly.

    python -m memory_service.bench.fairness [--quick] [--agents N] [--llm-url URL] [--out DIR]
"""

from __future__ import annotations

import argparse
import random
import secrets
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from ..client.service import service_client
from ..testbed.probes import machine_info
from ..testbed.results import pyplot, write_figure
from ..testbed.service_runner import ServiceRunner
from ..testbed.stats import goal, latency_summary
from .report import report

FLOOD, QUICK_FLOOD = 500, 60
A_SAVES, QUICK_A_SAVES = 20, 6
GOAL_RATIO = 2.0
FAKE_TOKENS_PER_S = 150.0  # the fake's reply (one short fact) then takes ~0.2 s: the per-call delay
FLOOD_CLIENTS = 8
FLOOD_AGENTS = 3  # B's flood is spread over this many agent ids (--agents: one per save)
CLAIMS = 100  # claims timed by `claim_times`


def _text(team: str, i: int) -> str:
    """Texts of one length, so every extraction call costs the same."""
    return f"Team {team} note {i:05d}: the nightly export of ledger {i:05d} finished at 02:{i % 60:02d}."


def _save(client: httpx.Client, agent: str, text: str, wait_s: float) -> dict[str, Any]:
    response = client.post("/v1/remember", json={"text": text, "agent_id": agent, "wait_s": wait_s})
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def team_a_saves(
    client: httpx.Client, n: int, pause_s: float, rng: random.Random, first: int = 0
) -> tuple[list[float], int]:
    """`n` saves one after another, each at a random moment (up to `pause_s` after the last was extracted),
    timed from the request to its answer with extraction done; and how many did not end `done`."""
    times, not_done = [], 0
    for i in range(n):
        time.sleep(rng.uniform(0.0, pause_s))
        started = time.perf_counter()
        body = _save(client, "agent-a", _text("A", first + i), 120.0)
        times.append(time.perf_counter() - started)
        not_done += body.get("status") != "done"
    return times, not_done


def flood(url: str, key: str, n: int, agents: int = FLOOD_AGENTS) -> float:
    """Team B queues `n` saves under `agents` agent ids as fast as `FLOOD_CLIENTS` clients can send them;
    seconds it took."""
    started = time.perf_counter()

    def one(chunk: range) -> None:
        with service_client(url, key, timeout=60.0) as client:
            for i in chunk:
                _save(client, f"agent-b{i % agents:05d}", _text("B", i), 0.0)

    with ThreadPoolExecutor(FLOOD_CLIENTS) as pool:
        list(pool.map(one, [range(c, n, FLOOD_CLIENTS) for c in range(FLOOD_CLIENTS)]))
    return time.perf_counter() - started


def queued_of(url: str, key: str) -> int | None:
    """A team's own jobs queued or running, as /ready shows that team."""
    with service_client(url, key, timeout=30.0) as client:
        depth = client.get("/ready").json().get("queue_depth")
    return None if depth is None else int(depth)


def claim_times(workdir: Path, agents: int, claims: int = CLAIMS) -> dict[str, Any]:
    """The claim's own time with team B's backlog spread over `agents` agent ids (one save each) and team A's
    over one: `claims` claims on a SQLite journal in this process, B's and A's p50/p95 apart."""
    from ..storage.database import SqliteDatabase
    from ..storage.journal import Journal

    database = SqliteDatabase(workdir / f"claims-{agents}.sqlite3")
    try:
        journal, now = Journal(database), time.time()
        for team, count, agent in (("b", agents, lambda i: f"b{i:06d}"), ("a", claims, lambda i: "a")):
            for i in range(count):
                journal.insert(
                    team=team,
                    agent_id=agent(i),
                    text=_text(team, i),
                    run_id=None,
                    tags=[],
                    metadata={},
                    idempotency_key=None,
                    budget_s=60.0,
                    now=now - 1000 + i * 0.001,
                )
        taken: dict[str, list[float]] = {"a": [], "b": []}
        for _ in range(claims):
            started = time.perf_counter()
            job = journal.claim_next("bench", lease_s=600.0, now=now)
            assert job is not None
            taken[job.team].append(time.perf_counter() - started)
    finally:
        database.close()
    return {"b_agents": agents, "b_claims": latency_summary(taken["b"]), "a_claims": latency_summary(taken["a"])}


def run(
    *,
    llm_url: str,
    quick: bool = False,
    workdir: Path,
    flood_size: int | None = None,
    a_saves: int | None = None,
    agents: int | None = None,
) -> dict[str, Any]:
    """`agents`: B's flood has one agent id per save (and `agents` saves), and the claim's time is measured."""
    flood_size = agents or flood_size or (QUICK_FLOOD if quick else FLOOD)
    a_saves = a_saves or (QUICK_A_SAVES if quick else A_SAVES)
    key_a, key_b = secrets.token_urlsafe(12), secrets.token_urlsafe(12)
    service = ServiceRunner(workdir / "fairness-data", api_keys={key_a: "team-a", key_b: "team-b"}, llm_url=llm_url)
    service.start()
    rng = random.Random(40)
    try:
        service.wait_model_ready()
        with service.client(key_a, timeout=180.0) as client:
            warm, _ = team_a_saves(client, 2, 0.0, rng)  # first extraction loads what it needs: not measured
            pause_s = min(warm)
            quiet, quiet_missed = team_a_saves(client, a_saves, pause_s, rng, first=100)
            flood_s = flood(service.url, key_b, flood_size, agents or FLOOD_AGENTS)
            b_before = queued_of(service.url, key_b)
            flooded, flooded_missed = team_a_saves(client, a_saves, pause_s, rng, first=200)
            b_after = queued_of(service.url, key_b)
    finally:
        service.stop()
    result = summarize(quiet, flooded, quiet_missed + flooded_missed, flood_size, flood_s, b_before, b_after, llm_url)
    result["team_b_flood"]["agents"] = agents or FLOOD_AGENTS
    if agents:
        result["claim_ms"] = {"few_agents": claim_times(workdir, 10), "many_agents": claim_times(workdir, agents)}
    return result


def summarize(
    quiet: list[float],
    flooded: list[float],
    missed: int,
    flood_size: int,
    flood_s: float,
    b_before: int | None,
    b_after: int | None,
    llm_url: str,
) -> dict[str, Any]:
    q, f = latency_summary(quiet), latency_summary(flooded)
    ratio = {p: round(f[p] / q[p], 2) if q[p] and f[p] else None for p in ("p50_ms", "p95_ms")}
    failed = []
    if missed:
        failed.append(f"{missed} of team A's saves were not extracted within wait_s")
    if not b_after:
        failed.append("team B's flood drained before team A finished: the flooded figures saw no flood")
    return {
        "benchmark": "fairness",
        "llm_url": llm_url,
        "team_a_quiet": q,
        "team_a_flooded": f,
        "ratio_flooded_to_quiet": ratio,
        "team_b_flood": {"saves": flood_size, "sent_in_s": round(flood_s, 2), "queued_before_a": b_before},
        "team_b_still_queued_after_a": b_after,
        "goals": {f"{p}_ratio": goal(ratio[p], GOAL_RATIO) for p in ("p50_ms", "p95_ms")},
        "failed_checks": failed,
        "machine": machine_info(),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    """Team A's save-to-extracted p50/p95, quiet and with team B flooding."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    names = ["team_a_quiet", "team_a_flooded"]
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [result[n]["p50_ms"] or 0 for n in names], 0.4, label="p50")
    ax.bar([x + 0.2 for x in xs], [result[n]["p95_ms"] or 0 for n in names], 0.4, label="p95")
    ax.set_xticks(list(xs), ["quiet", f"B floods {result['team_b_flood']['saves']}"])
    ax.set_ylabel("save to extracted, ms")
    ax.legend(fontsize=8)
    ax.set_title("team A's extraction while team B floods the queue")
    write_figure(fig, path)


def fake_llama(tokens_per_s: float = FAKE_TOKENS_PER_S) -> tuple[subprocess.Popen[str], str]:
    """The checkout's fake llama-server as a child process, and its URL (needs the repository's tests/)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "tests" / "fakes" / "fake_llama_server.py").is_file():
        raise SystemExit("no checkout with tests/fakes here: pass --llm-url (a llama-server) instead")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.fake_llama_server", "--port", "0", "--tokens-per-s", str(tokens_per_s)],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("FAKE_LLAMA_SERVER_URL="):
        proc.kill()
        raise SystemExit(f"the fake llama-server did not start: {line!r}")
    return proc, line.split("=", 1)[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memory_service.bench.fairness",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="60 saves of flood, 6 of team A")
    parser.add_argument("--agents", type=int, help="B floods N saves, each under its own agent id; times the claim")
    parser.add_argument("--llm-url", help="a running llama-server (default: the checkout's fake, fixed delay)")
    parser.add_argument("--out", type=Path, help="also write JSON and PNG here")
    args = parser.parse_args(argv)

    fake = None
    url = args.llm_url
    if url is None:
        fake, url = fake_llama()
    try:
        with tempfile.TemporaryDirectory(prefix="memory-bench-fairness-") as tmp:
            result = run(llm_url=url, quick=args.quick, workdir=Path(tmp), agents=args.agents)
    finally:
        if fake is not None:
            fake.terminate()
            fake.wait(10)
    return report(result, "fairness", plot, args.out, failed=bool(result["failed_checks"]))


if __name__ == "__main__":
    raise SystemExit(main())
