"""`memory-service eval --agent`: a small local model as the agent, in a real loop, with and without memory.

For each seed, each profile (`off`: no memory tools, the baseline; `core`, `full`: the MCP server's tool
profiles; `core+brief`: core, and the session starts with what a recall of its prompt returns; `gate`, `proxy`,
`gate+proxy`: no memory tools, the task's tools behind `memory-service gate` and/or the model behind
`memory-service proxy`: agent_fronts) and each scripted task, the runner sets the task up through the service's
API, runs its sessions (each a fresh context with a fresh `memory-service mcp` process over stdio, or a gate
and a proxy of its own), then scores it by state. One run of a sampled model
says little, so every task runs under N seeds (the model card's sampling, `seed` set, no prompt cache) and the
report gives k/N with its interval. Without --url it starts its own service with one key (one team) per
profile, task and seed, so no run sees another's memory; with --url every run shares the given (admin) key and
the per-run nonce keeps runs apart. The agent model and its chat template: agent_endpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx

from ..client import MemoryClient
from ..testbed.probes import machine_info
from ..testbed.results import write_json
from .agent_endpoint import agent_endpoint
from .agent_fronts import gate_session, new_session_id, policy_toml, proxy_process, proxy_report, upstream_calls
from .agent_loop import mcp_tool_schemas, run_session
from .agent_profiles import McpHandle, mcp_session, parts, server_profile, with_brief
from .agent_report import GUARDED_CONTROL, markdown, summarise
from .agent_tasks import CONTROL, RunState, Task, new_state, pick, wording
from .task_tools_server import read_effects

PROFILES = ("off", "core", "core+brief", "full", "gate", "proxy", "gate+proxy")
# Qwen2.5-Coder-Instruct's generation_config.json (repetition_penalty is llama-server's repeat_penalty)
MODEL_CARD_SAMPLING: dict[str, Any] = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repeat_penalty": 1.05}
GREEDY: dict[str, Any] = {"temperature": 0, "cache_prompt": False}  # with the prompt cache greedy still varies
SESSION_TIMEOUT_S = 300.0


def _progress(message: str) -> None:
    print(f"[eval --agent] {message}", file=sys.stderr, flush=True)


async def count_tokens(http: httpx.AsyncClient, agent_url: str, text: str) -> tuple[int, str]:
    """Tokens of `text` by the agent model's /tokenize, else the documented estimate (4 characters a token)."""
    try:
        response = await http.post(agent_url.rstrip("/") + "/tokenize", json={"content": text})
        if response.status_code == 200:
            return len(response.json()["tokens"]), "tokenize"
    except (httpx.HTTPError, ValueError, KeyError):
        pass
    return (len(text) + 3) // 4, "estimate"


@dataclass(frozen=True)
class Target:
    """Where a run goes: the service, its key for this (profile, task, seed), the agent model and its sampling."""

    url: str
    key: str | None
    agent_url: str
    agent_model: str | None
    session_timeout_s: float
    seed: int = 1
    sampling: dict[str, Any] | None = None


async def run_task(
    http: httpx.AsyncClient, target: Target, profile: str, task: Task, *, guarded: bool = False
) -> dict[str, Any]:
    """One task under one profile and seed: setup, every session from a fresh context, the score by state.
    Under a gate profile the task's tools are the gate's (the plain control stays unguarded: it measures bare
    tool use) and side effects come from the tool server's log; under a proxy profile, a proxy per session."""
    started = time.monotonic()
    state: RunState = new_state(task, secrets.token_hex(3))
    agent_id = f"agent-{task.name.replace('_', '-')}"
    shape = parts(profile)
    gated = shape.gate and bool(task.tools) and (task is not CONTROL or guarded)
    with (
        tempfile.TemporaryDirectory(prefix="agent-eval-run-") as tmp,
        MemoryClient(target.url, api_key=target.key, timeout_s=60) as client,
    ):
        policy, tools_log = Path(tmp) / "gate.toml", Path(tmp) / "task-tools.jsonl"
        if task.setup is not None:
            await anyio.to_thread.run_sync(task.setup, state, client, state.nonce)
        if gated:
            policy.write_text(policy_toml(task.tools, state))
        sessions: list[dict[str, Any]] = []
        schema_tokens: int | None = None
        tools_listed: list[str] = []
        said: dict[str, str] = {}
        for n in range(1, len(task.sessions) + 1):
            proxy_log = Path(tmp) / f"proxy-session-{n}.log"
            async with contextlib.AsyncExitStack() as stack:
                session_id = new_session_id(agent_id, state.nonce, n)
                agent_url, headers, mcp = await _fronts(stack, target, profile, agent_id, session_id, proxy_log)
                local_tools = task.tools
                if gated:  # no memory tools in a gate profile: the gate's MCP server takes their place
                    mcp = await _gate(stack, target, agent_id, task.name, policy, tools_log)
                    local_tools = ()
                offered = {t.name for t in local_tools} | (mcp.names if mcp is not None else frozenset())
                prompt = task.prompts(state, offered)[n - 1]  # it names only tools this profile offers
                said = {k: v for k, v in wording(offered).items() if "{" + k + "}" in "".join(task.sessions)}
                brief = None
                if mcp is not None and shape.brief:
                    mcp, brief = await with_brief(mcp, prompt)
                tools = [t.schema() for t in local_tools] + (mcp.schemas if mcp is not None else [])
                tools_listed = [t["function"]["name"] for t in tools]
                if schema_tokens is None:
                    schema_tokens = (await count_tokens(http, target.agent_url, json.dumps(tools)))[0] if tools else 0
                result = await run_session(
                    http,
                    agent_url,
                    target.agent_model,
                    prompt,
                    state=state,
                    local_tools=local_tools,
                    mcp=mcp,
                    deadline=time.monotonic() + target.session_timeout_s,
                    sampling=target.sampling,
                    headers=headers,
                )
            if gated:  # what ran is what the tool server recorded, not what the loop sent
                state.effects = read_effects(tools_log)
            state.answers.append(result.final_answer)
            sessions.append(_session_record(n, prompt, brief, proxy_log if shape.proxy else None, result.report()))
            _progress(
                f"{profile}/{task.name} seed {target.seed} session {n}: {result.stopped}, {len(result.calls)} call(s)"
            )
        score = await anyio.to_thread.run_sync(task.score, state, client)
        reached = upstream_calls(tools_log) if gated else None
    return {
        "task": GUARDED_CONTROL if guarded else task.name,
        "profile": profile,
        "seed": target.seed,
        "sampling": target.sampling,
        "success": bool(score.pop("success")),
        "checks": score,
        "tools": tools_listed,
        "guarded": gated,
        "wording": said,
        **({"upstream_calls": reached} if reached is not None else {}),
        "schema_tokens": schema_tokens or 0,
        "side_effects": state.effects,
        "sessions": sessions,
        "wall_time_s": round(time.monotonic() - started, 1),
    }


def _session_record(
    n: int, prompt: str, brief: str | None, proxy_log: Path | None, report: dict[str, Any]
) -> dict[str, Any]:
    """One session in the run's JSON: its prompt, the brief it began with, what its proxy logged, the loop's report."""
    record: dict[str, Any] = {"session": n, "prompt": prompt, **({"brief": brief} if brief is not None else {})}
    if proxy_log is not None:
        record["proxy"] = proxy_report(proxy_log)
    return record | report


async def _fronts(
    stack: contextlib.AsyncExitStack, target: Target, profile: str, agent_id: str, session_id: str, proxy_log: Path
) -> tuple[str, dict[str, str] | None, McpHandle | None]:
    """A session's agent URL and headers (a proxy of its own under a proxy profile) and its memory MCP server."""
    agent_url, headers = target.agent_url, None
    if parts(profile).proxy:  # entered first, left last: its saves are sent once the session is over
        front = stack.enter_context(
            proxy_process(target.agent_url, target.url, target.key, agent_id, session_id, proxy_log)
        )
        agent_url, headers = front.url, front.headers
    mcp = await stack.enter_async_context(mcp_session(target.url, target.key, agent_id, profile))
    return agent_url, headers, mcp


async def _gate(
    stack: contextlib.AsyncExitStack, target: Target, agent_id: str, task: str, policy: Path, tools_log: Path
) -> McpHandle:
    """`memory-service gate` in front of the task's tool server, as the session's MCP server."""
    gate, listed, said_by_gate = await stack.enter_async_context(
        gate_session(target.url, target.key, agent_id, task, policy, tools_log)
    )
    return McpHandle(gate, frozenset(t.name for t in listed), mcp_tool_schemas(listed), said_by_gate)


def failed_run(profile: str, task: Task, seed: int, problem: str) -> dict[str, Any]:
    """A run that could not happen: counted as a failure, with why."""
    return {
        "task": task.name,
        "profile": profile,
        "seed": seed,
        "success": False,
        "problem": problem[:500],
        "checks": {},
        "tools": [],
        "schema_tokens": 0,
        "side_effects": [],
        "sessions": [],
        "wall_time_s": 0.0,
    }


def command_available(command: str) -> bool:
    """Does this build have `memory-service COMMAND` (the gate and the proxy came with issue 54)?"""
    probe = subprocess.run(
        [sys.executable, "-m", "memory_service", command, "--help"], capture_output=True, timeout=120, check=False
    )
    return probe.returncode == 0


async def profile_available(url: str, key: str | None, profile: str) -> tuple[bool, list[str]]:
    """Does this build serve the profile? `core` lists fewer tools than `full` once it exists; a brief needs
    `recall`; the gate and proxy profiles need their commands."""
    shape = parts(profile)
    missing = [c for c in ("gate", "proxy") if getattr(shape, c) and not command_available(c)]
    if missing:
        return False, [f"no `memory-service {c}`" for c in missing]
    if shape.tools is None:
        return True, []
    async with mcp_session(url, key, "agent-probe", profile) as mcp:
        names = sorted(mcp.names) if mcp else []
    if shape.brief and "recall" not in names:
        return False, names
    if server_profile(profile) != "core":
        return True, names
    async with mcp_session(url, key, "agent-probe", "full") as full:
        everything = sorted(full.names) if full else []
    return names != everything, names


Keys = dict[tuple[str, str, int], str | None]  # (profile, task, seed) -> API key


def sampling_for(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """The request fields of one seed's runs: the model card's sampling with `seed` set, or greedy (--greedy);
    never the prompt cache (a cached prefix changes the logits); then --agent-sampling (null drops a field)."""
    base = dict(GREEDY) if args.greedy else {**MODEL_CARD_SAMPLING, "seed": seed, "cache_prompt": False}
    try:
        extra = json.loads(args.agent_sampling) if args.agent_sampling else {}
    except ValueError:
        extra = None
    if not isinstance(extra, dict):
        raise SystemExit(f"--agent-sampling: expected a JSON object, got {args.agent_sampling!r}")
    return {k: v for k, v in {**base, **extra}.items() if v is not None}


def seed_counts(args: argparse.Namespace, profiles: list[str]) -> dict[str, int]:
    """Runs per profile: --seeds (3; 1 with --greedy, whose runs would repeat), or --profile-seeds PROFILE=N
    (for a profile among --profiles; others are ignored)."""
    default = args.seeds if args.seeds is not None else (1 if args.greedy else 3)
    counts = dict.fromkeys(profiles, max(1, default))
    for pair in (args.profile_seeds or "").split(","):
        name, sep, value = pair.strip().partition("=")
        if not name:
            continue
        if not sep or name not in PROFILES or not value.isdigit() or int(value) < 1:
            raise SystemExit(f"--profile-seeds: expected PROFILE=N (N >= 1, a profile of {PROFILES}), got {pair!r}")
        if name in counts:
            counts[name] = int(value)
    return counts


async def run_all(args: argparse.Namespace, service_url: str, agent_url: str, keys: Keys) -> dict[str, Any]:
    """Every seed x profile x task, seed by seed (a run cut short keeps whole seeds); a profile the MCP server
    does not serve is skipped with a note."""
    tasks = pick(args.tasks, args.limit)
    profiles = parse_profiles(args.profiles)
    seeds = seed_counts(args, profiles)
    runs: list[dict[str, Any]] = []
    notes: list[str] = []
    async with httpx.AsyncClient(timeout=args.sessions_timeout, trust_env=False) as http:
        served = []
        for profile in profiles:
            available, listed = await profile_available(service_url, keys[(profile, tasks[0].name, 1)], profile)
            if available:
                served.append(profile)
            else:
                notes.append(f"profile {profile!r} is not served by this build ({listed})")
                _progress(notes[-1])
        for seed in range(1, max(seeds.values(), default=0) + 1):
            for profile in (p for p in served if seed <= seeds[p]):
                for task, guarded in runs_of(tasks, profile):
                    name = GUARDED_CONTROL if guarded else task.name
                    target = Target(
                        service_url, keys[(profile, name, seed)], agent_url, args.agent_model_name,
                        float(args.sessions_timeout), seed, sampling_for(args, seed),
                    )  # fmt: skip
                    try:
                        runs.append(await run_task(http, target, profile, task, guarded=guarded))
                    except Exception as exc:  # one broken run (setup refused, MCP server down) must not end the eval
                        runs.append(failed_run(profile, task, seed, f"{type(exc).__name__}: {exc}"))
                        runs[-1]["task"] = name
                        notes.append(f"{profile}/{name}/seed {seed} could not run: {runs[-1]['problem']}")
                    _progress(f"{profile}/{name} seed {seed}: {'success' if runs[-1]['success'] else 'FAILED'}")
                    # a long run cut short (a busy machine, a deadline) keeps what it measured
                    write_json(Path(args.out) / "agent-eval.partial.json", {"runs": runs, "notes": notes})
    return {"runs": runs, "notes": notes, "seeds": seeds}


def runs_of(tasks: list[Task], profile: str) -> list[tuple[Task, bool]]:
    """The (task, guarded) runs of a profile: every task, and under a gate profile the control once more with
    its tool guarded (reported beside the control, which stays unguarded)."""
    out = [(task, False) for task in tasks]
    if parts(profile).gate and CONTROL in tasks:
        out.insert(tasks.index(CONTROL) + 1, (CONTROL, True))
    return out


def parse_profiles(raw: str) -> list[str]:
    profiles = [p.strip() for p in raw.split(",") if p.strip()]
    unknown = sorted(set(profiles) - set(PROFILES))
    if unknown or not profiles:
        raise SystemExit(f"--profiles: unknown {', '.join(unknown) or '(none)'}; choose from {', '.join(PROFILES)}")
    return profiles


def run_agent_eval(args: argparse.Namespace, settings: dict[str, str]) -> int:
    """The whole eval: the service (own or --url, with the --set `settings`), the agent model, every seed x
    profile x task; JSON and markdown."""
    from ..testbed.service_runner import ServiceRunner

    started = time.monotonic()
    tasks = pick(args.tasks, args.limit)
    profiles = parse_profiles(args.profiles)
    seeds = seed_counts(args, profiles)
    sampling_for(args, 1)  # a bad --agent-sampling fails before anything starts
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    own = not args.url
    keys: Keys = {
        (p, GUARDED_CONTROL if guarded else t.name, s): (f"agent-eval-{secrets.token_hex(12)}" if own else args.api_key)
        for p in profiles
        for t, guarded in runs_of(tasks, p)
        for s in range(1, seeds[p] + 1)
    }
    with contextlib.ExitStack() as stack:
        url = args.url
        if own:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="memory-agent-eval-"))
            teams = {key: f"{p.replace('+', '-')}-{t}-s{s}" for (p, t, s), key in keys.items() if key}
            _progress(f"starting a service (extraction model {args.model}) in a temp data dir")
            service = ServiceRunner(
                Path(tmp) / "data", api_keys=teams, llm_url=args.llm_url, model=args.model, env=settings
            )
            stack.callback(service.stop)
            service.start()
            service.wait_model_ready()
            url = service.url
        agent = stack.enter_context(agent_endpoint(args))
        result = anyio.run(run_all, args, url, agent.url, keys)
    result.update(
        summary=summarise(result["runs"]),
        agent_model=args.agent_model if not args.agent_url else (args.agent_model_name or args.agent_url),
        agent_template=agent.template,
        agent_threads=agent.threads,
        sampling="greedy" if args.greedy else "model card",
        sampling_fields=sampling_for(args, 1),
        service="self-started (temp data dir)" if own else "external (--url)",
        profiles=profiles,
        tasks=[t.name for t in tasks],
        sessions_timeout_s=float(args.sessions_timeout),
        wall_time_s=round(time.monotonic() - started, 1),
        machine=machine_info(),
    )
    write_json(out / "agent-eval.json", result)
    table = markdown(result)
    (out / "agent-eval.md").write_text(table)
    print(table)
    return 0
