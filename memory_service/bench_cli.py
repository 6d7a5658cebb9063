"""`memory-service bench`: the benchmark suite, each figure printed beside its goal.

Runs scripts/bench_*.py in one process tree with one shared llama-server
(default model), so every benchmark on this noisy shared box is compared with
a baseline measured in the same run. Writes one JSON and one PNG per benchmark
into --out, plus summary.json with every goal and its verdict.
--quick shrinks sizes (1k/10k facts, fewer requests) for a smoke run.
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO_ROOT = Path(__file__).resolve().parents[1]
LIMITS_CONCURRENCY = 32


def _scripts():  # type: ignore[no-untyped-def]
    """The benchmark modules from the source tree's scripts/ (not part of the installed package)."""
    if not (REPO_ROOT / "scripts" / "bench_common.py").exists():
        raise SystemExit("memory-service bench needs the source tree (scripts/bench_*.py): run it from a checkout")
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from scripts import bench_common, bench_extraction, bench_recall, bench_remember, bench_rss

    return bench_common, bench_extraction, bench_recall, bench_remember, bench_rss


def _log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def run_limits(bench_common: Any, llm_url: str, quick: bool, workdir: Path) -> dict[str, Any]:
    """scripts/bench_limits.py (another engineer's), through its command line: against the full service, and self-served."""
    script = REPO_ROOT / "scripts" / "bench_limits.py"
    if not script.exists():
        return {"benchmark": "limits", "skipped": "scripts/bench_limits.py does not exist yet"}
    count = "1000" if quick else "5000"
    key = secrets.token_urlsafe(12)
    out: dict[str, Any] = {"benchmark": "limits", "script": "scripts/bench_limits.py"}
    service = bench_common.ServiceRunner(workdir / "limits-data", api_keys={key: "bench-limits"},
                                         llm_url=llm_url).start()
    try:
        runs = {
            "full_service": [sys.executable, str(script), "--url", service.url, f"--api-key={key}"],
            "self_serve_minimal_app": [sys.executable, str(script), "--self-serve"],
        }
        for name, cmd in runs.items():
            proc = subprocess.run([*cmd, "--count", count, "--concurrency", str(LIMITS_CONCURRENCY)],
                                  capture_output=True, text=True, timeout=600)
            try:
                out[name] = json.loads(proc.stdout)
            except ValueError:
                out[name] = {"error": f"exit {proc.returncode}", "stdout": proc.stdout[-1000:],
                             "stderr": proc.stderr[-2000:]}
            out[name]["exit_code"] = proc.returncode
        out["service_rss_after"] = service.rss()
    finally:
        service.stop()
    goal = (out.get("full_service") or {}).get("goal") or {}
    out["goals"] = {}
    for name in runs:
        result = out.get(name) or {}
        if "requests_per_s" in goal:
            out["goals"][f"{name}_requests_per_s"] = bench_common.goal(
                result.get("requests_per_s"), float(goal["requests_per_s"]), at_most=False)
        out["goals"][f"{name}_over_limit"] = bench_common.goal(result.get("over_limit"), 0)
    out["machine"] = bench_common.machine_info()
    return out


def plot_limits(bench_common: Any, result: dict[str, Any], path: Path) -> None:
    plt = bench_common.pyplot()
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
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_bench(args: argparse.Namespace) -> int:
    bench_common, bench_extraction, bench_recall, bench_remember, bench_rss = _scripts()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    quick = bool(getattr(args, "quick", False))
    started = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="memory-bench-") as tmp:
        workdir = Path(tmp)
        _log("starting llama-server (default model), shared by every benchmark")
        llama = bench_common.start_llama("default", workdir / "llama")
        try:
            steps: list[tuple[str, Callable[[], dict[str, Any]], Callable[[dict[str, Any], Path], None]]] = [
                # its own llama-server (no host prompt cache), so neither path is served the other's prompt
                ("extraction", lambda: bench_extraction.run(quick=quick, workdir=workdir),
                 bench_extraction.plot),
                ("remember", lambda: bench_remember.run(llm_url=llama.url, quick=quick, workdir=workdir),
                 bench_remember.plot),
                ("recall", lambda: bench_recall.run(quick=quick, workdir=workdir), bench_recall.plot),
                ("limits", lambda: run_limits(bench_common, llama.url, quick, workdir),
                 lambda r, p: plot_limits(bench_common, r, p)),
                ("rss", lambda: bench_rss.run(llm_url=llama.url, quick=quick, workdir=workdir,
                                              observed_elsewhere=_rss_seen(results)), bench_rss.plot),
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
                bench_common.write_json(out / f"{name}.json", result)
                if "error" not in result and not result.get("skipped"):
                    try:
                        plotter(result, out / f"{name}.png")
                    except Exception as exc:
                        result["plot_error"] = repr(exc)
                print(json.dumps({name: result}, indent=2, default=str))
                _log(f"{name}: done in {result['wall_time_s']:.0f}s")
        finally:
            llama.stop()
    summary = {
        "quick": quick,
        "goals": {name: r.get("goals") or {"error": r.get("error") or r.get("skipped")} for name, r in results.items()},
        "total_time_s": round(time.monotonic() - started, 1),
        "machine": bench_common.machine_info(),
    }
    bench_common.write_json(out / "summary.json", summary)
    print(json.dumps({"summary": summary}, indent=2, default=str))
    return 1 if any("error" in r for r in results.values()) else 0


def _rss_seen(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """RSS readings the earlier benchmarks took of their own service processes."""
    seen: dict[str, Any] = {}
    remember = results.get("remember") or {}
    for point, value in (remember.get("service_rss") or {}).items():
        seen[f"remember {point}"] = value
    for level, data in ((results.get("recall") or {}).get("levels") or {}).items():
        seen[f"recall {level} facts"] = data.get("service_rss")
    if (results.get("limits") or {}).get("service_rss_after"):
        seen["limits after"] = results["limits"]["service_rss_after"]
    return seen
