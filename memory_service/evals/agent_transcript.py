"""One run's sessions as the model saw and answered them, from the raw replies the loop keeps.

The field report's rule: look at the raw reply before blaming the model. A call sitting in the content, a
reply cut at the token cap or a tool error the model never read are visible here and nowhere else.
"""

from __future__ import annotations

import json
from typing import Any


def pick_run(result: dict[str, Any], spec: str) -> dict[str, Any]:
    """TASK[:PROFILE[:SEED]]: without a profile or seed, the first failed run of the task (else its first)."""
    task, _, rest = spec.partition(":")
    profile, _, seed = rest.partition(":")
    runs = [
        r
        for r in result["runs"]
        if r["task"] == task
        and (not profile or r["profile"] == profile)
        and (not seed or str(r.get("seed", 1)) == seed)
    ]
    if not runs:
        known = sorted({f"{r['task']}:{r['profile']}:{r.get('seed', 1)}" for r in result["runs"]})
        raise SystemExit(f"--transcript {spec!r}: no such run; the runs are {', '.join(known)}")
    return next((r for r in runs if not r["success"]), runs[0])


def _calls(raw: Any) -> str:
    return json.dumps(raw, ensure_ascii=False) if raw else "none"


def _turn(reply: dict[str, Any], calls: list[dict[str, Any]]) -> list[str]:
    """One reply, raw, then the calls the harness ran from it with their answers (errors in full)."""
    usage = reply.get("usage") or {}
    lines = [
        f"  turn {reply.get('turn')}: finish_reason={reply.get('finish_reason')}, prompt tokens "
        f"{usage.get('prompt_tokens', '?')}, completion tokens {usage.get('completion_tokens', '?')}",
        f"    content: {json.dumps(reply.get('content'), ensure_ascii=False)}",
        f"    tool_calls: {_calls(reply.get('tool_calls'))}",
    ]
    if reply.get("reasoning_content"):
        lines.append(f"    reasoning_content: {json.dumps(reply['reasoning_content'], ensure_ascii=False)}")
    if reply.get("calls_in_text"):
        lines.append(f"    calls read from the content: {reply['calls_in_text']}")
    for ran in reply.get("ran") or []:
        call = calls.pop(0) if calls else {}
        arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False)
        answer = call.get("error") or ran.get("answer") or call.get("answer")
        outcome = f"error: {answer}" if ran.get("error") else (f"answer: {answer}" if answer else "ok")
        lines.append(f"    -> ran {ran.get('tool')}({arguments}) from {ran.get('from')}: {outcome}")
    if reply.get("not_run"):
        lines.append(f"    (its calls not run: {reply['not_run']})")
    return lines


def transcript(result: dict[str, Any], spec: str) -> str:
    """Every session of the chosen run: the prompt (and brief), each raw reply, the calls run, how it ended."""
    run = pick_run(result, spec)
    lines = [
        f"{run['task']} under {run['profile']}, seed {run.get('seed', 1)}: "
        f"{'success' if run['success'] else 'FAILED'}; checks {json.dumps(run.get('checks'), ensure_ascii=False)}"
    ]
    if run.get("problem"):
        lines.append(f"problem: {run['problem']}")
    for session in run["sessions"]:
        lines += ["", f"session {session['session']}: {session['prompt']}"]
        if session.get("brief") is not None:
            lines.append(f"  brief: {json.dumps(session['brief'], ensure_ascii=False)}")
        if session.get("proxy") is not None:
            lines.append(f"  proxy: {json.dumps(session['proxy'], ensure_ascii=False)}")
        calls = list(session.get("calls") or [])
        for reply in session.get("raw_replies") or []:
            lines += _turn(reply, calls)
        lines.append(
            f"  ended: {session['stopped']}{' (' + session['problem'] + ')' if session.get('problem') else ''}; "
            f"calls lost by the harness: {session.get('calls_lost', '?')}; final answer: "
            f"{json.dumps(session.get('final_answer'), ensure_ascii=False)}"
        )
    return "\n".join(lines)
