"""Compile the llama-server the ladder would try first, before anything else is installed.

Why: the compile is most of a fresh machine's set-up (6 min 41 s on 2 cores) and needs only a compiler and the
llama.cpp source, not the project's dependencies. So the bootstrap starts it first, in the background, with
the bare virtualenv's interpreter (this module and what it imports are stdlib only), and installs the
dependencies and assembles the models meanwhile. The build step that follows (`build`) then finds the binary
and proves it on a real model; if this CPU refuses it, that step falls down the ladder as before.

Run as ``python -m memory_service.llm.runtime.prebuild --cache-dir DIR [--variant auto]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from . import probe, proven
from .compile import bootstrap_log, cmake_build, fmt_seconds
from .variants import BuildError, Variant, binary_path, ladder


def next_to_build(
    cache_dir: Path,
    steps: list[Variant],
    refusal: Callable[[Variant], str | None],
    log: Callable[[str], None] = bootstrap_log,
) -> Variant | None:
    """The variant `build.ensure_llama_server` would compile first; None when it would compile nothing."""
    for index, variant in enumerate(steps):
        binary = binary_path(cache_dir, variant)
        if binary.is_file():
            stamp = proven.stamp_of(binary)
            if stamp is not None and not stamp.ok:
                continue  # refused by this CPU before: the ladder steps past it
            return None  # proven, or built and waiting for its proof
        why = refusal(variant) if index + 1 < len(steps) else None
        if why:
            log(f"skipping llama-server '{variant.name}' ({why})")
            continue
        return variant
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="compile the llama-server variant the ladder tries first")
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--variant", default="auto", help="auto or one variant (MEMORY_LLAMA_BUILD)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        flags = proven.cpu_flags()
        steps = ladder(args.variant, flags)
        auto = args.variant == "auto"
        variant = next_to_build(args.cache_dir, steps, lambda v: probe.refusal(v, flags) if auto else None)
        if variant is None:
            return 0
        cmake_build(variant, binary_path(args.cache_dir, variant), args.cache_dir)
        print(variant.name)  # for the bootstrap: something was compiled
    except (BuildError, OSError, subprocess.CalledProcessError) as exc:
        bootstrap_log(f"compiling llama-server failed: {exc}")
        return 1
    bootstrap_log(f"phase 'llama-server compiled ({variant.name})': {fmt_seconds(time.monotonic() - started)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
