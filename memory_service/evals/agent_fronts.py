"""The eval's gate and proxy profiles: memory that the agent uses without calling a memory tool.

- `gate`: a task's own tools are served by a real MCP server (task_tools_server) behind `memory-service gate`,
  with a policy written for the run: `process_item` once per `item_id` (the team's ledger), `send_email` one
  unit of the task's own daily limit. The model sees the same tools as without the gate; a refused call is the
  gate's sentence as a tool error. The scoring reads side effects from the upstream's own log.
- `proxy`: the model is reached through `memory-service proxy`, started per session in front of the agent's
  endpoint, with X-Memory-Agent (the task's agent) and X-Memory-Session (new for every session). It adds the
  session's brief to the system prompt and saves the user's messages and final answers in the background;
  stopping it (SIGTERM) sends what is queued, so the next session's brief can see them.

Both are the product's commands as a harness would start them, in processes of their own: nothing is imported
from memory_service.gate or memory_service.proxy, and nothing is simulated.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .agent_tasks import LocalTool, RunState
from .task_tools_server import LOG_ENV

# the session's first request may wait this long for its brief: the eval measures what a brief is worth, and the
# agent's llama-server holds every core, so the proxy's own default (300 ms) would measure the machine's load
PROXY_RECALL_TIMEOUT_MS = 10_000
PROXY_START_S = 60.0
PROXY_STOP_S = 15.0  # the proxy sends its queued saves for up to 5 s at shutdown


def policy_toml(tools: tuple[LocalTool, ...], state: RunState) -> str:
    """The gate's policy for a task's tools: each ticket once for the team, each email one unit of the task's own
    daily limit (its name is in the run's values); other tools pass unguarded."""
    lines: list[str] = []
    names = {tool.name for tool in tools}
    if "process_item" in names:
        lines += ["[tools.process_item]", 'once = "ticket:{item_id}"', 'scope = "team"', ""]
    if "send_email" in names:
        lines += ["[tools.send_email]", f"limit = {_toml_string(state.values['limit'])}", "units = 1", ""]
    return "\n".join(lines)


def _toml_string(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._:-]+", value):
        raise ValueError(f"not a plain limit name: {value!r}")
    return f'"{value}"'


def gate_env(url: str, key: str | None, agent_id: str, tools_log: Path) -> dict[str, str]:
    """The gate's environment: no MEMORY_* of ours but the service, its key, the agent, and the upstream's log
    (the gate passes its environment to the upstream, minus the key)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}
    env.update({"MEMORY_URL": url, "MEMORY_AGENT_ID": agent_id, "MEMORY_LOG_LEVEL": "WARNING", LOG_ENV: str(tools_log)})
    if key:
        env["MEMORY_API_KEY"] = key
    return env


def gate_command(policy: Path, task: str) -> list[str]:
    """`memory-service gate` in front of the task's tool server, as an mcpServers entry would start it."""
    upstream = [sys.executable, "-m", "memory_service.evals.task_tools_server", "--task", task]
    return ["-m", "memory_service", "gate", "--policy", str(policy), "--memory-tools", "none", "--", *upstream]


@contextlib.asynccontextmanager
async def gate_session(
    url: str, key: str | None, agent_id: str, task: str, policy: Path, tools_log: Path
) -> AsyncIterator[Any]:
    """One session's MCP client of the gate (stdio); yields (client, listed tools, instructions)."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(
        command=sys.executable, args=gate_command(policy, task), env=gate_env(url, key, agent_id, tools_log)
    )
    async with Client(params) as client:
        yield client, (await client.list_tools()).tools, client.instructions


def upstream_calls(tools_log: Path) -> int:
    """How many calls reached the task's tool server (its own log), run or refused by its own validation."""
    if not tools_log.exists():
        return 0
    return sum(1 for line in tools_log.read_text(encoding="utf-8").splitlines() if line.strip())


@dataclass
class ProxyHandle:
    """A running `memory-service proxy` for one session: where the agent's requests go, and its headers."""

    url: str
    headers: dict[str, str]
    log: Path


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def proxy_process(
    upstream: str, url: str, key: str | None, agent_id: str, session_id: str, log: Path
) -> Iterator[ProxyHandle]:
    """`memory-service proxy --upstream AGENT` for one session, until its /health answers; stopped with SIGTERM
    at the end, so its queued saves are sent before the next session starts."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}
    env.update({"MEMORY_LOG_LEVEL": "INFO"})  # the brief's size or its absence is logged at INFO
    if key:
        env["MEMORY_API_KEY"] = key
    command = [
        sys.executable, "-m", "memory_service", "proxy", "--upstream", upstream, "--url", url, "--port", str(port),
        "--agent-id", agent_id, "--recall-timeout-ms", str(PROXY_RECALL_TIMEOUT_MS),
    ]  # fmt: skip
    with log.open("ab") as err:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + PROXY_START_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"memory-service proxy exited ({process.returncode}): {log.read_text()[-500:]}")
            try:
                if httpx.get(base + "/health", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"memory-service proxy did not answer within {PROXY_START_S:.0f} s")
            time.sleep(0.1)
        yield ProxyHandle(base, {"X-Memory-Agent": agent_id, "X-Memory-Session": session_id}, log)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(PROXY_STOP_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def new_session_id(agent_id: str, nonce: str, n: int) -> str:
    """A fresh X-Memory-Session per task session: the proxy briefs each one anew."""
    return f"{agent_id}-{nonce}-s{n}-{secrets.token_hex(4)}"


_BRIEF = re.compile(r"session (\S+) of agent \S+: brief of (\d+) line")
_NO_BRIEF = re.compile(r"session (\S+) of agent \S+: (.*?): sent without a brief")


def proxy_report(log: Path) -> dict[str, Any]:
    """What the proxy's log says of the session: the brief's lines (0: nothing bore on the opening, None: not
    said), and each time it went on without one (a slow or failed recall) or logged a warning."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    lines = [m.group(2) for m in _BRIEF.finditer(text)]
    missed = [m.group(2) for m in _NO_BRIEF.finditer(text)]
    warnings = [line.strip()[:300] for line in text.splitlines() if "WARNING" in line or "ERROR" in line]
    return {"brief_lines": int(lines[-1]) if lines else None, "without_brief": missed, "warnings": warnings[:5]}
