"""doctor | backup | restore | reindex | migrate: operations on the data dir and the model server.

They work on the files and stores directly, not through a running service; the ones that rewrite
stores refuse while a service holds the data dir. Each prints a summary on success (aligned lines for a
person; one line of JSON with `--json`), and `<command> failed: <why>` on stderr with exit code 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import Subcommands, add_data_dir_argument, add_json_argument, data_dir_settings, wants_json
from .progress import Bars


def add_doctor_parser(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser("doctor", help="check that the model server meets the contract and the budget")
    parser.add_argument(
        "--llm-url",
        help="llama-server(s) to check, comma-separated; default: MEMORY_LLM_URL, else start one like `serve` does",
    )
    parser.add_argument("--model", default=None, help="model for the started server (default | tiny | large | path)")
    add_json_argument(parser)
    parser.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    from ..ops.doctor import run_doctor as doctor

    return doctor(args)


def add_data_dir_parsers(subcommands: Subcommands) -> None:
    """Register backup, restore, reindex and migrate, in the order `--help` lists them."""
    _add_backup(subcommands)
    _add_restore(subcommands)
    _add_reindex(subcommands)
    _add_migrate(subcommands)


def _add_backup(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "backup", help="snapshot the data dir into a new directory (the service may keep running)"
    )
    parser.add_argument("dir", help="directory to create; must not exist or be empty")
    add_data_dir_argument(parser)
    add_json_argument(parser)
    parser.set_defaults(func=run_backup)


def run_backup(args: argparse.Namespace) -> int:
    from ..ops.backup import backup

    if not _embedded_only("backup", args):
        return 1
    return _summarised("backup", args, lambda bars: backup(data_dir_settings(args).data_dir, Path(args.dir), bars))


def _add_restore(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser("restore", help="bring a backup back into the data dir (stop the service first)")
    parser.add_argument("dir", help="a directory written by `memory-service backup`")
    add_data_dir_argument(parser)
    parser.add_argument(
        "--force", action="store_true", help="restore over a data dir that holds data (it is moved aside, not deleted)"
    )
    parser.add_argument(
        "--rebuild-vectors",
        action="store_true",
        help="embed everything again even when the backup holds a copy of the vectors",
    )
    add_json_argument(parser)
    parser.set_defaults(func=run_restore)


def run_restore(args: argparse.Namespace) -> int:
    from ..ops.backup import restore

    if not _embedded_only("restore", args):
        return 1
    settings = data_dir_settings(args)
    return _summarised(
        "restore",
        args,
        lambda bars: restore(
            Path(args.dir), settings, force=args.force, rebuild_vectors=args.rebuild_vectors, progress=bars
        ),
    )


def _embedded_only(what: str, args: argparse.Namespace) -> bool:
    """Backup and restore copy the data dir's SQLite files: with MEMORY_DATABASE_URL there are none."""
    if data_dir_settings(args).database_url:
        print(
            f"{what} failed: MEMORY_DATABASE_URL is set, so the journal, limits and keys live in PostgreSQL, "
            "not in the data dir. Back them up with PostgreSQL's own tools (pg_dump / pg_restore), then run "
            "`memory-service reindex` after a restore to rebuild the vectors.",
            file=sys.stderr,
        )
        return False
    return True


def _summarised(what: str, args: argparse.Namespace, action: Callable[[Bars], dict[str, Any]]) -> int:
    """Run a backup or restore with progress bars: its summary, or `<what> failed: <why>` and exit 1."""
    from ..ops.backup import BackupError

    try:
        with Bars() as bars:
            summary = action(bars)
    except BackupError as exc:
        print(f"{what} failed: {exc}", file=sys.stderr)
        return 1
    _print_summary(f"{what} done", summary, args)
    return 0


def _print_summary(title: str, summary: dict[str, Any], args: argparse.Namespace) -> None:
    """One line of JSON with `--json` (the shape scripts parse), aligned `key  value` lines otherwise."""
    if wants_json(args):
        print(json.dumps(summary))
    else:
        from .render import print_summary

        print_summary(title, summary)


def _add_reindex(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "reindex", help="rebuild the vector store from the journal (stop the service first)"
    )
    parser.add_argument("--team", help="only this team's collections (default: every team's)")
    add_data_dir_argument(
        parser,
        help="env MEMORY_DATA_DIR (default ./memory-data); the vectors go to MEMORY_CHROMA_URL when it is set",
    )
    add_json_argument(parser)
    parser.set_defaults(func=run_reindex)


def run_reindex(args: argparse.Namespace) -> int:
    from ..ops.reindex import ReindexError
    from ..ops.reindex import run_reindex as reindex

    try:
        with Bars() as bars:
            summary = reindex(data_dir_settings(args), args.team, progress=bars)
    except ReindexError as exc:
        print(f"reindex failed: {exc}", file=sys.stderr)
        return 1
    _print_summary("reindex done", summary, args)
    return 0


def _add_migrate(subcommands: Subcommands) -> None:
    parser = subcommands.add_parser(
        "migrate", help="copy the data dir's SQLite stores into PostgreSQL, then reindex (stop the service first)"
    )
    parser.add_argument("--to", required=True, help="postgresql://user@host:port/database")
    add_data_dir_argument(parser)
    parser.add_argument(
        "--no-reindex", action="store_true", help="copy only; run `memory-service reindex` later to rebuild the vectors"
    )
    add_json_argument(parser)
    parser.set_defaults(func=run_migrate)


def run_migrate(args: argparse.Namespace) -> int:
    from ..ops.store_copy import MigrateError
    from ..ops.store_copy import run_migrate as migrate

    try:
        summary = migrate(data_dir_settings(args), args.to, reindex_vectors=not args.no_reindex)
    except MigrateError as exc:
        print(f"migrate failed: {exc}", file=sys.stderr)
        return 1
    _print_summary("migrate done", summary, args)
    print(f"done: start the service with MEMORY_DATABASE_URL={args.to.split('://')[0]}://… to use it", file=sys.stderr)
    return 0
