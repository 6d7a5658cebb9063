"""The options of `memory-service bench`, apart from the benchmarks.

Every `memory-service` command builds the full parser, `bench` included, so these
definitions must import nothing heavy: the benchmarks (httpx, numpy, service runners)
load only when the suite actually runs.
"""

from __future__ import annotations

import argparse

from .soak_options import add_soak_arguments


def add_bench_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--out", default="bench-results", help="directory for JSON and PNG results")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("step", nargs="?", choices=("soak",), help="soak: the fault-injection soak alone")
    return add_soak_arguments(parser)
