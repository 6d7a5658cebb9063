"""What `memory-service gate` costs a tool call: the same small tool called straight on the upstream MCP server
and through the gate, unguarded and guarded, interleaved in one run; p50/p95 of each and what a guarded call
adds over the bare one.

Real processes, as a harness runs them: `memory-service serve` in its own process (with the checkout's fake
llama-server: nothing here uses the model), a minimal upstream MCP server (testbed/mcp_upstream.py) spoken to
over stdio, and `memory-service gate` in front of a second copy of it, the bench spawning both with the MCP SDK's
own client. Each round makes, in a rotating order,
  - bare:      a call straight to the upstream (no gate, no service);
  - unguarded: a call through the gate of a tool the policy does not name (stdio hop only);
  - once:      a guarded call of a `once` tool, a new key each call (reserve -> tool -> finish);
  - limit:     a guarded call of a `limit` tool (reserve of 1 unit -> tool -> finish);
  - alone:     reserve, finish and GET /health straight from this process (the service's share, no gate);
and at the end a repeat of some handled keys (refused: the tool does not run). The goal: a guarded call adds at most 3 ms p50
over the bare one. The upstream's own log counts the runs: each `once` key must have run exactly once.

    python -m memory_service.bench.gate [--quick] [--calls N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from ..client import AsyncMemoryClient
from ..testbed.probes import machine_info
from ..testbed.results import pyplot, write_figure
from ..testbed.service_runner import ServiceRunner
from ..testbed.stats import goal, latency_summary, ms, percentile
from .fairness import fake_llama
from .report import report

CALLS, QUICK_CALLS = 300, 60
WARMUP = 10
REPEATS = 10  # handled keys called again: each must be refused without running
GOAL_MS = 3.0
LIMIT = "bench-emails"
POLICY = f"""
[tools.process_item]
once = "item:{{item_id}}"

[tools.send_email]
limit = "{LIMIT}"
"""
UPSTREAM = "memory_service.testbed.mcp_upstream"
PATHS = ("bare", "unguarded", "once", "limit")
ALONE = ("alone_reserve", "alone_finish", "alone_health")  # from this process, no gate: the service's share
ROOT = Path(__file__).resolve().parents[2]  # so the children import this checkout, wherever they start


def _log(message: str) -> None:
    print(f"[bench gate] {message}", file=sys.stderr, flush=True)


def pythonpath() -> str:
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


def child_env(log: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMORY_", "GATE_"))}
    env["PYTHONPATH"] = pythonpath()
    env.update({"GATE_UPSTREAM_LOG": str(log), "MEMORY_LOG_LEVEL": "WARNING", **extra})
    return env


def upstream_client(log: Path) -> Client:
    return Client(StdioServerParameters(command=sys.executable, args=["-m", UPSTREAM], env=child_env(log)))


def gate_client(url: str, key: str, policy: Path, log: Path) -> Client:
    args = ["-m", "memory_service", "gate", "--policy", str(policy), "--", sys.executable, "-m", UPSTREAM]
    env = child_env(log, MEMORY_URL=url, MEMORY_API_KEY=key, MEMORY_AGENT_ID="bench-gate")
    return Client(StdioServerParameters(command=sys.executable, args=args, env=env))


async def timed(call: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    began = time.perf_counter()
    result = await call()
    return time.perf_counter() - began, result


async def measure(url: str, key: str, policy: Path, logs: Path, calls: int) -> dict[str, Any]:
    """Interleaved rounds of the four paths and of the service alone; then repeats of handled keys."""
    times: dict[str, list[float]] = {path: [] for path in (*PATHS, *ALONE)}
    run_id = secrets.token_hex(4)
    keys: list[str] = []
    async with (
        upstream_client(logs / "bare.jsonl") as bare,
        gate_client(url, key, policy, logs / "gate.jsonl") as via,
        AsyncMemoryClient(url, api_key=key) as memory,
        httpx.AsyncClient(base_url=url, trust_env=False) as plain,
    ):
        counter = 0

        async def one(path: str) -> None:
            nonlocal counter
            counter += 1
            item = f"{run_id}-{counter}"
            if path == "alone":  # reserve and finish straight from here, each timed
                took, granted = await timed(lambda: memory.gate.reserve("alone", key=item, agent_id="bench"))
                assert granted.reservation is not None, granted
                finished, _ = await timed(lambda: memory.gate.finish(granted.reservation, result="done"))
                health, _ = await timed(lambda: plain.get("/health"))
                for name, value in zip(ALONE, (took, finished, health), strict=True):
                    times[name].append(value)
                return
            if path == "bare":
                call = bare.call_tool("process_item", {"item_id": item})
            elif path == "unguarded":
                call = via.call_tool("lookup", {"item_id": item})
            elif path == "once":
                keys.append(item)
                call = via.call_tool("process_item", {"item_id": item})
            else:
                call = via.call_tool("send_email", {"to": f"{item}@example.com", "subject": "bench"})
            began = time.perf_counter()
            result = await call
            times[path].append(time.perf_counter() - began)
            if result.is_error:
                said = " ".join(getattr(part, "text", "") for part in result.content)
                raise RuntimeError(f"a {path} call failed: {said}")

        rounds = (*PATHS, "alone")
        for _ in range(WARMUP):  # connections, imports, first queries: not measured
            for path in rounds:
                await one(path)
        for values in times.values():
            values.clear()
        warm_keys = len(keys)
        for n in range(calls):
            for path in rounds[n % len(rounds) :] + rounds[: n % len(rounds)]:
                await one(path)
        refused = 0
        for item in keys[warm_keys : warm_keys + REPEATS]:
            result = await via.call_tool("process_item", {"item_id": item})
            refused += bool(result.is_error)
    runs = [json.loads(line) for line in (logs / "gate.jsonl").read_text().splitlines() if line.strip()]
    ran = [r["arguments"]["item_id"] for r in runs if r["tool"] == "process_item"]
    per_key = {k: ran.count(k) for k in keys}
    return {
        "paths": {path: latency_summary(times[path]) for path in PATHS},
        "added_over_bare": {
            path: {
                "p50_ms": ms((percentile(times[path], 50) or 0) - (percentile(times["bare"], 50) or 0)),
                "p95_ms": ms((percentile(times[path], 95) or 0) - (percentile(times["bare"], 95) or 0)),
            }
            for path in PATHS[1:]
        },
        "service_alone": {name.removeprefix("alone_"): latency_summary(times[name]) for name in ALONE},
        "once_keys": {
            "keys": len(keys),
            "ran_once": sum(1 for count in per_key.values() if count == 1),
            "ran_more_than_once": sum(1 for count in per_key.values() if count > 1),
            "never_ran": sum(1 for count in per_key.values() if count == 0),
            "repeats": min(REPEATS, len(keys) - warm_keys),
            "repeats_refused": refused,
        },
    }


def run(*, quick: bool, workdir: Path, calls: int | None = None) -> dict[str, Any]:
    key = secrets.token_urlsafe(12)
    calls = calls or (QUICK_CALLS if quick else CALLS)
    policy = workdir / "gate.toml"
    policy.write_text(POLICY)
    logs = workdir / "gate-logs"
    logs.mkdir(parents=True, exist_ok=True)
    fake_proc, fake_url = fake_llama()
    service = None
    try:
        _log("starting the memory service")
        service = ServiceRunner(
            workdir / "gate-data", api_keys={key: "bench-gate"}, llm_url=fake_url, env={"PYTHONPATH": pythonpath()}
        ).start()
        with service.client(key) as memory:
            memory.put(f"/v1/limits/{LIMIT}", json={"daily_limit": 10**9, "timezone": "UTC"}).raise_for_status()
        _log(f"{calls} calls of each path, interleaved")
        measured = anyio.run(measure, service.url, key, policy, logs, calls)
    finally:
        if service is not None:
            service.stop()
        fake_proc.terminate()
        fake_proc.wait(10)
    added = measured["added_over_bare"]
    keys = measured["once_keys"]
    measured["breakdown_p50_ms"] = breakdown(measured)
    failed = []
    if keys["ran_once"] != keys["keys"]:
        failed.append(f"of {keys['keys']} once keys, {keys['keys'] - keys['ran_once']} did not run exactly once")
    if keys["repeats_refused"] != keys["repeats"]:
        failed.append(f"{keys['repeats'] - keys['repeats_refused']} repeats of a handled key were not refused")
    return {
        "benchmark": "gate",
        "calls": calls,
        "upstream": f"python -m {UPSTREAM} over stdio (the MCP SDK's server)",
        **measured,
        "goals": {
            "once_added_p50_ms": goal(added["once"]["p50_ms"], GOAL_MS),
            "limit_added_p50_ms": goal(added["limit"]["p50_ms"], GOAL_MS),
        },
        "failed_checks": failed,
        "machine": machine_info(),
    }


def breakdown(measured: dict[str, Any]) -> dict[str, Any]:
    """Where a guarded call's added p50 goes: the gate's extra stdio hop (unguarded over bare), the service's
    reserve and finish as this process sees them, and the rest (the gate's own work and waiting)."""
    paths, alone = measured["paths"], measured["service_alone"]
    hop = round(paths["unguarded"]["p50_ms"] - paths["bare"]["p50_ms"], 2)
    reserve, finish = alone["reserve"]["p50_ms"], alone["finish"]["p50_ms"]
    out: dict[str, Any] = {
        "stdio_hop": hop,
        "reserve": reserve,
        "finish": finish,
        "http_floor": alone["health"]["p50_ms"],
    }
    for path in ("once", "limit"):
        added = measured["added_over_bare"][path]["p50_ms"]
        out[f"{path}_rest"] = round(added - hop - reserve - finish, 2)
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    """p50 and p95 of a tool call on each path."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = range(len(PATHS))
    ax.bar([x - 0.2 for x in xs], [result["paths"][p]["p50_ms"] or 0 for p in PATHS], 0.4, label="p50")
    ax.bar([x + 0.2 for x in xs], [result["paths"][p]["p95_ms"] or 0 for p in PATHS], 0.4, label="p95")
    ax.set_xticks(list(xs), ["bare upstream", "gate, unguarded", "gate, once", "gate, limit"])
    ax.set_ylabel("tool call, ms")
    ax.legend(fontsize=8)
    ax.set_title("a tool call, straight and through memory-service gate")
    write_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memory_service.bench.gate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_CALLS} calls of each path instead of {CALLS}")
    parser.add_argument("--calls", type=int, help="calls of each path")
    parser.add_argument("--out", type=Path, help="also write JSON and PNG here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="memory-bench-gate-") as tmp:
        result = run(quick=args.quick, workdir=Path(tmp), calls=args.calls)
    met = [g["met"] for g in result["goals"].values()]
    return report(result, "gate", plot, args.out, failed=bool(result["failed_checks"]) or False in met)


if __name__ == "__main__":
    raise SystemExit(main())
