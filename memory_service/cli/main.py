"""The `memory-service` entry point: the parser, assembled from the topic modules beside this one, and `main()`.

Each topic module builds its commands' parsers next to their handlers; this one only lists them in the
order `--help` shows, and turns a configuration error or Ctrl-C into an exit code.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from ..config import ConfigError, early_log_level
from ..logs import TEXT_FORMAT
from . import data, harness, keys, limits, measure, memories, serve
from .common import Subcommands

DESCRIPTION = """`memory-service` command line: serve | doctor | remember | recall | get | list | forget | export | import |
limits | keys | backup | restore | reindex | migrate | llama-server | mcp | bench | eval."""

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
    measure.add_measure_parsers,  # bench, eval
)

EXIT_CONFIG_ERROR, EXIT_INTERRUPTED = 2, 130


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; each command's handler is its `func` default."""
    parser = argparse.ArgumentParser(prog="memory-service", description=DESCRIPTION)
    subcommands = parser.add_subparsers(dest="command", required=True)
    for add_command in COMMANDS:
        add_command(subcommands)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=early_log_level().upper(), format=TEXT_FORMAT)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
