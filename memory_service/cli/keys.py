"""keys create | list | revoke: the API keys, managed in the data dir's key store (or PostgreSQL).

It works on the store itself, not through the service: a running service sees a change at its next
request, with no restart. A new key's secret is printed once and never stored.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from ..config import Settings
from .common import Subcommands, add_data_dir_argument

if TYPE_CHECKING:
    from ..storage.keys import KeyStore


def add_keys_parser(subcommands: Subcommands) -> None:
    keys = subcommands.add_parser("keys", help="create, list or revoke API keys (effective at once, no restart)")
    actions = keys.add_subparsers(dest="keys_command", required=True)
    create = actions.add_parser("create", help="a new key, printed once")
    create.add_argument("--team", required=True)
    create.add_argument(
        "--role",
        required=True,
        choices=["read", "write", "admin"],
        help="read: recall/get/list/check; write: +remember/consume/mark/import; admin: +forget/limit definitions/keys",
    )
    create.add_argument("--agent", help="pin the key to this agent_id: it can write only as this agent")
    create.add_argument("--label", help="a note for people")
    listing = actions.add_parser("list", help="keys (never their secrets)")
    listing.add_argument("--team")
    listing.add_argument("--all", action="store_true", help="include revoked keys")
    revoke = actions.add_parser("revoke", help="revoke a key by its id")
    revoke.add_argument("id")
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
            return _create(store, args)
        if args.keys_command == "list":
            return _list(store, args)
        return _revoke(store, args)
    finally:
        store.close()
        if database is not None:
            database.close()


def _create(store: KeyStore, args: argparse.Namespace) -> int:
    made = store.create(args.team, args.role, agent_id=args.agent, label=args.label)
    info = made.info
    print(json.dumps({"id": info.id, "team": info.team, "role": info.role, "agent_id": info.agent_id, "key": made.key}))
    print("the key is shown this once: store it now", file=sys.stderr)
    return 0


def _list(store: KeyStore, args: argparse.Namespace) -> int:
    for info in store.list(args.team, include_revoked=args.all):
        print(json.dumps(info.__dict__))
    return 0


def _revoke(store: KeyStore, args: argparse.Namespace) -> int:
    from ..storage.keys import KeyNotFound

    try:
        info = store.revoke(args.id)
    except KeyNotFound as exc:
        print(str(exc), file=sys.stderr)
        return 1
    print(json.dumps(info.__dict__))
    return 0
