"""The agent eval's numbers: per task and per profile, then a markdown table to paste into a note.

Success comes from the scoring by state; tool calls, errors (and whether each was recovered), prompt tokens
(the model server's usage counts) and wall time come from the sessions as measured.
"""

from __future__ import annotations

from typing import Any


def run_numbers(run: dict[str, Any]) -> dict[str, Any]:
    """One run's totals over its sessions."""
    sessions = run["sessions"]
    prompts = [n for s in sessions for n in s["prompt_tokens"]]
    return {
        "success": run["success"],
        "tool_calls": sum(s["tool_calls"] for s in sessions),
        "tool_calls_from_text": sum(s.get("tool_calls_from_text", 0) for s in sessions),
        "tool_errors": sum(s["tool_errors"] for s in sessions),
        "tool_errors_recovered": sum(s["tool_errors_recovered"] for s in sessions),
        "schema_tokens": run["schema_tokens"],
        "requests": len(prompts),
        "prompt_tokens_max": max(prompts, default=0),
        "prompt_tokens_sum": sum(prompts),
        "wall_time_s": run["wall_time_s"],
        "sessions_ended": "/".join(s["stopped"] for s in sessions),
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per profile: success rate and the sums; per task under each profile: its own numbers."""
    out: dict[str, Any] = {}
    for run in runs:
        profile = out.setdefault(run["profile"], {"tasks": {}})
        profile["tasks"][run["task"]] = run_numbers(run)
    for profile in out.values():
        rows = list(profile["tasks"].values())
        profile["overall"] = {
            "tasks": len(rows),
            "success_rate": round(sum(r["success"] for r in rows) / len(rows), 3) if rows else None,
            "tool_calls": sum(r["tool_calls"] for r in rows),
            "tool_errors": sum(r["tool_errors"] for r in rows),
            "tool_errors_recovered": sum(r["tool_errors_recovered"] for r in rows),
            "prompt_tokens_sum": sum(r["prompt_tokens_sum"] for r in rows),
            "wall_time_s": round(sum(r["wall_time_s"] for r in rows), 1),
        }
    return out


HEADER = (
    "| profile | task | success | tool calls (as text) | errors (recovered) | schema tokens | prompts | max prompt tokens "
    "| prompt tokens total | wall s | sessions ended |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
)


def markdown(result: dict[str, Any]) -> str:
    """The per-task table for every profile, then one overall line per profile."""
    lines = [f"Agent eval: model {result.get('agent_model')}, {result.get('wall_time_s')} s in all.\n\n", HEADER]
    for name, profile in result["summary"].items():
        for task, r in profile["tasks"].items():
            lines.append(
                f"| {name} | {task} | {'yes' if r['success'] else 'no'} | {r['tool_calls']} ({r['tool_calls_from_text']}) | "
                f"{r['tool_errors']} ({r['tool_errors_recovered']}) | {r['schema_tokens']} | {r['requests']} | "
                f"{r['prompt_tokens_max']} | {r['prompt_tokens_sum']} | {r['wall_time_s']} | {r['sessions_ended']} |\n"
            )
        o = profile["overall"]
        lines.append(
            f"| **{name}** | **all {o['tasks']}** | **{o['success_rate']:.0%}** | {o['tool_calls']} | "
            f"{o['tool_errors']} ({o['tool_errors_recovered']}) |  |  |  | {o['prompt_tokens_sum']} | "
            f"{o['wall_time_s']} |  |\n"
        )
    for note in result.get("notes") or []:
        lines.append(f"\nNote: {note}\n")
    return "".join(lines)


if __name__ == "__main__":  # the table again from a run's JSON: python -m memory_service.evals.agent_report FILE
    import json
    import sys

    saved = json.loads(open(sys.argv[1]).read())
    print(markdown(saved | {"summary": summarise(saved["runs"])}))
