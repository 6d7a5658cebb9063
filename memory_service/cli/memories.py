"""remember | recall | get | list | forget (and export | import, from transfer.py): the team's memories, through a
running service.

Each command is one HTTP call with the key from `--api-key` (`remember --wait` then polls the memory). A person
gets short lines (render.py); `--json` prints the service's answer, as the commands always did, for scripts. An
HTTP error raises `ServiceAnswered`, which `main` prints on stderr with exit code 1 (errors.py).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from . import transfer
from .common import (
    Subcommands,
    add_client_arguments,
    add_json_argument,
    answer,
    open_service,
    path_argument,
    positive_int,
    print_json,
    wants_json,
)
from .errors import EXIT_FAILED, EXIT_USAGE, CommandFailed, checked

AGENT_HELP = "the agent that saved it (any name up to 128 characters)"


def add_memory_parsers(subcommands: Subcommands) -> None:
    """Register the memory commands, in the order `--help` lists them."""
    for add in (
        _add_remember,
        _add_recall,
        _add_get,
        _add_list,
        _add_forget,
        transfer.add_export_parser,
        transfer.add_import_parser,
    ):
        parser = add(subcommands)
        add_client_arguments(parser)
        add_json_argument(parser)


def _add_remember(subcommands: Subcommands) -> argparse.ArgumentParser:
    parser = subcommands.add_parser("remember", help="save a text ('-' reads stdin)")
    parser.add_argument("text", help="what to remember, in plain words; '-' reads it from stdin")
    parser.add_argument("--agent-id", required=True, help=f"who saves it: {AGENT_HELP}")
    parser.add_argument("--tag", action="append", help="a label to filter by later; repeat for several")
    parser.add_argument(
        "--wait",
        type=float,
        default=0,
        metavar="SECONDS",
        help="wait up to SECONDS for the facts to be extracted, showing progress, then print them",
    )
    parser.set_defaults(func=run_remember)
    return parser


def run_remember(args: argparse.Namespace) -> int:
    if args.wait < 0:
        raise CommandFailed(f"--wait {args.wait}: give the seconds to wait, 0 or more", EXIT_USAGE)
    text = sys.stdin.read() if args.text == "-" else args.text
    body = {"text": text, "agent_id": args.agent_id, "tags": args.tag or []}
    with open_service(args) as client:
        saved = answer(client.post("/v1/remember", json=body))
        if args.wait <= 0:
            print_json(saved) if wants_json(args) else _render().print_saved(saved)
            return 0
        from .waiting import wait_for_facts

        memory = wait_for_facts(client, saved, args.wait, show=not wants_json(args))
    if wants_json(args):
        print_json({**saved, "status": memory["status"], "facts": memory["facts"]})
    else:
        _render().print_memory(memory)
        if memory["status"] not in ("done", "failed"):
            print(f"still {memory['status']} after {args.wait:g} s: `memory-service get {saved['id']}` shows it later")
    return EXIT_FAILED if memory["status"] == "failed" else 0


def _add_recall(subcommands: Subcommands) -> argparse.ArgumentParser:
    parser = subcommands.add_parser("recall", help="search the team's memory")
    parser.add_argument("query", help="what to look for, in plain words")
    parser.add_argument("-k", type=positive_int, default=5, help="how many items at most (default 5, up to 100)")
    parser.add_argument("--agent-id", help="only this agent's memories")
    parser.add_argument("--tag", action="append", help="only items carrying this tag; repeat: all of them")
    parser.add_argument(
        "--context", action="store_true", help="print only the paste-ready context block (for a prompt), no scores"
    )
    parser.set_defaults(func=run_recall)
    return parser


def run_recall(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"query": args.query, "k": args.k}
    if args.agent_id:
        body.update(agent_id=args.agent_id, scope="agent")
    if args.tag:
        body["tags"] = args.tag
    with open_service(args) as client:
        found = answer(client.post("/v1/recall", json=body))
    print_json(found) if wants_json(args) else _render().print_recall(found, context_only=args.context)
    return 0


def _add_get(subcommands: Subcommands) -> argparse.ArgumentParser:
    parser = subcommands.add_parser("get", help="show a memory: status, facts, timings, errors")
    parser.add_argument("id", type=path_argument("memory id"), help="the memory's id, as remember or list print it")
    parser.set_defaults(func=run_get)
    return parser


def run_get(args: argparse.Namespace) -> int:
    with open_service(args) as client:
        memory = answer(client.get(f"/v1/memories/{args.id}"))
    print_json(memory) if wants_json(args) else _render().print_memory(memory)
    return 0


def _add_list(subcommands: Subcommands) -> argparse.ArgumentParser:
    parser = subcommands.add_parser("list", help="list the team's memories, newest first")
    parser.add_argument("--agent-id", help=f"only this agent's: {AGENT_HELP}")
    parser.add_argument("--run-id", help="only those saved with this run id")
    parser.add_argument("--status", choices=["queued", "extracting", "done", "failed"], help="only in this state")
    parser.add_argument("--tag", help="only those carrying this tag")
    parser.add_argument("--limit", type=positive_int, help="memories per page (the service's default when absent)")
    parser.add_argument("--cursor", help="next_cursor of the previous page")
    parser.set_defaults(func=run_list)
    return parser


def run_list(args: argparse.Namespace) -> int:
    filters = ("agent_id", "run_id", "status", "tag", "limit", "cursor")
    params = {name: getattr(args, name) for name in filters if getattr(args, name) is not None}
    with open_service(args) as client:
        page = answer(client.get("/v1/memories", params=params))
    print_json(page) if wants_json(args) else _render().print_memories(page)
    return 0


def _add_forget(subcommands: Subcommands) -> argparse.ArgumentParser:
    parser = subcommands.add_parser("forget", help="forget one memory by id, or all of an agent or run (--yes)")
    parser.add_argument("id", nargs="?", type=path_argument("memory id"), help="the memory to forget")
    parser.add_argument("--agent-id", help="forget every memory of this agent (with --yes)")
    parser.add_argument("--run-id", help="forget every memory of this run (with --yes)")
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
            done = {"deleted": 1}
        else:
            done = answer(client.delete("/v1/memories", params={**params, "confirm": "true"}))
    if wants_json(args):
        print_json(done)
    else:
        print(f"forgot {done['deleted']} memor{'y' if done['deleted'] == 1 else 'ies'}")
    return 0


def _render() -> Any:
    """render.py, imported when a person's output is printed (rich loads only then)."""
    from . import render

    return render
