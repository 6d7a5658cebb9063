"""The soak benchmark's verdicts: what the service acknowledged must all be there after the last restart.

Each check returns counts and a pass flag, so the JSON says how much was checked, not only whether it
passed. Reads retry through a restart's last moments like the agents do.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from ..client.service import service_client
from ..testbed.stats import latency_summary, percentile
from .soak_load import OP_DEADLINE_S, Recorder, Sample, Team


def _get(client: httpx.Client, path: str, params: dict[str, str] | None = None, tries: int = 20) -> httpx.Response:
    """A read, retried through connection errors and 5xx for a few seconds; the last answer otherwise."""
    for attempt in range(tries):
        try:
            response = client.get(path, params=params)
            if response.status_code < 500 or attempt == tries - 1:
                return response
        except httpx.HTTPError:
            if attempt == tries - 1:
                raise
        time.sleep(0.5)
    raise AssertionError("unreachable")


def saves_kept(client: httpx.Client, team: Team) -> dict[str, Any]:
    """Every acknowledged, not forgotten, memory is readable with its text; every forgotten one is gone."""
    missing: list[str] = []
    for memory_id, text in sorted(team.saved.items()):
        response = _get(client, f"/v1/memories/{memory_id}")
        if response.status_code != 200 or response.json().get("text") != text:
            missing.append(f"{memory_id}: {response.status_code}")
    back = [m for m in sorted(team.forgotten) if _get(client, f"/v1/memories/{m}").status_code != 404]
    return {
        "acknowledged": len(team.saved),
        "lost": len(missing) + len(team.lost_on_forget),
        "lost_examples": (missing + [f"{m}: 404 on first forget" for m in team.lost_on_forget])[:10],
        "forgotten": len(team.forgotten),
        "forgotten_back": len(back),
        "forget_unanswered": len(team.uncertain_forget),
    }


def handled_kept(client: httpx.Client, team: Team) -> dict[str, Any]:
    lost = [k for k in sorted(team.handled) if _get(client, "/v1/handled", {"key": k}).status_code != 200]
    return {"acknowledged": len(team.handled), "lost": len(lost), "lost_examples": lost[:10]}


def counter_exact(client: httpx.Client, team: Team) -> dict[str, Any]:
    """The service's count equals the consumes it allowed (each counted once through retries), within the limit."""
    used = int(_get(client, f"/v1/limits/{team.limit}").json()["used"])
    low, high = team.consumed, team.consumed + team.unresolved_consumes
    return {
        "limit": team.limit,
        "daily_limit": team.daily_limit,
        "allowed_answers": team.consumed,
        "unanswered": team.unresolved_consumes,
        "service_used": used,
        "over_limit": max(0, used - team.daily_limit),
        "exact": low <= used <= high,
    }


def export_clean(client: httpx.Client, team: Team, other: Team, recorder: Recorder) -> dict[str, Any]:
    """The team's export holds every acknowledged memory and nothing of the other team."""
    response = _get(client, "/v1/export")
    records = [json.loads(line) for line in response.text.splitlines() if line.strip()]
    recorder.cross_check(records, other, f"export of {team.name}")
    exported = {r.get("id") for r in records}
    return {"status": response.status_code, "lines": len(records), "missing": len(set(team.saved) - exported)}


def final_checks(url: str, teams: list[Team], recorder: Recorder) -> dict[str, Any]:
    """Every check against the restarted service, per team."""
    out: dict[str, Any] = {}
    for team, other in ((teams[0], teams[1]), (teams[1], teams[0])):
        with service_client(url, team.key, timeout=60.0) as client:
            out[team.name] = {
                "saves": saves_kept(client, team),
                "handled": handled_kept(client, team),
                "counter": counter_exact(client, team),
                "export": export_clean(client, team, other, recorder),
            }
    return out


def latencies(samples: list[Sample]) -> dict[str, Any]:
    """p50/p99 per operation and phase: of the attempt that was answered, and with every retry."""
    out: dict[str, Any] = {}
    for op in sorted({s.op for s in samples}):
        out[op] = {}
        for phase in ("quiet", "faulted"):
            mine = [s for s in samples if s.op == op and s.phase == phase]
            attempt = latency_summary([s.attempt_s for s in mine])
            out[op][phase] = {
                "n": attempt["n"],
                "p50_ms": attempt["p50_ms"],
                "p99_ms": attempt["p99_ms"],
                "max_ms": attempt["max_ms"],
                "with_retries_p99_ms": latency_summary([s.total_s for s in mine])["p99_ms"],
                "with_retries_max_ms": latency_summary([s.total_s for s in mine])["max_ms"],
                "retried": sum(1 for s in mine if s.retries),
            }
    return out


def p99_bound(samples: list[Sample], op: str, bound: float) -> dict[str, Any]:
    """The faulted phase's p99 (answered attempts) against `bound` times the quiet baseline's."""
    quiet = percentile([s.attempt_s for s in samples if s.op == op and s.phase == "quiet"], 99)
    faulted = percentile([s.attempt_s for s in samples if s.op == op and s.phase == "faulted"], 99)
    ok = quiet is not None and faulted is not None and faulted <= bound * quiet
    return {
        "quiet_p99_ms": None if quiet is None else round(quiet * 1000, 2),
        "faulted_p99_ms": None if faulted is None else round(faulted * 1000, 2),
        "bound": f"<= {bound}x quiet",
        "ratio": None if not quiet or faulted is None else round(faulted / quiet, 2),
        "pass": ok,
    }


def verdicts(
    checks: dict[str, Any], recorder: Recorder, bound: float, fault_errors: list[str] | None = None
) -> dict[str, Any]:
    """One entry per invariant, with its counts and pass flag."""
    teams = list(checks.values())
    errors = fault_errors or []
    lost = sum(t["saves"]["lost"] + t["export"]["missing"] for t in teams)
    counters = [t["counter"] for t in teams]
    return {
        "acknowledged_saves_lost": {
            "checked": sum(t["saves"]["acknowledged"] for t in teams),
            "lost": lost,
            "pass": lost == 0,
        },
        "forgotten_stay_forgotten": {
            "checked": sum(t["saves"]["forgotten"] for t in teams),
            "returned": sum(t["saves"]["forgotten_back"] for t in teams),
            "pass": all(t["saves"]["forgotten_back"] == 0 for t in teams),
        },
        "handled_keys_lost": {
            "checked": sum(t["handled"]["acknowledged"] for t in teams),
            "lost": sum(t["handled"]["lost"] for t in teams),
            "pass": all(t["handled"]["lost"] == 0 for t in teams),
        },
        "counters_exact": {
            "limits": counters,
            "over_limit": sum(c["over_limit"] for c in counters),
            "pass": all(c["exact"] and c["over_limit"] == 0 for c in counters),
        },
        "no_cross_team_answer": dict(recorder.cross_team)
        | {"examples": recorder.violations[:5], "pass": recorder.cross_team["violations"] == 0},
        "faults_recovered": {"errors": errors, "pass": not errors},
        "every_operation_answered": {
            "unanswered": dict(recorder.unresolved),
            "within_s": OP_DEADLINE_S,
            "pass": not any(recorder.unresolved.values()),
        },
        "recall_p99_bound": p99_bound(recorder.samples, "recall", bound),
        "ack_p99_bound": p99_bound(recorder.samples, "remember", bound),
    }
