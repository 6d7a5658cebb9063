"""The MCP server a harness sees: the upstream's tools, listed as the upstream lists them, each call passed
through, except the policy's tools, whose calls go through the guard (guard.py); and, with
`--memory-tools core`, the core memory tools of `memory-service mcp` beside them (its own toolbox and server).

A low-level MCP server (the SDK's `Server`), not MCPServer: the tools are the upstream's, with the upstream's
own schemas and results, which the gate must not rebuild from a Python signature.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from ..client import AsyncMemoryClient, MemoryServiceError
from ..mcp_server.server import CALL_TIMEOUT_S, PROBE_BUDGET_S, McpConfig, Probe, build_server, probe, serve_http
from ..mcp_server.server import instructions as memory_instructions
from ..mcp_server.tools import Toolbox
from .guard import Guard
from .policy import Policy
from .upstream import Upstream, start_upstream

log = logging.getLogger("memory_service.gate")

NAME = "memory-service-gate"
MemoryTools = Literal["none", "core"]
MEMORY_TOOLS: tuple[MemoryTools, ...] = get_args(MemoryTools)


class GateStartFailed(Exception):
    """The gate cannot serve as configured (a tool name both sides list); the message says what to change."""


@dataclass(frozen=True)
class GateConfig:
    """Where the service is and who the gate acts as (`mcp`: url, key, agent id, HTTP token, as for `memory-service
    mcp`), the policy, the upstream command, and whether the memory tools are added."""

    mcp: McpConfig
    policy: Policy
    command: tuple[str, ...]
    memory_tools: MemoryTools = "none"


class Gate:
    """The handlers of the gate's MCP server."""

    def __init__(self, upstream: Upstream, policy: Policy, guard: Guard, memory: MCPServer | None) -> None:
        self.upstream, self.policy, self.guard, self.memory = upstream, policy, guard, memory
        self.memory_names: frozenset[str] = frozenset()

    async def start(self) -> list[types.Tool]:
        """Check the policy and the memory tools against what the upstream lists; warn of what cannot be guarded."""
        listed = await self.upstream.list_tools()
        by_name = {tool.name: tool for tool in listed}
        for name in self.policy.unknown_tools(set(by_name)):
            log.warning(
                "gate: policy file %s guards %r, which the upstream (%s) does not list: calls to it are still "
                "guarded, should it answer them",
                self.policy.path,
                name,
                " ".join(self.upstream.command),
            )
        for name, guarded in self.policy.tools.items():
            properties = (by_name[name].input_schema or {}).get("properties") if name in by_name else None
            missing = [f for f in guarded.fields if isinstance(properties, dict) and f not in properties]
            if missing:
                log.warning(
                    "gate: policy file %s, [tools.%s]: once uses {%s}, which is not among the tool's arguments "
                    "(%s): calls without it are refused",
                    self.policy.path,
                    name,
                    "}, {".join(missing),
                    ", ".join(properties or {}) or "none",
                )
        if self.memory is not None:
            self.memory_names = frozenset(tool.name for tool in await self.memory.list_tools())
            both = sorted(self.memory_names & set(by_name))
            if both:
                raise GateStartFailed(
                    f"the upstream lists {', '.join(both)}, a name of the memory tools too: run the gate with "
                    "--memory-tools none, or rename the upstream's tool"
                )
        return listed

    async def list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        tools = await self.upstream.list_tools()
        if self.memory is not None:
            tools += await self.memory.list_tools()
        return types.ListToolsResult(tools=tools)

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        name, arguments = params.name, params.arguments
        if name in self.memory_names and self.memory is not None:
            return await self._memory_tool(self.memory, name, arguments or {})
        guarded = self.policy.tools.get(name)
        if guarded is None:
            return await self.upstream.call_tool(name, arguments)
        return await self.guard.call(guarded, arguments)

    @staticmethod
    async def _memory_tool(memory: MCPServer, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """As `memory-service mcp` answers it: a failure is a tool error whose text the model reads."""
        try:
            result = await memory.call_tool(name, arguments)
        except MCPError:
            raise
        except ToolError as exc:
            return types.CallToolResult(content=[types.TextContent(type="text", text=str(exc))], is_error=True)
        assert isinstance(result, types.CallToolResult)  # the memory tools never ask for input
        return result


def build_gate_server(gate: Gate, instructions: str | None) -> Server[Any]:
    return Server(NAME, instructions=instructions, on_list_tools=gate.list_tools, on_call_tool=gate.call_tool)


def joined(*parts: str | None) -> str | None:
    said = [part.strip() for part in parts if part and part.strip()]
    return "\n\n".join(said) or None


async def check_limits(memory: AsyncMemoryClient, policy: Policy, found: Probe) -> None:
    """Warn of a limit the policy names that the team does not have: every call to its tool would be refused."""
    named = {p.limit for p in policy.tools.values() if p.limit}
    if not named or found.team is None:
        return
    try:
        existing = {view.name for view in await memory.limits.list()}
    except MemoryServiceError:
        return
    for name in sorted(named - existing):
        log.warning(
            "gate: policy file %s names the daily limit %r, which this team does not have: calls to its tools are "
            "refused until it exists (memory-service limits set %s --daily-limit N --timezone UTC)",
            policy.path,
            name,
            name,
        )


async def serve(
    config: GateConfig, transport: Literal["stdio", "http"], *, host: str = "127.0.0.1", port: int = 8701
) -> None:
    """Start the upstream, probe the service once, then serve until stdio closes (or the HTTP server stops)."""
    mcp = config.mcp
    async with AsyncMemoryClient(
        mcp.url, api_key=mcp.api_key, timeout_s=CALL_TIMEOUT_S, retry_budget_s=PROBE_BUDGET_S
    ) as memory:
        found = await probe(memory, mcp.url)
        if found.problem:
            log.warning(
                "gate: %s; guarded tools are refused until it answers, unguarded ones pass. %s",
                found.problem,
                found.remedy.replace("this MCP server", "the gate") if config.memory_tools == "core" else "",
            )
        if found.team is not None and found.team.role == "read":
            log.warning(
                "gate: the API key may only read (role read): every guarded call is refused; give the gate a "
                "write key (memory-service keys create --team TEAM --role write)"
            )
        await check_limits(memory, config.policy, found)
        async with start_upstream(config.command) as upstream:
            guard = Guard(memory, url=mcp.url, agent_id=mcp.agent_id, upstream=upstream.call_tool)
            memory_server, said = None, None
            if config.memory_tools == "core":
                toolbox = Toolbox(memory, url=mcp.url, agent_id=mcp.agent_id)
                memory_server = build_server(toolbox, found, profile="core")
                said = (
                    memory_instructions(found, tuple(t.name for t in await memory_server.list_tools()))
                    if found.team is not None
                    else f"The memory tools are not available: {found.problem}."
                )
            gate = Gate(upstream, config.policy, guard, memory_server)
            listed = await gate.start()
            log.info(
                "gate: fronting %s (%d tools, %d guarded) as agent %r",
                " ".join(config.command),
                len(listed),
                len(config.policy.tools),
                mcp.agent_id,
            )
            server = build_gate_server(gate, joined(upstream.instructions, said))
            if transport == "stdio":
                async with stdio_server() as (read, write):
                    await server.run(read, write, server.create_initialization_options())
            else:
                await serve_http(server, mcp, host, port)


def command_line(command: Sequence[str]) -> tuple[str, ...]:
    """The upstream command as given after `--`."""
    return tuple(command[1:] if command and command[0] == "--" else command)
