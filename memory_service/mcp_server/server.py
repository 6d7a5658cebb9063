"""Build and run the MCP server: probe the service, list only the tools that can work, then serve.

A tool that can't work is not listed: when the service does not answer at start (or refuses the key),
the server lists no tools and its instructions say why; the key's role (read, write, admin) and the
profile (`core` by default, `full` on request: see profiles.py) decide which of the others are listed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

from ..client import AsyncMemoryClient, MemoryServiceError
from ..contract.models import TeamOut
from ..contract.roles import role_allows
from .arguments import PlainTool
from .brief import brief_prompt
from .profiles import DEFAULT_PROFILE, Profile, select, shown_schema
from .tools import TOOLS, Toolbox

log = logging.getLogger("memory_service.mcp")

NAME = "memory-service"
PROBE_BUDGET_S = 5.0
CALL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class McpConfig:
    url: str
    api_key: str | None
    agent_id: str
    read_only: bool = False
    tools: Profile = DEFAULT_PROFILE
    token: str | None = None  # over HTTP: the bearer every request must carry (required beyond loopback)
    trusted_hosts: tuple[str, ...] = ()  # over HTTP without a token: Host names answered besides loopback's


@dataclass(frozen=True)
class Probe:
    """What the service said at start: the team (None when it could not be used), or why not and what to do."""

    team: TeamOut | None
    problem: str | None = None
    remedy: str = ""


RESTART = "then restart this MCP server"


async def probe(memory: AsyncMemoryClient, url: str) -> Probe:
    """Ask /v1/team once. Only a service that cannot be used (unreachable, key refused, an error) means no
    tools: a key whose team has no memories yet gets every tool its role allows."""
    try:
        return Probe(await memory.team())
    except MemoryServiceError as exc:
        if exc.status == 401:
            return Probe(
                None,
                f"the memory service at {url} refused the API key ({exc.message})",
                "Set MEMORY_API_KEY (or --api-key) to an active key (`memory-service keys create` makes one, "
                f"`memory-service keys list` shows them), {RESTART}.",
            )
        if exc.status == 0:
            return Probe(
                None,
                f"the memory service at {url} is unreachable ({exc.message})",
                f"Start the memory service (memory-service serve) or point MEMORY_URL (--url) at it, {RESTART}.",
            )
        return Probe(None, f"the memory service at {url} answered {exc.status}: {exc.message}", f"Fix that, {RESTART}.")


def visible_tools(found: Probe, read_only: bool, profile: Profile = DEFAULT_PROFILE) -> tuple[str, ...]:
    """Nothing when the service can't be used; else the tools of the profile that the key's role allows
    (only the reading ones with `read_only`)."""
    if found.team is None:
        return ()
    role = "read" if read_only else found.team.role
    return select((spec.name for spec in TOOLS if role_allows(role, spec.needs)), profile)


# What the instructions say about each job, naming the first of its tools the key can see.
WHEN_TO_CALL: tuple[tuple[tuple[str, str], ...], ...] = (
    (("recall", "before you act, to skip what is already done or known."),),
    (("remember", "after a step worth keeping."),),
    (
        ("consume_limit", "just before an action with a daily limit."),
        ("check_limit", "to see what is left of a daily limit."),
    ),
    (
        ("mark_handled", "before handling an item others may handle too."),
        ("was_handled", "to see whether an item is already handled."),
    ),
)


def instructions(found: Probe, visible: tuple[str, ...]) -> str:
    """Short server instructions that name only tools the client can see, and no value (a name, an id) that a
    model could mistake for an argument."""
    if found.team is None:
        return f"No tools are available: {found.problem}. {found.remedy}"
    # No team name, agent id or count: a small model copies any such value into an argument (issue 41 saw
    # `recall(agent_id=<team name>)` come back empty, and the identical call repeated until the run stopped).
    parts = ["This server is your team's shared memory."]
    for choices in WHEN_TO_CALL:
        said = next((f"Call {tool} {when}" for tool, when in choices if tool in visible), None)
        if said:
            parts.append(said)
    if not any(spec.writes and spec.name in visible for spec in TOOLS):
        parts.append("This key can only read memory.")
    return " ".join(parts)


def compact_schema(schema: Any) -> Any:
    """The arguments' JSON schema without what a model does not need (titles, `X or null` for optional
    arguments): every token of the tool list is paid in every prompt of a small model."""
    if isinstance(schema, list):
        return [compact_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: compact_schema(v) for k, v in schema.items() if k != "title"}
    options = out.get("anyOf")
    if isinstance(options, list) and {"type": "null"} in options and out.get("default", ...) is None:
        rest = [o for o in options if o != {"type": "null"}]
        if len(rest) == 1:
            out.pop("anyOf")
            out.pop("default")
            out.update(rest[0])
    return out


def build_server(
    toolbox: Toolbox, found: Probe, *, read_only: bool = False, profile: Profile = DEFAULT_PROFILE
) -> MCPServer:
    """An MCP server listing only the `visible_tools`, each with a compact argument schema, and the
    `session_brief` prompt where `recall` is listed.

    Arguments are still validated against the full signature (None accepted where the schema omits it), and a
    bad one answers one sentence (`PlainTool`).
    """
    visible = visible_tools(found, read_only, profile)
    functions = toolbox.bind(frozenset(visible))
    tools = []
    for spec in TOOLS:
        if spec.name in visible:
            hints = (
                ToolAnnotations(read_only_hint=True)
                if not spec.writes
                else ToolAnnotations(read_only_hint=False, destructive_hint=spec.name == "forget")
            )
            tool = PlainTool.from_function(
                functions[spec.name],
                name=spec.name,
                description=spec.description,
                annotations=hints,
                structured_output=False,
            )
            schema = shown_schema(spec.name, compact_schema(tool.parameters), profile)
            tools.append(tool.model_copy(update={"parameters": schema}))
    server = MCPServer(NAME, instructions=instructions(found, visible), tools=tools)
    if "recall" in visible:  # the brief is a recall: offered to whoever may recall
        server.add_prompt(brief_prompt(toolbox.memory))
    return server


async def serve(
    config: McpConfig, transport: Literal["stdio", "http"], *, host: str = "127.0.0.1", port: int = 8701
) -> None:
    """Probe once, then serve until the harness closes stdio (or the HTTP server is stopped)."""
    async with AsyncMemoryClient(
        config.url, api_key=config.api_key, timeout_s=CALL_TIMEOUT_S, retry_budget_s=PROBE_BUDGET_S
    ) as memory:
        found = await probe(memory, config.url)
        if found.problem:
            log.warning("MCP server starts with no tools: %s. %s", found.problem, found.remedy)
        toolbox = Toolbox(memory, url=config.url, agent_id=config.agent_id)
        server = build_server(toolbox, found, read_only=config.read_only, profile=config.tools)
        if transport == "stdio":
            await server.run_stdio_async()
        else:
            await serve_http(server, config, host, port)


async def serve_http(server: MCPServer | Server[Any], config: McpConfig, host: str, port: int) -> None:
    """Streamable HTTP behind `McpAccess` (token, or Host and Origin), on the API's guarded connection; for
    `memory-service mcp` (an MCPServer) and `memory-service gate` (a low-level Server) alike."""
    import uvicorn
    from mcp.server.transport_security import TransportSecuritySettings

    from ..api.http_guard import guarded_protocol
    from .http_access import McpAccess

    app = server.streamable_http_app(
        host=host, transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False)
    )  # McpAccess checks Host and Origin itself, by the API's rules, for every bind
    guarded = McpAccess(app, token=config.token, bound=host, trusted=config.trusted_hosts)
    protocol = guarded_protocol(10.0, 60.0)
    uvicorn_config = uvicorn.Config(guarded, host=host, port=port, http=protocol, log_level="info")
    log.info(
        "MCP over streamable HTTP on http://%s:%d/mcp (%s)",
        host,
        port,
        "bearer token required" if config.token else "loopback Host names only, no token",
    )
    await uvicorn.Server(uvicorn_config).serve()
