"""remember | recall | get | list | forget | export | import: the team's memories, through a running service.

Each command is one HTTP call with the key from `--api-key`. An HTTP error raises `ServiceAnswered`, which
`main` prints on stderr with exit code 1 (errors.py), so a script can tell.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import Subcommands, add_client_arguments, answer, open_service, path_argument, print_json
from .errors import EXIT_FAILED, EXIT_USAGE, CommandFailed, checked


def add_memory_parsers(subcommands: Subcommands) -> None:
    """Register the memory commands, in the order `--help` lists them."""
    for add in (
        _add_remember,
        _add_recall,
        _add_get,
        _add_list,
        _add_forget,
        _add_export,
        _add_import,
    ):
        parser = add(subcommands)
        add_client_arguments(parser)


def _add_remember(subcommands: Subcommands) -> argparse.ArgumentParser:
    parser = subcommands.add_parser("remember", help="save a text ('-' reads stdin)")
    parser.add_argument("text")
    parser.add_argument("--agent-id", required=True)
    parser.add_argument("--tag", action="append")
    parser.add_argument("--wait", type=float, default=0, help="wait up to N s for extraction")
    parser.set_defaults(func=run_remember)
    return parser


def run_remember(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.text == "-" else args.text
    body = {"text": text, "agent_id": args.agent_id, "tags": args.tag or [], "wait_s": args.wait}
    with open_service(args) as client:
        print_json(answer(client.post("/v1/remember", json=body)))
    return 0


def _add_recall(subcommands: Subcommands) -> argparse.ArgumentParser:
    parser = subcommands.add_parser("recall", help="search the team's memory")
    parser.add_argument("query")
    parser.add_argument("-k", type=int, default=5)
    parser.add_argument("--agent-id", help="only this agent's memories")
    parser.set_defaults(func=run_recall)
    return parser


def run_recall(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"query": args.query, "k": args.k}
    if args.agent_id:
        body.update(agent_id=args.agent_id, scope="agent")
    with open_service(args) as client:
        print_json(answer(client.post("/v1/recall", json=body)))
    return 0


def _add_get(subcommands: Subcommands) -> argparse.ArgumentParser:
    parser = subcommands.add_parser("get", help="show a memory: status, facts, timings, errors")
    parser.add_argument("id", type=path_argument("memory id"))
    parser.set_defaults(func=run_get)
    return parser


def run_get(args: argparse.Namespace) -> int:
    with open_service(args) as client:
        print_json(answer(client.get(f"/v1/memories/{args.id}")))
    return 0


def _add_list(subcommands: Subcommands) -> argparse.ArgumentParser:
    parser = subcommands.add_parser("list", help="list the team's memories, newest first")
    parser.add_argument("--agent-id")
    parser.add_argument("--run-id")
    parser.add_argument("--status", choices=["queued", "extracting", "done", "failed"])
    parser.add_argument("--tag")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--cursor", help="next_cursor of the previous page")
    parser.set_defaults(func=run_list)
    return parser


def run_list(args: argparse.Namespace) -> int:
    filters = ("agent_id", "run_id", "status", "tag", "limit", "cursor")
    params = {name: getattr(args, name) for name in filters if getattr(args, name) is not None}
    with open_service(args) as client:
        print_json(answer(client.get("/v1/memories", params=params)))
    return 0


def _add_forget(subcommands: Subcommands) -> argparse.ArgumentParser:
    parser = subcommands.add_parser("forget", help="forget one memory by id, or all of an agent or run (--yes)")
    parser.add_argument("id", nargs="?", type=path_argument("memory id"))
    parser.add_argument("--agent-id")
    parser.add_argument("--run-id")
    parser.add_argument("--yes", action="store_true", help="confirm a bulk forget (it cannot be undone)")
    parser.set_defaults(func=run_forget)
    return parser


def run_forget(args: argparse.Namespace) -> int:
    """One memory by id, or every memory of `--agent-id`/`--run-id`; the bulk one only with `--yes` (checked here,
    so the message names the flag, not the HTTP API's `confirm=true`)."""
    params = {k: v for k, v in (("agent_id", args.agent_id), ("run_id", args.run_id)) if v}
    if not args.id and not params:
        raise CommandFailed("give a memory ID, or --agent-id and/or --run-id (with --yes)", EXIT_USAGE)
    if not args.id and not args.yes:
        who = " and ".join(f"--{k.replace('_', '-')} {v}" for k, v in params.items())
        raise CommandFailed(f"forgetting every memory of {who} cannot be undone: repeat with --yes", EXIT_USAGE)
    with open_service(args) as client:
        if args.id:
            checked(client.delete(f"/v1/memories/{args.id}"))
            print_json({"deleted": 1})
            return 0
        print_json(answer(client.delete("/v1/memories", params={**params, "confirm": "true"})))
    return 0


def _add_export(subcommands: Subcommands) -> argparse.ArgumentParser:
    parser = subcommands.add_parser("export", help="write the team's memories as JSON Lines")
    parser.add_argument("--out", "-o", help="file to write (default stdout)")
    parser.set_defaults(func=run_export)
    return parser


def run_export(args: argparse.Namespace) -> int:
    """Stream the export to a file or stdout as it arrives: a large team never sits in memory. A new file is
    its owner's only (0600, whatever the umask): it holds every text the team saved."""
    import os

    def private(path: str, flags: int) -> int:
        return os.open(path, flags, 0o600)

    out = open(args.out, "wb", opener=private) if args.out and args.out != "-" else sys.stdout.buffer
    try:
        with open_service(args) as client, client.stream("GET", "/v1/export") as response:
            checked(response)
            for chunk in response.iter_bytes():
                out.write(chunk)
    finally:
        if out is not sys.stdout.buffer:
            out.close()
    return 0


def _add_import(subcommands: Subcommands) -> argparse.ArgumentParser:
    parser = subcommands.add_parser("import", help="read JSON Lines written by export ('-' reads stdin)")
    parser.add_argument("file")
    parser.add_argument("--re-extract", action="store_true", help="drop the facts and extract them again")
    parser.set_defaults(func=run_import)
    return parser


def run_import(args: argparse.Namespace) -> int:
    """Stream the file to the service in 64 KiB pieces: an export of any size goes up without being read whole."""
    source = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")
    try:
        with open_service(args) as client:
            summary = answer(
                client.post(
                    "/v1/import",
                    params={"re_extract": str(args.re_extract).lower()},
                    content=iter(lambda: source.read(1 << 16), b""),
                    headers={"content-type": "application/x-ndjson"},
                )
            )
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    print_json(summary)
    return _import_failures(summary)


def _import_failures(summary: dict[str, Any]) -> int:
    """Exit 1 when any line failed, even when others went in: a script must not take a partial import for done."""
    failed = summary.get("failed", 0)
    if not failed:
        return 0
    total = failed + summary.get("imported", 0) + summary.get("skipped", 0)
    first = "; ".join(f"line {e.get('line')}: {e.get('detail')}" for e in summary.get("errors", [])[:3])
    print(f"memory-service import: {failed} of {total} lines failed ({first})", file=sys.stderr)
    return EXIT_FAILED
