"""proxy: an OpenAI-compatible chat endpoint in front of a model server, that briefs each session from the
team's memory at its start and saves what was said (memory_service/proxy, docs/proxy.md).

A client of a running service like the other HTTP commands, with `--url` and `--api-key`.
"""

from __future__ import annotations

import argparse

from ..config import ClientEnv
from .common import Subcommands, add_client_arguments, positive_int, service_url

MIN_BRIEF_TOKENS, MAX_BRIEF_TOKENS = 32, 4000  # recall's max_tokens starts at 32


def add_proxy_parser(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "proxy",
        help="serve /v1/chat/completions in front of a model server, with a memory brief per session and saves",
        description="An OpenAI-compatible /v1/chat/completions and /v1/models in front of --upstream (llama-server, "
        "vLLM, Ollama's OpenAI API). Each session gets one brief of the team's memory at its first request, "
        "re-sent unchanged; each user message and final answer is saved once. See docs/proxy.md.",
    )
    parser.add_argument(
        "--upstream", type=service_url, required=True, help="the model server, e.g. http://127.0.0.1:8080"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback only)")
    parser.add_argument("--port", type=int, default=8702, help="port (default 8702)")
    parser.add_argument(
        "--agent-id",
        default=ClientEnv.from_env().agent_id,
        help="the agent of a request with no X-Memory-Agent header and no `user` field (env MEMORY_AGENT_ID, "
        "default 'agent')",
    )
    parser.add_argument(
        "--brief-tokens",
        type=_brief_tokens,
        default=300,
        help=f"the brief's token budget ({MIN_BRIEF_TOKENS}-{MAX_BRIEF_TOKENS}, default 300)",
    )
    parser.add_argument(
        "--recall-timeout-ms",
        type=positive_int,
        default=300,
        help="the most a session's first request waits for its brief; past it the request goes on without one "
        "(default 300)",
    )
    parser.add_argument(
        "--upstream-timeout-s", type=positive_int, default=600, help="the most one model call may take (default 600)"
    )
    add_client_arguments(parser)
    parser.set_defaults(func=run_proxy)


def _brief_tokens(value: str) -> int:
    number = positive_int(value)
    if not MIN_BRIEF_TOKENS <= number <= MAX_BRIEF_TOKENS:
        raise argparse.ArgumentTypeError(f"{number} is not within {MIN_BRIEF_TOKENS}-{MAX_BRIEF_TOKENS}")
    return number


def run_proxy(args: argparse.Namespace) -> int:
    """Serve until stopped (Ctrl-C or SIGTERM); queued saves are sent before it exits."""
    import uvicorn

    from ..api.http_guard import guarded_protocol
    from ..contract.ids import ID_RULE, is_id
    from ..proxy.access import check_bind
    from ..proxy.app import ProxyConfig, create_app
    from .errors import EXIT_USAGE, CommandFailed

    check_bind(args.host)
    if not is_id(args.agent_id):
        raise CommandFailed(f"--agent-id {args.agent_id!r} is not an agent id: {ID_RULE}", EXIT_USAGE)
    config = ProxyConfig(
        upstream=args.upstream,
        memory_url=args.url,
        api_key=args.api_key,
        brief_tokens=args.brief_tokens,
        recall_timeout_s=args.recall_timeout_ms / 1000,
        default_agent=args.agent_id,
        upstream_timeout_s=float(args.upstream_timeout_s),
        host=args.host,
        trusted_hosts=ClientEnv.from_env().mcp_trusted_hosts,
    )
    # the API's connection guard: headers within 10 s, a body never stalled 60 s (a model call may take minutes,
    # but the request itself arrives at once)
    protocol = guarded_protocol(10.0, 60.0)
    uvicorn.run(create_app(config), host=args.host, port=args.port, http=protocol, log_level="info", access_log=False)
    return 0
