"""The command line a benchmark module shares, and its output: JSON on stdout, JSON and PNG under --out."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..testbed.results import save_plot, write_json
from ..testbed.service_runner import start_llama

Plot = Callable[[Any, Path], None]


def _parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog=f"python -m {__package__}.{name}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def main_with_llama(
    argv: list[str] | None,
    *,
    doc: str | None,
    name: str,
    run: Callable[..., Any],
    plot: Plot,
    own_llama: bool = False,
) -> int:
    """The command line every model-backed benchmark shares: --quick, --llm-url or --model, --out.

    `own_llama`: the benchmark starts its llama-server itself (with flags of its own) when no --llm-url.
    """
    parser = _parser(name, doc)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--llm-url", help="a running llama-server (default: start one with the default model)")
    parser.add_argument("--model", default="default")
    parser.add_argument("--out", type=Path, help="also write JSON and PNG here")
    args = parser.parse_args(argv)
    if own_llama:
        return report(run(llm_url=args.llm_url, quick=args.quick, model=args.model), name, plot, args.out)
    if args.llm_url:
        return report(run(llm_url=args.llm_url, quick=args.quick), name, plot, args.out)
    llama = start_llama(args.model)
    try:
        result = run(llm_url=llama.url, quick=args.quick)
    finally:
        llama.stop()
    return report(result, name, plot, args.out)


def main_without_llama(
    argv: list[str] | None,
    *,
    doc: str | None,
    name: str,
    run: Callable[..., Any],
    plot: Plot,
    quick: str,
    failed: Callable[[Any], bool] = lambda result: False,
) -> int:
    """The command line of a benchmark that needs no model: --quick (what it means: `quick`), --out."""
    parser = _parser(name, doc)
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--out", type=Path, help="also write JSON and PNG here")
    args = parser.parse_args(argv)
    result = run(quick=args.quick)
    return report(result, name, plot, args.out, failed=failed(result))


def report(result: Any, name: str, plot: Plot, out: Path | None, *, failed: bool = False) -> int:
    """Print the JSON, write it and its plot under `out`; exit status 1 when a check `failed`."""
    print(json.dumps(result, indent=2))
    if out:
        write_json(out / f"{name}.json", result)
        save_plot(plot, result, out / f"{name}.png")
    return 1 if failed else 0
