"""What an eval profile is made of, and the memory MCP server of one session (agent_runner's sessions).

A profile names its parts with `+` (`core+brief`, `gate+proxy`): the memory tools' MCP profile, a harness
brief, the task's tools behind `memory-service gate`, the model behind `memory-service proxy`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from .agent_loop import mcp_tool_schemas

BRIEF_HEAD = "What your team's memory holds that may bear on this task:"


@dataclass
class McpHandle:
    """The MCP server of one session, as the loop uses it."""

    client: Any
    names: frozenset[str]
    schemas: list[dict[str, Any]]
    instructions: str | None


@dataclass(frozen=True)
class Parts:
    """What an eval profile is made of: the memory tools' MCP profile (None: no memory tools), a harness brief,
    the task's tools behind the gate, the model behind the proxy."""

    tools: str | None
    brief: bool = False
    gate: bool = False
    proxy: bool = False


def parts(profile: str) -> Parts:
    words = profile.split("+")
    tools = next((w for w in words if w in ("core", "full")), None)
    return Parts(tools, "brief" in words, "gate" in words, "proxy" in words)


def server_profile(profile: str) -> str:
    """The MCP server's tool profile of an eval profile (`core+brief` runs the core tools; `off` for none)."""
    return parts(profile).tools or "off"


def mcp_env(url: str, key: str | None, agent_id: str, profile: str) -> dict[str, str]:
    """The MCP server's environment: no MEMORY_* of ours but where the service is, who the agent is, the profile."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}
    tools = server_profile(profile)
    env.update(
        {"MEMORY_URL": url, "MEMORY_AGENT_ID": agent_id, "MEMORY_MCP_TOOLS": tools, "MEMORY_LOG_LEVEL": "WARNING"}
    )
    if key:
        env["MEMORY_API_KEY"] = key
    return env


@contextlib.asynccontextmanager
async def mcp_session(url: str, key: str | None, agent_id: str, profile: str) -> AsyncIterator[McpHandle | None]:
    """`memory-service mcp` over stdio for one session; None for a profile without memory tools."""
    if parts(profile).tools is None:
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


async def with_brief(mcp: McpHandle, prompt: str) -> tuple[McpHandle, str]:
    """core+brief: the harness recalls the session's prompt before the first turn and the answer joins the
    system prompt. One brief at the start with recall still a tool is what helped agents in published
    benchmarks, where recalling into every prompt did not."""
    result = await mcp.client.call_tool("recall", {"query": prompt})
    text = "\n".join(part.text for part in result.content if getattr(part, "text", None)).strip()
    if result.is_error or not text:
        text = f"(the recall failed: {text[:200]})" if result.is_error else "(nothing)"
    brief = f"{BRIEF_HEAD}\n{text}"
    instructions = f"{mcp.instructions}\n\n{brief}" if mcp.instructions else brief
    return McpHandle(mcp.client, mcp.names, mcp.schemas, instructions), text
