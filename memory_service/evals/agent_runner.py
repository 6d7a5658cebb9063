"""`memory-service eval --agent`: a small local model as the agent, in a real loop, with and without memory.

For each MCP profile (`off`: no memory tools, the baseline; `core`, `full`: the MCP server's tool profiles) and
each scripted task, the runner sets the task up through the service's API, runs its sessions (each a fresh
context with a fresh `memory-service mcp` process over stdio), then scores it by state. Without --url it
starts its own service with one key (one team) per profile and task, so no run sees another's memory; with
--url every run shares the given (admin) key and the per-run nonce keeps runs apart.
Without --agent-url the agent model is a llama-server of its own (`--agent-model`, default `large`, with
`--jinja` for tool calling).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx

from ..bench.probes import machine_info
from ..bench.report import write_json
from ..client import MemoryClient
from .agent_loop import mcp_tool_schemas, run_session
from .agent_report import markdown, summarise
from .agent_tasks import RunState, Task, new_state, pick

PROFILES = ("off", "core", "full")
AGENT_CTX = 8192


def _progress(message: str) -> None:
    print(f"[eval --agent] {message}", file=sys.stderr, flush=True)


@dataclass
class McpHandle:
    """The MCP server of one session, as the loop uses it."""

    client: Any
    names: frozenset[str]
    schemas: list[dict[str, Any]]
    instructions: str | None


def mcp_env(url: str, key: str | None, agent_id: str, profile: str) -> dict[str, str]:
    """The MCP server's environment: no MEMORY_* of ours but where the service is, who the agent is, the profile."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}
    env.update(
        {"MEMORY_URL": url, "MEMORY_AGENT_ID": agent_id, "MEMORY_MCP_TOOLS": profile, "MEMORY_LOG_LEVEL": "WARNING"}
    )
    if key:
        env["MEMORY_API_KEY"] = key
    return env


@contextlib.asynccontextmanager
async def mcp_session(url: str, key: str | None, agent_id: str, profile: str) -> AsyncIterator[McpHandle | None]:
    """`memory-service mcp` over stdio for one session; None for the `off` profile (no memory tools)."""
    if profile == "off":
        yield None
        return
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(
        command=sys.executable, args=["-m", "memory_service", "mcp"], env=mcp_env(url, key, agent_id, profile)
    )
    async with Client(params) as client:
        listed = (await client.list_tools()).tools
        yield McpHandle(client, frozenset(t.name for t in listed), mcp_tool_schemas(listed), client.instructions)


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
    """Where a run goes: the service, its key for this (profile, task), the agent model."""

    url: str
    key: str | None
    agent_url: str
    agent_model: str | None
    session_timeout_s: float


async def run_task(http: httpx.AsyncClient, target: Target, profile: str, task: Task) -> dict[str, Any]:
    """One task under one profile: setup, every session from a fresh context, then the score by state."""
    started = time.monotonic()
    state: RunState = new_state(task, secrets.token_hex(3))
    agent_id = f"agent-{task.name.replace('_', '-')}"
    with MemoryClient(target.url, api_key=target.key, timeout_s=60) as client:
        if task.setup is not None:
            await anyio.to_thread.run_sync(task.setup, state, client, state.nonce)
        sessions: list[dict[str, Any]] = []
        schema_tokens: int | None = None
        tools_listed: list[str] = []
        for n, prompt in enumerate(task.prompts(state), 1):
            async with mcp_session(target.url, target.key, agent_id, profile) as mcp:
                tools = [t.schema() for t in task.tools] + (mcp.schemas if mcp is not None else [])
                tools_listed = [t["function"]["name"] for t in tools]
                if schema_tokens is None:
                    schema_tokens = (await count_tokens(http, target.agent_url, json.dumps(tools)))[0] if tools else 0
                deadline = time.monotonic() + target.session_timeout_s
                result = await run_session(
                    http,
                    target.agent_url,
                    target.agent_model,
                    prompt,
                    state=state,
                    local_tools=task.tools,
                    mcp=mcp,
                    deadline=deadline,
                )
            state.answers.append(result.final_answer)
            sessions.append({"session": n, "prompt": prompt, **result.report()})
            _progress(f"{profile}/{task.name} session {n}: {result.stopped}, {len(result.calls)} tool call(s)")
        score = await anyio.to_thread.run_sync(task.score, state, client)
    return {
        "task": task.name,
        "profile": profile,
        "success": bool(score.pop("success")),
        "checks": score,
        "tools": tools_listed,
        "schema_tokens": schema_tokens or 0,
        "side_effects": state.effects,
        "sessions": sessions,
        "wall_time_s": round(time.monotonic() - started, 1),
    }


def failed_run(profile: str, task: Task, problem: str) -> dict[str, Any]:
    """A run that could not happen: counted as a failure, with why."""
    return {
        "task": task.name,
        "profile": profile,
        "success": False,
        "problem": problem[:500],
        "checks": {},
        "tools": [],
        "schema_tokens": 0,
        "side_effects": [],
        "sessions": [],
        "wall_time_s": 0.0,
    }


async def profile_available(url: str, key: str | None, profile: str) -> tuple[bool, list[str]]:
    """Does the MCP server know this profile? `core` lists fewer tools than `full` once it exists."""
    if profile == "off":
        return True, []
    async with mcp_session(url, key, "agent-probe", profile) as mcp:
        names = sorted(mcp.names) if mcp else []
    if profile != "core":
        return True, names
    async with mcp_session(url, key, "agent-probe", "full") as full:
        everything = sorted(full.names) if full else []
    return names != everything, names


async def run_all(
    args: argparse.Namespace, service_url: str, agent_url: str, keys: dict[tuple[str, str], str | None]
) -> dict[str, Any]:
    """Every profile x task, in order (a profile the MCP server does not serve is skipped with a note)."""
    tasks = pick(args.tasks, args.limit)
    profiles = parse_profiles(args.profiles)
    runs: list[dict[str, Any]] = []
    notes: list[str] = []
    async with httpx.AsyncClient(timeout=args.sessions_timeout, trust_env=False) as http:
        for profile in profiles:
            probe_key = keys[(profile, tasks[0].name)]
            available, listed = await profile_available(service_url, probe_key, profile)
            if not available:
                notes.append(f"profile {profile!r} is not served by this build's MCP server (it listed {listed})")
                _progress(notes[-1])
                continue
            for task in tasks:
                key = keys[(profile, task.name)]
                target = Target(service_url, key, agent_url, args.agent_model_name, float(args.sessions_timeout))
                try:
                    runs.append(await run_task(http, target, profile, task))
                except Exception as exc:  # one broken run (setup refused, MCP server down) must not end the eval
                    runs.append(failed_run(profile, task, f"{type(exc).__name__}: {exc}"))
                    notes.append(f"{profile}/{task.name} could not run: {runs[-1]['problem']}")
                _progress(f"{profile}/{task.name}: {'success' if runs[-1]['success'] else 'FAILED'}")
                # a long run cut short (a busy machine, a deadline) keeps what it measured
                write_json(Path(args.out) / "agent-eval.partial.json", {"runs": runs, "notes": notes})
    return {"runs": runs, "notes": notes, "summary": summarise(runs)}


def parse_profiles(raw: str) -> list[str]:
    profiles = [p.strip() for p in raw.split(",") if p.strip()]
    unknown = sorted(set(profiles) - set(PROFILES))
    if unknown or not profiles:
        raise SystemExit(f"--profiles: unknown {', '.join(unknown) or '(none)'}; choose from {', '.join(PROFILES)}")
    return profiles


@contextlib.contextmanager
def agent_model(args: argparse.Namespace) -> Iterator[str]:
    """The agent's endpoint: --agent-url, else a llama-server of its own on --agent-model (with --jinja)."""
    if args.agent_url:
        yield args.agent_url
        return
    from ..config import Settings
    from ..llm.runtime.gguf import resolve_model
    from ..llm.runtime.server import LlamaServerProcess

    settings = Settings.from_env()
    log_dir = Path(tempfile.mkdtemp(prefix="agent-eval-llama-"))
    _progress(f"starting llama-server for the agent model {args.agent_model!r} (log in {log_dir})")
    llama = LlamaServerProcess.from_settings(
        settings,
        resolve_model(args.agent_model, settings.cache_dir),
        log_dir / "agent-llama.log",
        threads=args.agent_threads or settings.llama_threads,
        ctx=AGENT_CTX,
        chat_template_file=None,
        nice=0,  # the agent is what is measured; the service's extraction model keeps its MEMORY_LLAMA_NICE
    ).start(wait_s=300)
    try:
        yield llama.url
    finally:
        llama.stop()


def run_agent_eval(args: argparse.Namespace, settings: dict[str, str]) -> int:
    """The whole eval: the service (own or --url, with the --set `settings`), the agent model, every profile x
    task; JSON and markdown."""
    from ..bench.service_runner import ServiceRunner

    started = time.monotonic()
    tasks = pick(args.tasks, args.limit)
    profiles = parse_profiles(args.profiles)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    own = not args.url
    keys = {
        (p, t.name): (f"agent-eval-{secrets.token_hex(12)}" if own else args.api_key) for p in profiles for t in tasks
    }
    with contextlib.ExitStack() as stack:
        url = args.url
        if own:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="memory-agent-eval-"))
            teams = {key: f"{p}-{t}" for (p, t), key in keys.items() if key}
            _progress(f"starting a service (extraction model {args.model}) in a temp data dir")
            service = ServiceRunner(
                Path(tmp) / "data", api_keys=teams, llm_url=args.llm_url, model=args.model, env=settings
            )
            stack.callback(service.stop)
            service.start()
            service.wait_model_ready()
            url = service.url
        agent_url = stack.enter_context(agent_model(args))
        result = anyio.run(run_all, args, url, agent_url, keys)
    result.update(
        agent_model=args.agent_model if not args.agent_url else (args.agent_model_name or args.agent_url),
        service="self-started (temp data dir)" if own else "external (--url)",
        profiles=profiles,
        tasks=[t.name for t in tasks],
        wall_time_s=round(time.monotonic() - started, 1),
        machine=machine_info(),
    )
    write_json(out / "agent-eval.json", result)
    table = markdown(result)
    (out / "agent-eval.md").write_text(table)
    print(table)
    return 0
