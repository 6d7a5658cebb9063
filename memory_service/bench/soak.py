"""`memory-service bench soak --minutes N`: a steady mixed load through crashes, and what survives them.

Agents of two teams remember, recall, consume a daily limit, mark events handled, list and forget
against a real `memory-service serve` and a real llama-server (the default model). The first part
of the run (10%, at least --baseline-min-s) is quiet: the baseline, measured in the same run under
the same load. Then faults come on a schedule: the service SIGKILLed and restarted, llama-server
SIGKILLed and restarted, the model frozen (SIGSTOP), the data disk full (a tmpfs of our own; skipped,
with the reason, when it cannot be mounted). At the end the service is killed once more, restarted,
and checked: no acknowledged save, handled key or forget lost, every counter exact and never over
its limit, no answer of one team holding the other's data, recall and ack p99 within --bound times
the quiet baseline. Prints one JSON document; exit status 1 when an invariant fails.

    python -m memory_service.bench.soak --minutes 10
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..testbed.probes import machine_info
from ..testbed.results import write_json
from ..testbed.service_runner import ServiceRunner, start_llama
from .soak_checks import final_checks, latencies, verdicts
from .soak_faults import KINDS, Injector, SmallDisk, schedule
from .soak_load import MIX, Agent, Recorder, Team
from .soak_options import add_soak_arguments


def _log(message: str) -> None:
    print(f"[soak] {message}", file=sys.stderr, flush=True)


def make_teams(args: argparse.Namespace, total_s: float) -> list[Team]:
    """Two teams with unique marker words; each limit about half of what its agents will ask for."""
    share = MIX["consume"] / sum(MIX.values())
    expected = args.agents_per_team * args.rate * total_s * share
    return [
        Team(
            name=f"soak-{letter}",
            key=secrets.token_urlsafe(16),
            marker=f"mk{letter}{secrets.token_hex(4)}",
            limit=f"soak-{letter}-calls",
            daily_limit=max(3, int(expected * 0.5)),
        )
        for letter in "ab"
    ]


def create_limits(service: ServiceRunner, teams: list[Team]) -> None:
    for team in teams:
        with service.client(team.key) as client:
            response = client.put(f"/v1/limits/{team.limit}", json={"daily_limit": team.daily_limit, "timezone": "UTC"})
            response.raise_for_status()


def parse_kinds(raw: str) -> list[str]:
    kinds = [k.strip() for k in raw.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise SystemExit(f"unknown fault kind(s) {unknown}; known: {', '.join(KINDS)}")
    return kinds


def drive(args: argparse.Namespace, service: ServiceRunner, injector: Injector, teams: list[Team]) -> Recorder:
    """The load, the quiet baseline, then the faults on schedule; returns when every agent stopped."""
    total_s = args.minutes * 60.0
    baseline_s = min(total_s / 2, max(total_s * args.baseline_fraction, args.baseline_min_s))
    recorder = Recorder()
    agents = [
        Agent(service.url, team, other, f"{team.name}-agent-{i}", args.rate, recorder)
        for team, other in ((teams[0], teams[1]), (teams[1], teams[0]))
        for i in range(args.agents_per_team)
    ]
    plan = schedule(parse_kinds(args.faults), baseline_s, total_s - 10.0, args.fault_every_s)
    injector.started = time.monotonic()
    for agent in agents:
        agent.thread.start()
    _log(f"quiet baseline for {baseline_s:.0f}s, then {len(plan)} fault(s) until {total_s:.0f}s")
    time.sleep(baseline_s)
    recorder.phase = "faulted"
    for at_s, kind in plan:
        time.sleep(max(0.0, injector.started + at_s - time.monotonic()))
        _log(f"{time.monotonic() - injector.started:.0f}s: {kind}")
        injector.inject(kind)
    time.sleep(max(0.0, injector.started + total_s - time.monotonic()))
    _log("load done; waiting for the agents' last operations")
    for agent in agents:
        agent.stop.set()
    for agent in agents:
        agent.thread.join()
    return recorder


def log_errors(path: Path, keep: int = 12) -> list[str]:
    """The service log's last error lines (the log dies with the temporary directory)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line[:300] for line in lines if "ERROR" in line or "Error:" in line][-keep:]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The whole soak in a temporary directory; the result as a JSON-ready dict."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="memory-soak-") as tmp:
        workdir = Path(tmp)
        disk = SmallDisk(workdir / "disk")
        if "disk_full" in parse_kinds(args.faults):
            disk.mount()
        try:
            return soak(args, workdir, disk) | {"wall_time_s": round(time.monotonic() - started, 1)}
        finally:
            disk.unmount()


def soak(args: argparse.Namespace, workdir: Path, disk: SmallDisk) -> dict[str, Any]:
    teams = make_teams(args, args.minutes * 60.0)
    _log(f"starting llama-server ({args.model})")
    llama = start_llama(args.model, workdir / "llama")
    data_dir = (disk.mount_point if disk.mounted else workdir) / "data"
    service = ServiceRunner(data_dir, api_keys={t.key: t.name for t in teams}, llm_url=llama.url, model=args.model)
    service.log_path = workdir / "service.log"  # never on the disk we fill
    try:
        service.start()
        service.wait_model_ready()
        create_limits(service, teams)
        injector = Injector(service, llama, disk, time.monotonic())
        recorder = drive(args, service, injector, teams)
        _log("final SIGKILL and restart, then the checks")
        injector.inject("final_kill")
        checks = final_checks(service.url, teams, recorder)
    except Exception:
        _log(f"service log tail:\n{service.log_tail()}")
        raise
    finally:
        service.stop()
        llama.stop()
    errors = [f"{f.kind} at {f.at_s:.0f}s: {f.detail['error']}" for f in injector.faults if "error" in f.detail]
    invariants = verdicts(checks, recorder, args.bound, errors)
    return {
        "benchmark": "soak",
        "minutes": args.minutes,
        "model": args.model,
        "agents": 2 * args.agents_per_team,
        "rate_per_agent_s": args.rate,
        "faults": [f.as_json() for f in injector.faults],
        "faults_skipped": injector.skipped,
        "invariants": invariants,
        "failed_invariants": [name for name, v in invariants.items() if not v["pass"]],
        "checks": checks,
        "latency": latencies(recorder.samples),
        "answers": {op: dict(counts) for op, counts in recorder.statuses.items()},
        "unanswered_ops": dict(recorder.unresolved),
        "observations": {
            "http_5xx": {
                op: {code: n for code, n in counts.items() if code.startswith("5")}
                for op, counts in recorder.statuses.items()
                if any(code.startswith("5") for code in counts)
            },
            "service_log_errors": log_errors(service.log_path),
        },
        "machine": machine_info(),
    }


def run_soak(args: argparse.Namespace) -> int:
    """Run, print the JSON, write it to --out/soak.json; 1 when an invariant failed."""
    result = run(args)
    out = Path(getattr(args, "out", None) or "bench-results")
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "soak.json", result)
    print(json.dumps(result, indent=2, default=str))
    return 1 if result["failed_invariants"] else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m memory_service.bench.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", default="bench-results", help="directory for soak.json")
    return run_soak(add_soak_arguments(parser).parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
