"""What the memory proxy costs a turn: the same chat turn sent straight to the upstream and through
`memory-service proxy`, interleaved in one run, p50/p95 of each and their difference.

Real processes on loopback: `memory-service serve` (with a few saved texts, so sessions get a real brief),
`memory-service proxy` in a process of its own, and the checkout's fake llama-server as the upstream (real
HTTP, llama-server's API, answering in a millisecond or two, so the proxy's share is what shows). A turn is a
non-streamed (and, apart, a streamed) chat request of a six-message conversation with its session header; the
session's first request, the one that recalls the brief, is timed apart (`first_request`). The goal: the proxy
adds at most 5 ms p50 to a later turn. The client is httpx on one keep-alive connection per path.

    python -m memory_service.bench.proxy [--quick] [--turns N] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from ..llm.runtime.server import free_port, stop_group
from ..testbed.probes import machine_info
from ..testbed.results import pyplot, write_figure
from ..testbed.service_runner import ServiceRunner
from ..testbed.stats import goal, latency_summary, ms, percentile
from .fairness import fake_llama
from .report import report

TURNS, QUICK_TURNS = 300, 60
SESSIONS, QUICK_SESSIONS = 20, 6
GOAL_MS = 5.0
UPSTREAM_TOKENS_PER_S = 200_000.0  # a reply of ~20 tokens in a tenth of a millisecond: the proxy's share shows
NOTES = [
    "The staging deploy key lives in vault path ops/deploy-{n}.",
    "The nightly backup of db-{n} runs at 02:{n:02d} and keeps 14 days.",
    "Ticket TK-{n} was closed by the triage agent after the refund.",
    "The outbound email quota is 50 a day; {n} were sent on Monday.",
]
SYSTEM = "You are the ops agent of a small team. Answer in one sentence."
HISTORY = [
    {"role": "user", "content": "Where is the staging deploy key?"},
    {"role": "assistant", "content": "In the vault."},
    {"role": "user", "content": "And when does the backup run?"},
    {"role": "assistant", "content": "At night."},
    {"role": "user", "content": "Thanks. Anything else about staging?"},
]


def _log(message: str) -> None:
    print(f"[bench proxy] {message}", file=sys.stderr, flush=True)


def start_proxy(upstream: str, memory_url: str, key: str, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`memory-service proxy` in its own process (its own interpreter and GIL), once /health answers."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}
    env.update({"MEMORY_API_KEY": key, "MEMORY_LOG_LEVEL": "WARNING"})
    cmd = [sys.executable, "-m", "memory_service", "proxy", "--upstream", upstream, "--url", memory_url]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [*cmd, "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the proxy exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    stop_group(proc, 5)
    raise RuntimeError(f"the proxy did not answer /health within 60 s: {log_path.read_text()[-2000:]}")


def _turn(client: httpx.Client, session: str, *, stream: bool) -> float:
    """One turn's seconds, to the last byte of the answer."""
    body = {"model": "bench", "messages": [{"role": "system", "content": SYSTEM}, *HISTORY], "stream": stream}
    began = time.perf_counter()
    with client.stream("POST", "/v1/chat/completions", json=body, headers={"X-Memory-Session": session}) as answer:
        for _ in answer.iter_raw():
            pass
        if answer.status_code != 200:
            raise RuntimeError(f"a turn answered {answer.status_code}")
    return time.perf_counter() - began


def measure(direct_url: str, proxy_url: str, turns: int, sessions: int) -> dict[str, Any]:
    """Interleaved: each turn goes once straight and once through the proxy, in alternating order."""
    out: dict[str, Any] = {}
    headers = {"X-Memory-Agent": "bench"}
    with (
        httpx.Client(base_url=direct_url, timeout=30, trust_env=False) as direct,
        httpx.Client(base_url=proxy_url, timeout=30, trust_env=False, headers=headers) as via,
    ):
        first = [_turn(via, f"bench-first-{n}", stream=False) for n in range(sessions)]
        out["first_request"] = latency_summary(first)
        for stream in (False, True):
            name = "stream" if stream else "non_stream"
            _turn(via, f"bench-{name}", stream=stream)  # the session's first request: its one recall
            for _ in range(10):  # warm both connections and paths
                _turn(direct, "warm", stream=stream)
                _turn(via, f"bench-{name}", stream=stream)
            straight: list[float] = []
            through: list[float] = []
            for n in range(turns):
                pair = [(straight, direct), (through, via)]
                for times, client in pair if n % 2 == 0 else reversed(pair):
                    times.append(_turn(client, f"bench-{name}", stream=stream))
            p50_added = (percentile(through, 50) or 0) - (percentile(straight, 50) or 0)
            p95_added = (percentile(through, 95) or 0) - (percentile(straight, 95) or 0)
            out[name] = {
                "direct": latency_summary(straight),
                "proxy": latency_summary(through),
                "added_p50_ms": ms(p50_added),
                "added_p95_ms": ms(p95_added),
            }
    return out


def run(*, quick: bool, workdir: Path, turns: int | None = None) -> dict[str, Any]:
    key = secrets.token_urlsafe(12)
    turns = turns or (QUICK_TURNS if quick else TURNS)
    sessions = QUICK_SESSIONS if quick else SESSIONS
    fake_proc, fake_url = fake_llama(UPSTREAM_TOKENS_PER_S)
    service = None
    proxy_proc = None
    try:
        _log("starting the memory service")
        service = ServiceRunner(workdir / "proxy-data", api_keys={key: "bench-proxy"}, llm_url=fake_url).start()
        with service.client(key) as memory:
            for n in range(12):
                text = NOTES[n % len(NOTES)].format(n=n + 1)
                memory.post("/v1/remember", json={"text": text, "agent_id": "bench"}).raise_for_status()
        proxy_proc, proxy_url = start_proxy(fake_url, service.url, key, workdir / "proxy.log")
        _log(f"{turns} turns each way, non-streamed then streamed")
        result: dict[str, Any] = {
            "benchmark": "proxy",
            "turns": turns,
            "upstream": "the checkout's fake llama-server (tests/fakes)",
            **measure(fake_url, proxy_url, turns, sessions),
        }
    finally:
        if proxy_proc is not None:
            stop_group(proxy_proc, 10)
        if service is not None:
            service.stop()
        fake_proc.terminate()
        fake_proc.wait(10)
    result["goals"] = {
        "non_stream_added_p50_ms": goal(result["non_stream"]["added_p50_ms"], GOAL_MS),
        "stream_added_p50_ms": goal(result["stream"]["added_p50_ms"], GOAL_MS),
    }
    result["machine"] = machine_info()
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    """p50 and p95 of a turn, straight and through the proxy, non-streamed and streamed."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    names = [(k, side) for k in ("non_stream", "stream") for side in ("direct", "proxy")]
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [result[k][s]["p50_ms"] or 0 for k, s in names], 0.4, label="p50")
    ax.bar([x + 0.2 for x in xs], [result[k][s]["p95_ms"] or 0 for k, s in names], 0.4, label="p95")
    ax.set_xticks(list(xs), [f"{k}\n{s}" for k, s in names])
    ax.set_ylabel("turn, ms")
    ax.legend(fontsize=8)
    ax.set_title("a chat turn, straight to the upstream and through the proxy")
    write_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memory_service.bench.proxy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_TURNS} turns each way instead of {TURNS}")
    parser.add_argument("--turns", type=int, help="turns each way, each of non-streamed and streamed")
    parser.add_argument("--out", type=Path, help="also write JSON and PNG here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="memory-bench-proxy-") as tmp:
        result = run(quick=args.quick, workdir=Path(tmp), turns=args.turns)
    met = [g["met"] for g in result["goals"].values()]
    return report(result, "proxy", plot, args.out, failed=False in met)


if __name__ == "__main__":
    raise SystemExit(main())
