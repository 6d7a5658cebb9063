"""Build llama-server from source, prove it on this CPU, fall back when the CPU refuses it.

Why this exists: a CPU can advertise instructions (AMX, AVX-512) that the VM
around it refuses. A `-march=native` binary then passes `--version` and dies
with SIGILL at its first matrix multiply. So no build is used until it has
completed tokens on a real model here, and a build that dies steps down a
ladder of variants (native -> native without AMX -> portable AVX2 -> baseline
x86-64) on its own. The outcome is recorded once per binary and CPU (see
`proven.py`), so this costs seconds once per machine, not at every start.
A variant not built yet is first put to a C probe (`probe.py`): one this
process cannot run is skipped, which saves its build, not its proof.

Run by the bootstrap as ``python -m memory_service.llm.runtime.build --model default tiny``: every model
the bootstrap assembled is run once, since different quantisations reach different CPU kernels.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from ...config import llama_build_variant
from . import probe, proven
from .compile import Progress, bootstrap_log, cmake_build, run_with_progress
from .server import LlamaServerError, LlamaServerProcess
from .variants import (
    LLAMA_VERSION,
    VARIANTS,
    BuildError,
    Variant,
    binary_path,
    build_key,
    ladder,
)

__all__ = [
    "LLAMA_VERSION",
    "VARIANTS",
    "BuildError",
    "Progress",
    "SmokeTimeout",
    "Variant",
    "binary_path",
    "build_key",
    "cmake_build",
    "ensure_llama_server",
    "ladder",
    "prove",
    "run_with_progress",
    "smoke_test",
]


# --------------------------------------------------------------------------- proving


SMOKE_PROMPT = (
    "Notes from the weekly operations review. The staging deploy window is Tuesday afternoon, production "
    "deploys need two approvals, and the outbound email quota is fifty messages a day. Summary:"
)


class SmokeTimeout(BuildError):
    """The machine was too slow to finish the smoke test in time: not a verdict on the binary."""


def smoke_test(binary: Path, model: Path, variant: str, timeout_s: float = 600.0) -> proven.Verdict:
    """Start the binary on a real model and complete a few tokens. A death by signal is a refusal."""
    started = time.monotonic()
    verdict = proven.Verdict(
        ok=False,
        variant=variant,
        binary=str(binary),
        sha256=proven.sha256_of(binary),
        cpu=proven.cpu_key(),
        model=model.name,
    )
    server = LlamaServerProcess(binary=binary, model=model, threads=1, ctx=1024)
    try:
        server.start(wait_s=timeout_s)
    except LlamaServerError as exc:
        if exc.returncode is None:
            raise SmokeTimeout(f"llama-server '{variant}' {exc}: the machine may be very slow; run again") from exc
        verdict.why = f"llama-server {proven.describe_exit(exc.returncode)} while loading {model.name}"
        verdict.by_signal = exc.returncode < 0
        return verdict
    try:
        reply = httpx.post(
            server.url + "/completion",
            timeout=timeout_s,
            trust_env=False,
            json={"prompt": SMOKE_PROMPT, "n_predict": 8, "temperature": 0, "cache_prompt": False},
        )
        body = reply.json()
        timings = body.get("timings", {})
        if reply.status_code != 200 or body.get("tokens_predicted", 0) < 1:
            verdict.why = f"completion answered {reply.status_code} with no tokens: {reply.text[:300]}"
            return verdict
        verdict.ok = True
        verdict.prompt_tps = round(float(timings.get("prompt_per_second", 0.0)), 1)
        verdict.gen_tps = round(float(timings.get("predicted_per_second", 0.0)), 1)
    except (httpx.HTTPError, ValueError) as exc:
        try:
            code = server.process.wait(5) if server.process else None
        except subprocess.TimeoutExpired:
            code = None  # still running: the failure was the request's, not a crash
        verdict.why = (
            f"llama-server {proven.describe_exit(code)} during its first completion"
            if code is not None
            else f"completion failed: {exc!r}"
        )
        verdict.by_signal = code is not None and code < 0
        return verdict
    finally:
        server.stop()
        verdict.seconds = round(time.monotonic() - started, 1)
    return verdict


# --------------------------------------------------------------------------- the ladder

Builder = Callable[[Variant, Path, Path], None]
Smoker = Callable[[Path, Path, str], proven.Verdict]
Refusal = Callable[[Variant], str | None]  # why this process cannot run a variant; None: build and prove it


def prove(binary: Path, models: list[Path], variant: str, smoke: Smoker) -> proven.Verdict:
    """Run the binary on each model; the first failure is the verdict, else the first model's (its speeds)."""
    first: proven.Verdict | None = None
    for model in models:
        verdict = smoke(binary, model, variant)
        if not verdict.ok:
            return verdict
        first = first or verdict
    assert first is not None, "no model to prove the build with"
    return first


def ensure_llama_server(
    cache_dir: Path,
    model: Path | list[Path],
    choice: str = "auto",
    *,
    build: Builder = cmake_build,
    smoke: Smoker = smoke_test,
    cpu_flags: set[str] | None = None,
    log: Callable[[str], None] = bootstrap_log,
    refusal: Refusal | None = None,
) -> proven.Verdict:
    """Return the proven build for this CPU, building and proving variants down the ladder as needed.

    `refusal` (by default the C probe of `probe.py`) may skip a variant not built yet: it saves a build
    this process could not run. A built variant is judged by its smoke test alone.
    """
    models = model if isinstance(model, list) else [model]
    flags = proven.cpu_flags() if cpu_flags is None else cpu_flags
    steps = ladder(choice, flags)
    refused = refusal or (lambda variant: probe.refusal(variant, flags))
    failures: list[str] = []
    for index, variant in enumerate(steps):
        binary = binary_path(cache_dir, variant)
        nxt = steps[index + 1].name if index + 1 < len(steps) else None
        stamp = proven.stamp_of(binary) if binary.is_file() else None
        if stamp is not None and stamp.ok and not stamp.model:
            stamp = None  # proven before speeds were kept per model: prove again (seconds)
        if stamp is not None and stamp.ok:
            proven.save_record(cache_dir, stamp)
            log(f"llama-server '{variant.name}' cached and proven on this CPU: {binary}")
            return stamp
        if stamp is not None:
            failures.append(f"{variant.name}: {stamp.why}")
            log(
                f"llama-server '{variant.name}' was refused by this CPU earlier ({stamp.why})"
                + (f"; using '{nxt}'" if nxt else "")
            )
            continue
        if not binary.is_file():
            why = refused(variant) if nxt is not None and choice == "auto" else None
            if why:
                failures.append(f"{variant.name}: not built, {why}")
                log(f"skipping llama-server '{variant.name}' ({why}); next: '{nxt}'")
                continue
            build(variant, binary, cache_dir)
        log(
            f"proving llama-server '{variant.name}' on {', '.join(m.name for m in models)} "
            "(a few seconds, once per machine)"
        )
        verdict = prove(binary, models, variant.name, smoke)
        if verdict.ok or verdict.by_signal:
            # kept: proven, or refused by this CPU for good; any other failure is tried again next time
            proven.save_stamp(verdict)
        if verdict.ok:
            proven.save_record(cache_dir, verdict)
            log(
                f"llama-server '{variant.name}' runs here: prompt {verdict.prompt_tps} tok/s, "
                f"generation {verdict.gen_tps} tok/s; in use: {binary}"
            )
            return verdict
        failures.append(f"{variant.name}: {verdict.why}")
        log(
            f"llama-server variant '{variant.name}' failed its smoke test: {verdict.why}; "
            + (f"falling back to '{nxt}'" if nxt else "no variant left")
        )
    raise BuildError(
        "no llama-server variant runs on this machine:\n  "
        + "\n  ".join(failures)
        + ("\n(MEMORY_LLAMA_BUILD=auto tries every variant)" if choice != "auto" else "")
    )


def main(argv: list[str] | None = None) -> int:
    from . import gguf

    parser = argparse.ArgumentParser(description="build and prove llama-server on this CPU")
    parser.add_argument(
        "--model",
        nargs="+",
        default=["default"],
        help="models to prove the build with; the first one's speeds are kept (default: %(default)s)",
    )
    parser.add_argument(
        "--variant",
        default=llama_build_variant(),
        help=f"auto or one of {', '.join(VARIANTS)} (env MEMORY_LLAMA_BUILD)",
    )
    args = parser.parse_args(argv)
    cache_dir = gguf.cache_dir()
    try:
        paths = [gguf.resolve_model(name, cache_dir) for name in args.model]
        verdict = ensure_llama_server(cache_dir, paths, args.variant)
    except (BuildError, subprocess.CalledProcessError) as exc:
        bootstrap_log(str(exc))
        return 1
    print(verdict.binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
