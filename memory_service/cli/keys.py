"""keys create | list | revoke: the API keys, managed in the data dir's key store (or PostgreSQL).

It works on the store itself, not through the service: a running service sees a change at its next
request, with no restart. A new key's secret is printed once and never stored.

Keys never hide data. With no key, a loopback service stores everything in team `local`; the first key
ends that mode, and a key of another team would not see those memories. So the first key, while `local`
holds memories, needs a choice (`--team local`, or `--leave-local`), and the last key is revoked only
with `--keyless`: keyless mode is always chosen, never a side effect.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from ..config import Settings
from .common import Subcommands, add_data_dir_argument

if TYPE_CHECKING:
    from ..storage.database import Database
    from ..storage.datadir import DataDir
    from ..storage.keys import KeyStore


def add_keys_parser(subcommands: Subcommands) -> None:
    keys = subcommands.add_parser("keys", help="create, list or revoke API keys (effective at once, no restart)")
    actions = keys.add_subparsers(dest="keys_command", required=True)
    create = actions.add_parser("create", help="a new key, printed once")
    create.add_argument(
        "--team",
        required=True,
        help=f"the key's team; '{Settings.LOCAL_TEAM}' is the team keyless mode stores into (the first key "
        f"of team '{Settings.LOCAL_TEAM}' keeps those memories visible)",
    )
    create.add_argument(
        "--role",
        required=True,
        choices=["read", "write", "admin"],
        help="read: recall/get/list/check; write: +remember/consume/mark/import; admin: +forget/limit definitions/keys",
    )
    create.add_argument("--agent", help="pin the key to this agent_id: it can write only as this agent")
    create.add_argument("--label", help="a note for people")
    create.add_argument(
        "--leave-local",
        action="store_true",
        help=f"create the first key of another team although team '{Settings.LOCAL_TEAM}' (keyless mode's) holds "
        "memories: they stay there, out of this key's sight",
    )
    listing = actions.add_parser("list", help="keys (never their secrets)")
    listing.add_argument("--team")
    listing.add_argument("--all", action="store_true", help="include revoked keys")
    revoke = actions.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("id")
    revoke.add_argument(
        "--keyless",
        action="store_true",
        help=f"allow revoking the last active key: the service then runs keyless (loopback only: everyone is "
        f"admin of team '{Settings.LOCAL_TEAM}')",
    )
    for action in (create, listing, revoke):
        add_data_dir_argument(action)
    keys.set_defaults(func=run_keys)


def run_keys(args: argparse.Namespace) -> int:
    """Open the key store (MEMORY_DATABASE_URL's, which every API process reads, or the data dir's), run the
    sub-command, close it."""
    from ..storage.database import open_database
    from ..storage.datadir import DataDir, DataDirIncomplete

    settings = Settings.from_env().with_overrides(data_dir=args.data_dir)
    data = DataDir(settings.data_dir)
    try:
        data.prepare()  # 0700 (the key hashes are in it); refuses a data dir a cut-off restore left missing
    except DataDirIncomplete as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    database = open_database(settings)
    store = data.open_keys(database)
    try:
        if args.keys_command == "create":
            return _create(store, args, _local_memories(data, database))
        if args.keys_command == "list":
            return _list(store, args)
        return _revoke(store, args, keyless=args.keyless or bool(settings.api_keys))
    finally:
        store.close()
        if database is not None:
            database.close()


def _local_memories(data: DataDir, database: Database | None) -> dict[str, int]:
    """Team `local`'s memories by state (none for a data dir without a journal: nothing is created here)."""
    from ..storage.catalog import status_counts

    if database is None and not data.has_journal():
        return {}
    journal = data.open_journal(database)
    try:
        return {state: n for state, n in status_counts(journal, Settings.LOCAL_TEAM).items() if n}
    finally:
        journal.close()


def _create(store: KeyStore, args: argparse.Namespace, local: dict[str, int]) -> int:
    """Create the key; the first one while team `local` holds memories only on a stated choice (exit 2 without)."""
    local_team, first = Settings.LOCAL_TEAM, not store.has_keys()
    held = sum(local.values())
    if first and held and args.team != local_team and not args.leave_local:
        counts = ", ".join(f"{n} {state}" for state, n in local.items())
        print(
            f"error: team '{local_team}' holds {held} memories ({counts}), saved in keyless mode; this first key "
            f"ends keyless mode, and a key of team '{args.team}' would not see them. Choose one:\n"
            f"  --team {local_team}     give this key team '{local_team}' and its memories\n"
            f"  --leave-local    create the '{args.team}' key anyway; the memories stay in team '{local_team}'\n"
            f"  to move them: `memory-service export --out local.jsonl` now (still keyless), then create the key "
            f"with --leave-local, then `memory-service import local.jsonl --api-key <the new key>`",
            file=sys.stderr,
        )
        return 2
    made = store.create(args.team, args.role, agent_id=args.agent, label=args.label)
    info = made.info
    print(json.dumps({"id": info.id, "team": info.team, "role": info.role, "agent_id": info.agent_id, "key": made.key}))
    print("the key is shown this once: store it now", file=sys.stderr)
    if first:
        print(
            f"keyless mode is over: every request now needs a key (keyless data is in team '{local_team}')",
            file=sys.stderr,
        )
        if held:
            kept = "this key sees them" if args.team == local_team else "they stay there, out of this key's sight"
            print(f"team '{local_team}' holds {held} memories saved in keyless mode: {kept}", file=sys.stderr)
    return 0


def _list(store: KeyStore, args: argparse.Namespace) -> int:
    found = store.list(args.team, include_revoked=args.all)
    for info in found:
        print(json.dumps(info.__dict__))
    if not store.has_keys():
        print(
            f"no active key: a loopback service runs keyless (everyone is admin of team '{Settings.LOCAL_TEAM}') "
            "unless MEMORY_API_KEYS is set",
            file=sys.stderr,
        )
    return 0


def _revoke(store: KeyStore, args: argparse.Namespace, *, keyless: bool) -> int:
    from ..storage.keys import KeyNotFound, LastKey

    try:
        info = store.revoke(args.id, keyless=keyless)
    except KeyNotFound as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except LastKey as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(info.__dict__))
    if not store.has_keys() and args.keyless:
        print(
            f"no active key left: a loopback service now runs keyless (team '{Settings.LOCAL_TEAM}')", file=sys.stderr
        )
    return 0
