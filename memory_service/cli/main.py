"""The `memory-service` entry point: the parser, assembled from the topic modules beside this one, and `main()`.

Each topic module builds its commands' parsers next to their handlers; this one only lists them in the
order `--help` shows, adds the flags every command takes (`--json`, `--debug`), and turns whatever a command
lets through into one message on stderr and an exit code (errors.py: the table `--help` prints).
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable

from ..config import early_log_level
from ..logs import TEXT_FORMAT
from . import data, gate, harness, keys, limits, measure, memories, proxy, serve
from .common import Subcommands, package_version
from .errors import EXIT_CODES, EXIT_INTERRUPTED, explain

DESCRIPTION = """`memory-service` command line: serve | doctor | remember | recall | get | list | forget | export | import |
limits | keys | backup | restore | reindex | migrate | llama-server | mcp | gate | proxy | bench | eval."""

# every command, in the order `memory-service --help` lists them
COMMANDS: tuple[Callable[[Subcommands], object], ...] = (
    serve.add_serve_parser,
    data.add_doctor_parser,
    memories.add_memory_parsers,  # remember, recall, get, list, forget, export, import
    limits.add_limits_parser,
    keys.add_keys_parser,
    data.add_data_dir_parsers,  # backup, restore, reindex, migrate
    serve.add_llama_server_parser,
    harness.add_mcp_parser,
    gate.add_gate_parser,
    proxy.add_proxy_parser,
    measure.add_measure_parsers,  # bench, eval
)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; each command's handler is its `func` default."""
    parser = argparse.ArgumentParser(
        prog="memory-service",
        description=DESCRIPTION,
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.add_argument("--json", action="store_true", help="machine-readable JSON on stdout instead of text")
    parser.add_argument("--debug", action="store_true", help="show the traceback behind an error")
    subcommands = parser.add_subparsers(dest="command", required=True)
    for add_command in COMMANDS:
        add_command(subcommands)
    for command in subcommands.choices.values():
        # also after the command (`recall q --debug`); SUPPRESS keeps a global flag the command line set
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=early_log_level().upper(), format=TEXT_FORMAT)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        explained = explain(exc, args)
        if explained is None:
            raise  # a bug: its traceback is what a report needs
        if args.debug:
            traceback.print_exc()
        message, code = explained
        print(f"memory-service {args.command}: {message}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
