"""`memory-service bench`: the benchmark suite, each figure printed beside its goal.

Runs the benchmarks of this package (extraction, remember, fairness, consolidation, recall, limits,
transfer, webhooks, proxy, gate, rss, scale; each also runnable alone as `python -m memory_service.bench.<name>`)
in one process tree with one shared llama-server (default model), so every benchmark on a noisy shared machine is
compared with a baseline measured in the same run. Writes one JSON and one PNG per benchmark into
--out (PNGs need the `bench` extra), plus summary.json with every goal and its verdict.
--quick shrinks sizes (1k/10k facts, 500 memories to list/export/forget, fewer requests) for a smoke run.
`memory-service bench soak --minutes N` runs the fault-injection soak instead (bench/soak.py).
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..testbed.probes import machine_info
from ..testbed.results import pyplot, save_plot, write_figure, write_json
from ..testbed.service_runner import ServiceRunner, start_llama
from ..testbed.stats import goal
from . import consolidation, extraction, fairness, gate, proxy, recall, remember, rss, scale, transfer, webhooks
from .options import add_bench_arguments

LIMITS_CONCURRENCY = 32
LIMITS_MODULE = "memory_service.bench.limits"  # run with `python -m`, in a process of its own


def _log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def run_limits(llm_url: str, quick: bool, workdir: Path) -> dict[str, Any]:
    """The limits benchmark through its command line: against the full service, and self-served.

    A child process, unlike the other benchmarks, exactly as when it runs alone: its client gets an
    interpreter of its own (its event loop, and the process-wide sniffio shortcut its main() applies),
    and nothing in this process competes with it for the GIL while it measures.
    """
    count = "1000" if quick else "5000"
    key = secrets.token_urlsafe(12)
    out: dict[str, Any] = {"benchmark": "limits", "module": LIMITS_MODULE}
    service = ServiceRunner(workdir / "limits-data", api_keys={key: "bench-limits"}, llm_url=llm_url).start()
    try:
        runs = {
            "full_service": [sys.executable, "-m", LIMITS_MODULE, "--url", service.url, f"--api-key={key}"],
            "self_serve_minimal_app": [sys.executable, "-m", LIMITS_MODULE, "--self-serve"],
        }
        for name, cmd in runs.items():
            proc = subprocess.run(
                [*cmd, "--count", count, "--concurrency", str(LIMITS_CONCURRENCY)],
                capture_output=True,
                text=True,
                timeout=600,
            )
            try:
                out[name] = json.loads(proc.stdout)
            except ValueError:
                out[name] = {
                    "error": f"exit {proc.returncode}",
                    "stdout": proc.stdout[-1000:],
                    "stderr": proc.stderr[-2000:],
                }
            out[name]["exit_code"] = proc.returncode
        out["service_rss_after"] = service.rss()
    finally:
        service.stop()
    target = (out.get("full_service") or {}).get("goal") or {}
    out["goals"] = {}
    for name in runs:
        result = out.get(name) or {}
        if "requests_per_s" in target:
            out["goals"][f"{name}_requests_per_s"] = goal(
                result.get("requests_per_s"), float(target["requests_per_s"]), at_most=False
            )
        out["goals"][f"{name}_over_limit"] = goal(result.get("over_limit"), 0)
    out["machine"] = machine_info()
    return out


def plot_limits(result: dict[str, Any], path: Path) -> None:
    """Requests/s against the goal, and p50/p99 latency, for both runs."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = [n for n in ("full_service", "self_serve_minimal_app") if isinstance(result.get(n), dict)]
    left.bar(names, [result[n].get("requests_per_s") or 0 for n in names])
    target = ((result.get("full_service") or {}).get("goal") or {}).get("requests_per_s")
    if target:
        left.axhline(float(target), color="red", ls="--", lw=1, label=f"goal {target}/s")
        left.legend(fontsize=8)
    left.set_title("consume requests/s (32 clients)")
    xs = range(len(names))
    right.bar([x - 0.2 for x in xs], [result[n].get("p50_ms") or 0 for n in names], 0.4, label="p50")
    right.bar([x + 0.2 for x in xs], [result[n].get("p99_ms") or 0 for n in names], 0.4, label="p99")
    right.set_xticks(list(xs), names)
    right.set_ylabel("ms")
    right.legend(fontsize=8)
    right.set_title("consume latency")
    write_figure(fig, path)


def run_bench(args: argparse.Namespace) -> int:
    """Every benchmark in turn; exit code 1 when one of them failed (its error or failed checks are in its JSON).

    `bench soak` runs the soak alone: it kills its own service and llama-server, so it shares neither.
    """
    if getattr(args, "step", None) == "soak":
        from .soak import run_soak

        return run_soak(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    quick = bool(getattr(args, "quick", False))
    started = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="memory-bench-") as tmp:
        workdir = Path(tmp)
        _log("starting llama-server (default model), shared by every benchmark")
        llama = start_llama("default", workdir / "llama")
        try:
            steps: list[tuple[str, Callable[[], dict[str, Any]], Callable[[dict[str, Any], Path], None]]] = [
                # its own llama-server (no host prompt cache), so neither path is served the other's prompt
                ("extraction", lambda: extraction.run(quick=quick, workdir=workdir), extraction.plot),
                ("remember", lambda: remember.run(llm_url=llama.url, quick=quick, workdir=workdir), remember.plot),
                # on the real model; `python -m memory_service.bench.fairness` alone runs it on a fixed-delay fake
                ("fairness", lambda: fairness.run(llm_url=llama.url, quick=quick, workdir=workdir), fairness.plot),
                (
                    "consolidation",
                    lambda: consolidation.run(llm_url=llama.url, quick=quick, workdir=workdir),
                    consolidation.plot,
                ),
                ("recall", lambda: recall.run(quick=quick, workdir=workdir, llm_url=llama.url), recall.plot),
                ("limits", lambda: run_limits(llama.url, quick, workdir), plot_limits),
                ("transfer", lambda: transfer.run(quick=quick, workdir=workdir), transfer.plot),
                ("webhooks", lambda: webhooks.run(llm_url=llama.url, quick=quick, workdir=workdir), webhooks.plot),
                # against the checkout's fake llama-server: what the proxy adds, not what the model costs
                ("proxy", lambda: proxy.run(quick=quick, workdir=workdir), proxy.plot),
                # the same fake: what the gate adds to a tool call (an MCP server of the package as the upstream)
                ("gate", lambda: gate.run(quick=quick, workdir=workdir), gate.plot),
                (
                    "rss",
                    lambda: rss.run(
                        llm_url=llama.url, quick=quick, workdir=workdir, observed_elsewhere=_rss_seen(results)
                    ),
                    rss.plot,
                ),
                # its own PostgreSQL and Chroma server; last, so a machine without PostgreSQL loses only it
                ("scale", lambda: scale.run(llm_url=llama.url, quick=quick, workdir=workdir), scale.plot),
            ]
            for name, runner, plotter in steps:
                _log(f"{name}: running")
                step_started = time.monotonic()
                try:
                    result = runner()
                except Exception as exc:  # one broken benchmark must not hide the others' figures
                    result = {"benchmark": name, "error": f"{type(exc).__name__}: {exc}"}
                result["wall_time_s"] = round(time.monotonic() - step_started, 1)
                results[name] = result
                write_json(out / f"{name}.json", result)
                if "error" not in result:
                    try:
                        save_plot(plotter, result, out / f"{name}.png")
                    except Exception as exc:
                        result["plot_error"] = repr(exc)
                print(json.dumps({name: result}, indent=2, default=str))
                _log(f"{name}: done in {result['wall_time_s']:.0f}s")
        finally:
            llama.stop()
    summary = {
        "quick": quick,
        "goals": {name: r.get("goals") or {"error": r.get("error")} for name, r in results.items()},
        "total_time_s": round(time.monotonic() - started, 1),
        "machine": machine_info(),
    }
    write_json(out / "summary.json", summary)
    print(json.dumps({"summary": summary}, indent=2, default=str))
    return 1 if any("error" in r or r.get("failed_checks") for r in results.values()) else 0


def _rss_seen(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """RSS readings the earlier benchmarks took of their own service processes."""
    seen: dict[str, Any] = {}
    for point, value in ((results.get("remember") or {}).get("service_rss") or {}).items():
        seen[f"remember {point}"] = value
    for level, data in ((results.get("recall") or {}).get("levels") or {}).items():
        seen[f"recall {level} facts"] = data.get("service_rss")
    if (results.get("limits") or {}).get("service_rss_after"):
        seen["limits after"] = results["limits"]["service_rss_after"]
    if (results.get("transfer") or {}).get("service_rss_end"):
        seen["transfer end"] = results["transfer"]["service_rss_end"]
    return seen


def main(argv: list[str] | None = None) -> int:
    """`python -m memory_service.bench.cli`: the same as `memory-service bench`."""
    parser = add_bench_arguments(
        argparse.ArgumentParser(
            prog="memory-service bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
    )
    return run_bench(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
