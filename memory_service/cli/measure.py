"""bench | eval: measure a service, its speed under load or its retrieval and extraction quality.

Their flags and runs live with them (memory_service/bench, memory_service/evals); this module only
registers the commands.
"""

from __future__ import annotations

import argparse

from ..bench.options import add_bench_arguments
from ..evals.options import add_eval_arguments
from .common import Subcommands


def add_measure_parsers(subcommands: Subcommands) -> None:
    """Register bench and eval, in the order `--help` lists them."""
    bench = subcommands.add_parser("bench", help="run the benchmark suite, print JSON, write plots")
    add_bench_arguments(bench)
    bench.set_defaults(func=run_bench)

    evaluation = subcommands.add_parser("eval", help="retrieval/extraction eval on LoCoMo / PersonaExt-format data")
    add_eval_arguments(evaluation)
    evaluation.set_defaults(func=run_eval)


def run_bench(args: argparse.Namespace) -> int:
    from ..bench.cli import run_bench as bench

    return bench(args)


def run_eval(args: argparse.Namespace) -> int:
    from ..evals.cli import run_eval as evaluate

    return evaluate(args)
