"""gate: front any MCP server, so that its guarded tools run at most once per item and within daily limits.

    memory-service gate --policy gate.toml -- python my_tools.py

The gate starts the upstream command itself and serves MCP (stdio, or HTTP with the same token rules as
`memory-service mcp`); the policy file and what it promises: docs/gate.md, memory_service/gate/.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import ClientEnv
from ..contract.ids import ID_RULE, is_id
from .common import Subcommands, add_client_arguments
from .errors import EXIT_USAGE, CommandFailed
from .harness import add_mcp_transport_arguments

MEMORY_TOOLS = ("none", "core")  # gate/server.py's MemoryTools; here without importing the MCP SDK


def add_gate_parser(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "gate",
        help="front an MCP server: its guarded tools run at most once per item and within daily limits",
        description="Serve the tools of UPSTREAM_COMMAND (any MCP server over stdio) over MCP; the calls of the "
        "tools the policy file names reserve their item and units in the memory service first, and are refused "
        "when the item was handled or the limit is used up. Example: memory-service gate --policy gate.toml -- "
        "python my_tools.py",
    )
    parser.add_argument("--policy", type=Path, required=True, help="the policy file (TOML; see docs/gate.md)")
    add_mcp_transport_arguments(parser)
    parser.add_argument(
        "--agent-id",
        default=ClientEnv.from_env().agent_id,
        help="who the guarded calls are recorded as, and whose limits count them (env MEMORY_AGENT_ID, "
        "default 'agent')",
    )
    parser.add_argument(
        "--memory-tools",
        choices=MEMORY_TOOLS,
        default="none",
        help="none (default): only the upstream's tools; core: also remember, recall, consume_limit, mark_handled",
    )
    add_client_arguments(parser)
    parser.add_argument(
        "upstream",
        nargs=argparse.REMAINDER,
        metavar="-- UPSTREAM_COMMAND ...",
        help="the MCP server to front, started by the gate and spoken to over stdio",
    )
    parser.set_defaults(func=run_gate)


def run_gate(args: argparse.Namespace) -> int:
    """Check the policy and the flags, then serve until the harness closes stdio (or the HTTP server stops)."""
    import anyio

    from ..gate.policy import load_policy
    from ..gate.server import GateConfig, GateStartFailed, command_line, serve
    from ..gate.upstream import UpstreamFailed
    from ..mcp_server.server import McpConfig

    command = command_line(args.upstream)
    if not command:
        raise CommandFailed(
            "no upstream command: give the MCP server to front after `--`, e.g. "
            "memory-service gate --policy gate.toml -- python my_tools.py",
            EXIT_USAGE,
        )
    if not is_id(args.agent_id):
        raise CommandFailed(f"--agent-id {args.agent_id!r} is not an agent id: use {ID_RULE}", EXIT_USAGE)
    policy = load_policy(args.policy)
    if args.transport == "http":
        from ..mcp_server.http_access import check_http_exposure

        check_http_exposure(args.host, args.token)
    config = GateConfig(
        mcp=McpConfig(
            url=args.url,
            api_key=args.api_key,
            agent_id=args.agent_id,
            token=args.token,
            trusted_hosts=ClientEnv.from_env().mcp_trusted_hosts,
        ),
        policy=policy,
        command=command,
        memory_tools=args.memory_tools,
    )
    try:
        anyio.run(lambda: serve(config, args.transport, host=args.host, port=args.port))
    except BaseException as exc:
        said = _first(exc, (UpstreamFailed, GateStartFailed))
        if said is None:
            raise
        raise CommandFailed(str(said)) from None
    return 0


def _first(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first error of `kinds` in `exc`, looking inside the exception groups task groups raise."""
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first(inner, kinds)
            if found is not None:
                return found
    return None
