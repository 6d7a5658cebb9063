"""`memory-service limits ...`: daily limits and the handled ledger from the shell.

Talks to a running service over HTTP and prints the JSON answer. Exit codes
are meant for scripts: 0 = ok / allowed / first time, 1 = denied (429) /
already handled / not found, 2 = any other error (bad input, auth, service
unreachable). So `memory-service limits handled "$url" && process "$url"`
processes each URL once.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import httpx

from ..client.service import service_client
from .common import Subcommands, add_client_arguments, path_argument
from .errors import START_HINT

EXIT_OK, EXIT_NO, EXIT_ERROR = 0, 1, 2

LIMITS_EXIT_CODES = """exit codes (for scripts):
  0  ok: set, shown, allowed, or handled for the first time
  1  no: denied (limit reached), already handled, or (with --check) never handled
  2  any other error: bad input, a refused key, the service unreachable (the message is on stderr)"""

HANDLED_EXIT_CODES = """exit codes:
  without --check (records KEY):  0 first time (go ahead),  1 already handled (skip)
  with --check (records nothing): 0 handled before,         1 never handled
  2 any other error (on stderr)
so `memory-service limits handled "$url" && process "$url"` processes each URL once."""


def add_limits_parser(subparsers: Subcommands) -> argparse.ArgumentParser:
    """Register `limits` with its sub-commands on the CLI's subparsers."""
    limits = subparsers.add_parser(
        "limits",
        help="daily limits and the handled-item ledger (talks to the service)",
        epilog=LIMITS_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = limits.add_subparsers(dest="limits_command", required=True)

    put = sub.add_parser("set", help="create or change a limit")
    put.add_argument("name", type=path_argument("limit name"))
    put.add_argument("--daily-limit", type=int, required=True, help="units per local day (0-1000000000)")
    put.add_argument("--timezone", required=True, help="IANA name whose calendar day counts, e.g. Europe/Madrid")
    put.add_argument("--per", choices=["team", "agent"], default="team", help="one counter per team or per agent")

    consume = sub.add_parser("consume", help="use units if the limit allows it (exit 1 when denied)")
    consume.add_argument("name", type=path_argument("limit name"))
    consume.add_argument("--agent-id", required=True)
    consume.add_argument("--amount", type=int, default=1)
    consume.add_argument("--idempotency-key", help="repeats on the same day count once")

    show = sub.add_parser("show", help="one limit's usage (with NAME) or all limits")
    show.add_argument("name", nargs="?", type=path_argument("limit name"))
    show.add_argument("--agent-id", help="this agent's counter (per=agent limits)")
    show.add_argument("--days", type=int, help="with NAME: also the last N days (1-366)")

    handled = sub.add_parser(
        "handled",
        help="record KEY; exit 0 the first time, 1 if already handled (--check: 0 if handled, 1 if not)",
        epilog=HANDLED_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    handled.add_argument("key", help="what was handled: a URL, a message id, any string")
    handled.add_argument("--agent-id", help="per-agent ledger instead of the team's")
    handled.add_argument("--ttl-days", type=int, help="forget the key N days after first seen")
    handled.add_argument(
        "--check",
        action="store_true",
        help="only look the key up, do not record it; the exit code turns around: 0 handled before, 1 never",
    )

    for parser in (put, consume, show, handled):
        add_client_arguments(parser)
    limits.set_defaults(func=run_limits)
    return limits


def run_limits(args: argparse.Namespace) -> int:
    """Run one `limits` sub-command; print the JSON answer; return the exit code."""
    try:
        with service_client(args.url, args.api_key, timeout=30) as client:
            response = _request(client, args)
    except httpx.HTTPError as exc:
        detail = f"cannot reach the memory service at {args.url} ({exc}): {START_HINT}"
        print(json.dumps({"error": "unreachable", "detail": detail}), file=sys.stderr)
        return EXIT_ERROR
    return _report(response, args)


def _request(client: httpx.Client, args: argparse.Namespace) -> httpx.Response:
    command = args.limits_command
    if command == "set":
        body = {"daily_limit": args.daily_limit, "timezone": args.timezone, "per": args.per}
        return client.put(f"/v1/limits/{args.name}", json=body)
    if command == "consume":
        body = {"agent_id": args.agent_id, "amount": args.amount}
        if args.idempotency_key is not None:
            body["idempotency_key"] = args.idempotency_key
        return client.post(f"/v1/limits/{args.name}/consume", json=body)
    if command == "show":
        params = {k: v for k, v in (("agent_id", args.agent_id), ("days", args.days)) if v is not None}
        path = "/v1/limits" if args.name is None else f"/v1/limits/{args.name}"
        return client.get(path, params=params)
    if command == "handled":
        if args.check:
            params = {"key": args.key, **({"agent_id": args.agent_id} if args.agent_id else {})}
            return client.get("/v1/handled", params=params)
        body = {"key": args.key}
        if args.agent_id is not None:
            body["agent_id"] = args.agent_id
        if args.ttl_days is not None:
            body["ttl_days"] = args.ttl_days
        return client.post("/v1/handled", json=body)
    raise ValueError(f"unknown limits command {command!r}")


def _report(response: httpx.Response, args: argparse.Namespace) -> int:
    try:
        payload: Any = response.json()
    except ValueError:
        payload = {"status": response.status_code, "body": response.text}
    status, command = response.status_code, args.limits_command
    if status < 400:
        code = EXIT_OK
        if command == "handled" and not args.check and not payload.get("first_time", False):
            code = EXIT_NO
    elif status == 429 or (status == 404 and command == "handled"):
        code = EXIT_NO  # an answer, not an error: denied / never handled
    else:
        code = EXIT_ERROR
    print(json.dumps(payload, indent=2), file=sys.stderr if code == EXIT_ERROR else sys.stdout)
    return code


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point: `python -m memory_service.cli.limits limits ...`."""
    parser = argparse.ArgumentParser(prog="memory-service")
    add_limits_parser(parser.add_subparsers(dest="command", required=True))
    return run_limits(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
