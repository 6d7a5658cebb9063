"""The agent eval's numbers: per task and profile over the seeds, k/N with a 95% interval, the harness audit, then
a markdown table to paste into a note.

Success comes from the scoring by state; tool calls, errors (and whether each was recovered), prompt tokens
(the model server's usage counts) and wall time come from the sessions as measured. A rate of a few runs
without its interval reads as more than it is, so every rate is given as k/N with its Wilson interval. The
audit sums the calls the loop found in the model's raw replies and did not run (agent_loop's `calls_lost`):
anything but 0 means the harness, not the model, made some of the failures.

    python -m memory_service.evals.agent_report RUN.json [RUN2.json ...]      # the table (one block per model)
    python -m memory_service.evals.agent_report RUN.json --transcript feed_dedupe:core:2
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

CONTROL_TASK = "control"
GUARDED_CONTROL = "control_guarded"  # the control again under a gate profile, its tool guarded (reported beside)
NOT_MEMORY_TASKS = (CONTROL_TASK, GUARDED_CONTROL)
Z95 = 1.959964


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of k successes in n runs (95% by default): sound at 0/n and n/n and small n,
    where the normal approximation gives [0, 0] or [1, 1]."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def run_numbers(run: dict[str, Any]) -> dict[str, Any]:
    """One run's totals over its sessions."""
    sessions = run["sessions"]
    prompts = [n for s in sessions for n in s["prompt_tokens"]]
    return {
        "success": run["success"],
        "seed": run.get("seed", 1),
        "sessions": len(sessions),
        "tool_calls": sum(s["tool_calls"] for s in sessions),
        "tool_calls_from_text": sum(s.get("tool_calls_from_text", 0) for s in sessions),
        "tool_errors": sum(s["tool_errors"] for s in sessions),
        "tool_errors_recovered": sum(s["tool_errors_recovered"] for s in sessions),
        "gate_refusals": sum(s.get("gate_refusals", 0) for s in sessions),
        "calls_lost": sum(s.get("calls_lost", 0) for s in sessions),
        "schema_tokens": run["schema_tokens"],
        "requests": len(prompts),
        "prompt_tokens_max": max(prompts, default=0),
        "prompt_tokens_sum": sum(prompts),
        "session_wall_s": sum(s.get("wall_time_s", 0.0) for s in sessions),
        "wall_time_s": run["wall_time_s"],
        "sessions_ended": [s["stopped"] for s in sessions],
    }


def rate(k: int, n: int) -> dict[str, Any]:
    low, high = wilson(k, n)
    return {"k": k, "n": n, "rate": round(k / n, 3) if n else None, "ci95": [round(low, 3), round(high, 3)]}


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A task's runs under one profile (one per seed): success k/N, sums, and the cost per session."""
    sessions = sum(r["sessions"] for r in rows)
    summed = {
        key: sum(r[key] for r in rows)
        for key in (
            "tool_calls",
            "tool_calls_from_text",
            "tool_errors",
            "tool_errors_recovered",
            "gate_refusals",
            "calls_lost",
        )
    }
    ended = Counter(stop for r in rows for stop in r["sessions_ended"])
    return {
        **rate(sum(bool(r["success"]) for r in rows), len(rows)),
        **summed,
        "seeds": [r["seed"] for r in rows],
        "sessions": sessions,
        "schema_tokens": max((r["schema_tokens"] for r in rows), default=0),
        "requests": sum(r["requests"] for r in rows),
        "prompt_tokens_max": max((r["prompt_tokens_max"] for r in rows), default=0),
        "prompt_tokens_sum": sum(r["prompt_tokens_sum"] for r in rows),
        "prompt_tokens_per_session": round(sum(r["prompt_tokens_sum"] for r in rows) / sessions) if sessions else 0,
        "wall_s_per_session": round(sum(r["session_wall_s"] for r in rows) / sessions, 1) if sessions else 0.0,
        "wall_time_s": round(sum(r["wall_time_s"] for r in rows), 1),
        "sessions_ended": dict(sorted(ended.items())),
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per profile: each task over its seeds, then `overall` (the memory tasks: all but the control and the
    guarded control), `control` (the control task's runs) and `control_guarded` (gate profiles only)."""
    grouped: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for run in runs:
        grouped.setdefault(run["profile"], {}).setdefault(run["task"], []).append(run_numbers(run))
    out: dict[str, Any] = {}
    for name, tasks in grouped.items():
        rows = {task: aggregate(numbers) for task, numbers in tasks.items()}
        memory = [r for task, r in rows.items() if task not in NOT_MEMORY_TASKS]
        out[name] = {
            "tasks": rows,
            "overall": {
                **rate(sum(r["k"] for r in memory), sum(r["n"] for r in memory)),
                "tasks": len(memory),
                "tool_calls": sum(r["tool_calls"] for r in memory),
                "tool_errors": sum(r["tool_errors"] for r in memory),
                "tool_errors_recovered": sum(r["tool_errors_recovered"] for r in memory),
                "calls_lost": sum(r["calls_lost"] for r in rows.values()),
                "prompt_tokens_sum": sum(r["prompt_tokens_sum"] for r in memory),
                "wall_time_s": round(sum(r["wall_time_s"] for r in memory), 1),
            },
            "control": rows.get(CONTROL_TASK),
            "control_guarded": rows.get(GUARDED_CONTROL),
        }
    return out


def audit(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Calls the harness lost over the whole run, and where (profile/task/seed/session)."""
    labelled = [
        (f"{r['profile']}/{r['task']}/seed {r.get('seed', 1)}/session {s['session']}", s)
        for r in runs
        for s in r["sessions"]
    ]
    where = [f"{label}: {s['calls_lost']}" for label, s in labelled if s.get("calls_lost")]
    unread = [label for label, s in labelled if (s.get("audit") or {}).get("replies_with_unread_call_text")]
    sessions = [s for _, s in labelled]
    return {
        "unread": unread,  # sessions with a reply whose text still looks like a call: for a reader to look at
        "calls_lost": sum(s.get("calls_lost", 0) for s in sessions),
        "where": where,
        "sessions": len(sessions),
        "sessions_audited": sum(1 for s in sessions if "calls_lost" in s),
        "calls_in_replies": sum((s.get("audit") or {}).get("calls_in_replies", 0) for s in sessions),
    }


def _interval(row: dict[str, Any]) -> str:
    low, high = row["ci95"]
    return f"{low:.0%}–{high:.0%}"


def _refused(row: dict[str, Any]) -> str:
    """The errors that were the gate's refusals (the tool did not run), when there were any."""
    return f", {row['gate_refusals']} refused by the gate" if row.get("gate_refusals") else ""


def _ended(row: dict[str, Any]) -> str:
    return ", ".join(f"{stop} {n}" for stop, n in row["sessions_ended"].items())


HEADER = (
    "| model | profile | task | success | 95% interval | tool calls (as text) | errors (recovered) | schema tokens "
    "| prompt tokens / session | wall s / session | sessions ended |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
)


def audit_line(result: dict[str, Any]) -> str:
    found = audit(result["runs"])
    if found["calls_lost"]:
        return (
            f"**HARNESS AUDIT FAILED: {found['calls_lost']} call(s) lost** (in the model's raw replies, never run): "
            + "; ".join(found["where"][:10])
            + "\n"
        )
    unaudited = found["sessions"] - found["sessions_audited"]
    extra = f" ({unaudited} session(s) without raw replies, not audited)" if unaudited else ""
    unread = found["unread"]
    look = ""
    if unread:
        look = f" Text that still looks like a call in {len(unread)} session(s), read it with --transcript: "
        look += "; ".join(unread[:10]) + "."
    return (
        f"**Harness audit: 0 calls lost** of {found['calls_in_replies']} in the model's raw replies, "
        f"{found['sessions']} sessions{extra}.{look}\n"
    )


def rows(result: dict[str, Any]) -> list[str]:
    """The table's rows of one result file: every task under every profile, then each profile's overall."""
    model = result.get("agent_model")
    lines = []
    for name, profile in (result.get("summary") or summarise(result["runs"])).items():
        for task, r in profile["tasks"].items():
            lines.append(
                f"| {model} | {name} | {task} | {r['k']}/{r['n']} | {_interval(r)} | {r['tool_calls']} "
                f"({r['tool_calls_from_text']}) | {r['tool_errors']} ({r['tool_errors_recovered']}){_refused(r)} | "
                f"{r['schema_tokens']} | {r['prompt_tokens_per_session']} | {r['wall_s_per_session']} | {_ended(r)} |\n"
            )
        o = profile["overall"]
        lines.append(
            f"| {model} | **{name}** | **memory tasks ({o['tasks']})** | **{o['k']}/{o['n']}** | {_interval(o)} | "
            f"{o['tool_calls']} | {o['tool_errors']} ({o['tool_errors_recovered']}) |  |  |  |  |\n"
        )
    return lines


def control_line(result: dict[str, Any]) -> str:
    summary = result.get("summary") or summarise(result["runs"])
    parts = [
        f"{name} {p['control']['k']}/{p['control']['n']}" for name, p in summary.items() if p.get("control") is not None
    ]
    if not parts:
        return ""
    k = sum(p["control"]["k"] for p in summary.values() if p.get("control"))
    n = sum(p["control"]["n"] for p in summary.values() if p.get("control"))
    line = f"Control task (tools, no memory): {k}/{n} ({_interval(rate(k, n))}); {', '.join(parts)}.\n"
    guarded = {name: p["control_guarded"] for name, p in summary.items() if p.get("control_guarded")}
    if guarded:
        said = ", ".join(f"{name} {g['k']}/{g['n']} ({_interval(g)})" for name, g in guarded.items())
        line += f"Guarded control (the same task, process_item once per item behind the gate): {said}.\n"
    return line


def wording_line(result: dict[str, Any]) -> str:
    """Where a task's prompts differ by profile (the parts naming a memory tool, filled only where it is
    offered: agent_tasks.wording), said once per task; nothing for a result file from before it was kept."""
    by_task: dict[str, dict[str, list[str]]] = {}
    for run in result["runs"]:
        if "wording" not in run:
            continue
        said = json.dumps(run["wording"], sort_keys=True, ensure_ascii=False)
        profiles = by_task.setdefault(run["task"], {}).setdefault(said, [])
        if run["profile"] not in profiles:
            profiles.append(run["profile"])
    differ = []
    for task, variants in by_task.items():
        if len(variants) < 2:
            continue
        parts = []
        for said, profiles in variants.items():
            filled = {k: v for k, v in json.loads(said).items() if v}
            words = "; ".join(f"{k} = {v.strip(' ;')!r}" for k, v in filled.items()) or "no tool named"
            parts.append(f"{', '.join(profiles)}: {words}")
        differ.append(f"{task} ({' | '.join(parts)})")
    if not by_task:
        return ""
    if not differ:
        return "Prompts: the same words under every profile.\n"
    return "Prompts differ by profile (a prompt names only tools its profile offers): " + "; ".join(differ) + ".\n"


def heading(result: dict[str, Any]) -> str:
    template = (result.get("agent_template") or {}).get("used", "?")
    seeds = ", ".join(f"{p} {n}" for p, n in (result.get("seeds") or {}).items())
    return (
        f"Agent eval: model {result.get('agent_model')} (chat template: {template}; "
        f"{result.get('agent_threads') or '?'} thread(s)), sampling {result.get('sampling', '?')} "
        f"{json.dumps(result.get('sampling_fields') or {})}, seeds per profile: {seeds or '?'}; "
        f"{result.get('wall_time_s')} s in all.\n"
    )


def markdown(*results: dict[str, Any]) -> str:
    """The audit, the control's rate and the table for one run's result or several (one model each)."""
    lines: list[str] = []
    for result in results:
        lines += [heading(result), audit_line(result), control_line(result), wording_line(result)]
    lines += ["\n", HEADER]
    for result in results:
        lines += rows(result)
    for result in results:
        lines += [f"\nNote: {note}\n" for note in result.get("notes") or []]
    return "".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memory_service.evals.agent_report", description=__doc__)
    parser.add_argument("files", nargs="+", type=Path, help="agent-eval.json (or .partial.json) of a run")
    parser.add_argument(
        "--transcript", metavar="TASK[:PROFILE[:SEED]]", help="print this run's sessions turn by turn, raw"
    )
    args = parser.parse_args(argv)
    results = [json.loads(path.read_text()) for path in args.files]
    if args.transcript:
        from .agent_transcript import transcript

        print(transcript(results[0], args.transcript))
        return 0
    print(markdown(*results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
