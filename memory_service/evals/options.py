"""The options of `memory-service eval`, apart from the harnesses.

Every `memory-service` command builds the full parser, `eval` included, so these
definitions must import nothing heavy: the harnesses (httpx, service runners) load
only when an eval actually runs.
"""

from __future__ import annotations

import argparse

from ..config import ClientEnv


def add_eval_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--data", required=True, action="append", help="a LoCoMo .json or PersonaExt .jsonl file")
    parser.add_argument("--out", default="eval-results")
    env = ClientEnv.from_env()
    parser.add_argument("--url", default=env.url, help="evaluate a running service")
    parser.add_argument("--api-key", default=env.api_key)
    parser.add_argument("--limit", type=int, default=None, help="only the first N conversations / utterances")
    parser.add_argument("--model", default="default", help="model of the self-started service")
    parser.add_argument("--llm-url", default=None, help="self-started service: reuse this llama-server")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="MEMORY_NAME=VALUE",
        dest="settings",
        help="self-started service: this setting too (repeatable), e.g. MEMORY_EXTRACT_COMPLETE=0 "
        "to measure without it",
    )
    parser.add_argument(
        "--consolidate",
        action="store_true",
        help="self-started service: MEMORY_CONSOLIDATE=1, and wait for consolidation before asking",
    )
    return parser


def eval_parser(description: str = "memory-service eval", prog: str = "memory-service eval") -> argparse.ArgumentParser:
    """The same options as `memory-service eval`, for `python -m memory_service.evals`."""
    return add_eval_arguments(argparse.ArgumentParser(prog=prog, description=description))
