"""What several commands share: the service URL and key flags, the data-dir flag, `--json`, printing an answer.

Kept light (argparse, json, httpx, config): every command imports it, and a command-line call should
start quickly.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

import httpx

from ..client.service import path_segment, service_client
from ..config import DEFAULT_URL, ClientEnv, Settings
from .errors import checked

# the object `add_subparsers()` returns, which each topic module adds its commands to
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

DATA_DIR_HELP = "env MEMORY_DATA_DIR (default ./memory-data)"


def add_client_arguments(parser: argparse.ArgumentParser) -> None:
    """`--url` and `--api-key`, for the commands that talk to a running service."""
    env = ClientEnv.from_env()
    parser.add_argument(
        "--url", type=service_url, default=env.service_url, help=f"service URL (env MEMORY_URL, default {DEFAULT_URL})"
    )
    parser.add_argument(
        "--api-key", default=env.api_key, help="API key (env MEMORY_API_KEY); none for a keyless service"
    )


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    """`--json` after the command too; SUPPRESS keeps `memory-service --json CMD`'s value when it is absent."""
    parser.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable JSON on stdout instead of text"
    )


def wants_json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


def service_url(value: str) -> str:
    """An argparse type for `--url` (and MEMORY_URL): `localhost:8850` means http://localhost:8850, as curl reads
    it; a scheme other than http(s) is a usage error that names the flag."""
    value = value.strip()
    if "://" not in value:
        value = f"http://{value}"
    scheme = value.split("://", 1)[0].lower()
    if scheme not in ("http", "https") or value.endswith("://"):
        raise argparse.ArgumentTypeError(f"{value!r} is not an http:// or https:// URL, e.g. {DEFAULT_URL}")
    return value


def package_version() -> str:
    """The installed distribution's version (pyproject.toml's), for `--version`."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("memory-service")
    except PackageNotFoundError:
        return "unknown (not installed)"


def add_data_dir_argument(parser: argparse.ArgumentParser, help: str = DATA_DIR_HELP) -> None:
    """`--data-dir`, for the commands that work on the data dir itself (the service need not run)."""
    parser.add_argument("--data-dir", help=help)


def data_dir_settings(args: argparse.Namespace) -> Settings:
    """The settings from the environment, with `--data-dir` when it was given."""
    return Settings.from_env().with_overrides(data_dir=Path(args.data_dir) if args.data_dir else None)


def open_service(args: argparse.Namespace) -> httpx.Client:
    """A client for `--url` with `--api-key`; the timeout covers a `remember --wait` of a couple of minutes."""
    return service_client(args.url, args.api_key, timeout=150)


def answer(response: httpx.Response) -> Any:
    """The service's JSON answer; an HTTP error raises `ServiceAnswered`, which `main` prints on stderr."""
    return checked(response).json()


def print_json(payload: Any) -> None:
    """`--json` output: indented, as the commands always printed it (scripts parse it, keep it stable)."""
    print(json.dumps(payload, indent=2))


def positive_int(value: str) -> int:
    """An argparse type: a whole number of 1 or more, with a message that says which it is not."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value} is not 1 or more")
    return number


def path_argument(what: str) -> Callable[[str], str]:
    """An argparse type for a value the command puts into a URL path (an id, a limit name): encoded as one
    segment, and `.`/`..` refused, so `forget ../limits/burst` is a usage error, not a deleted limit."""

    def convert(value: str) -> str:
        try:
            return path_segment(value, what)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert
