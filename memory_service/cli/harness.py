"""mcp: serve the memory tools to agent harnesses over the Model Context Protocol (stdio or HTTP).

The MCP server talks to a running service like the other HTTP commands, with `--url` and `--api-key`;
the key's role decides which tools it lists (see memory_service/mcp_server).
"""

from __future__ import annotations

import argparse

from ..config import ClientEnv
from ..mcp_server.profiles import PROFILES  # stdlib only: the command line stays quick to start
from .common import Subcommands, add_client_arguments


def add_mcp_parser(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser("mcp", help="serve the memory tools to agent harnesses over MCP (stdio or HTTP)")
    add_mcp_transport_arguments(parser)
    parser.add_argument(
        "--agent-id",
        default=ClientEnv.from_env().agent_id,
        help="who saves and consumes through these tools (env MEMORY_AGENT_ID, default 'agent')",
    )
    parser.add_argument(
        "--read-only",
        action="store_true",
        default=ClientEnv.from_env().mcp_read_only,
        help="list only the tools that read (env MEMORY_MCP_READ_ONLY=1)",
    )
    parser.add_argument(
        "--tools",
        type=_profile,
        default=ClientEnv.from_env().mcp_tools,
        metavar="{core,full}",
        help="core (default): remember, recall, consume_limit, mark_handled, under 500 tokens for small models; "
        "full: also get_memory, forget, check_limit, was_handled (env MEMORY_MCP_TOOLS)",
    )
    add_client_arguments(parser)
    parser.set_defaults(func=run_mcp)


def add_mcp_transport_arguments(parser: argparse.ArgumentParser) -> None:
    """How an MCP server of ours is reached (`mcp` and `gate`): stdio, or HTTP with its address and token."""
    parser.add_argument(
        "--transport",
        choices=["stdio", "http"],
        default="stdio",
        help="stdio: the harness spawns this command; http: streamable HTTP at /mcp",
    )
    parser.add_argument("--host", default="127.0.0.1", help="HTTP: address to listen on")
    parser.add_argument("--port", type=int, default=8701, help="HTTP: port (default 8701)")
    parser.add_argument(
        "--token",
        default=ClientEnv.from_env().mcp_token,
        help="HTTP: the bearer token every request must carry, at least 16 characters; required to listen beyond "
        "loopback (env MEMORY_MCP_TOKEN, preferred: a flag shows in the process list)",
    )


def _profile(value: str) -> str:
    """An argparse type, applied to the MEMORY_MCP_TOOLS default too: a bad value is a usage error."""
    if value not in PROFILES:
        raise argparse.ArgumentTypeError(f"{value!r} is not a tool profile: {' or '.join(PROFILES)}")
    return value


def run_mcp(args: argparse.Namespace) -> int:
    """Serve until the harness closes stdio (or the HTTP server is stopped)."""
    import anyio

    from ..mcp_server.server import McpConfig, serve

    if args.transport == "http":
        from ..mcp_server.http_access import check_http_exposure

        check_http_exposure(args.host, args.token)
    config = McpConfig(
        url=args.url,
        api_key=args.api_key,
        agent_id=args.agent_id,
        read_only=args.read_only,
        tools=args.tools,
        token=args.token,
        trusted_hosts=ClientEnv.from_env().mcp_trusted_hosts,
    )
    anyio.run(lambda: serve(config, args.transport, host=args.host, port=args.port))
    return 0
