"""Before a `-march=native` build: may this process use what the CPU advertises? A few-line C probe asks.

Why: a CPU can list AMX or AVX-512 that the VM around it refuses, and a native build of llama-server then
dies in its smoke test after minutes of compiling (most of a fresh set-up's 6 min 41 s). Asking first costs a tenth of a second: the probe asks
the kernel for the AMX tile state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, as ggml does) and
executes tile instructions, or one AVX-512 instruction, catching SIGILL/SIGSEGV. A refusal skips the builds
that would need it. Only a refusal counts: a passing probe (or none, without a C compiler) leaves the
ladder as it was, and the smoke test on a real model stays the proof of any build.

Stdlib only: the bootstrap runs it (through `prebuild`) before the project's dependencies are installed.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

from . import proven
from .variants import LLAMA_VERSION, Variant

# Machine code as bytes, so no assembler or -mamx flag is needed (GCC 10 and older binutils lack them).
PROBE_C = r"""
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static sigjmp_buf env;
static void on_signal(int sig) { siglongjmp(env, sig); }

int main(int argc, char **argv) {
    static unsigned char cfg[64] __attribute__((aligned(64)));
    int sig;
    signal(SIGILL, on_signal);
    signal(SIGSEGV, on_signal);
    if ((sig = sigsetjmp(env, 1)) != 0) {
        printf("%s\n", sig == SIGILL ? "SIGILL (illegal instruction)" : "SIGSEGV (general protection)");
        return 3;
    }
    if (argc > 1 && strcmp(argv[1], "avx512") == 0) {
        __asm__ volatile(".byte 0x62,0xf1,0x7d,0x48,0xfe,0xc0" ::: "xmm0", "memory"); /* vpaddd zmm0,zmm0,zmm0 */
        return 0;
    }
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) != 0) {
        printf("the kernel refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM failed)\n");
        return 2;
    }
    cfg[0] = 1; cfg[16] = 64; cfg[48] = 16; /* palette 1; tile 0: 16 rows of 64 bytes */
    __asm__ volatile(".byte 0xc4,0xe2,0x78,0x49,0x07" :: "D"(cfg) : "memory"); /* ldtilecfg (%rdi) */
    __asm__ volatile(".byte 0xc4,0xe2,0x7b,0x49,0xc0" ::: "memory");          /* tilezero %tmm0 */
    __asm__ volatile(".byte 0xc4,0xe2,0x78,0x49,0xc0" ::: "memory");          /* tilerelease */
    return 0;
}
"""

# Refusals measured on a CPU kind (proven.cpu_key: model name and flag set) where the probe passes but the
# build still died, so no probe can see it. Keyed by llama.cpp version too: a new version is tried afresh.
KNOWN_REFUSALS: dict[tuple[str, str, str], str] = {
    # the 2-core cloud VM of issue 34, "Intel(R) Xeon(R) Processor" with AMX and AVX-512: AMX is granted and
    # computes here (this probe passes, and so does a tdpbssd checked against its sum), yet the native build
    # died with SIGSEGV loading the default model's Q4_K_M weights (llama.cpp's AMX path; upstream
    # ggml-org/llama.cpp#20824 reports the same); native-noamx runs (2026-12-04)
    ("7808973848", "11434", "native"): "llama.cpp's AMX kernels died with SIGSEGV loading Q4_K weights",
}


@functools.cache
def run_probe(kind: str) -> str | None:
    """Why this process may not use `kind` ('amx' or 'avx512'), or None: allowed, or no compiler to ask."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    with tempfile.TemporaryDirectory(prefix="memory-probe-") as tmp:
        source, exe = Path(tmp) / "probe.c", Path(tmp) / "probe"
        source.write_text(PROBE_C)
        if subprocess.run([cc, "-O0", "-o", str(exe), str(source)], capture_output=True).returncode != 0:
            return None  # a compiler that cannot build this says nothing about the CPU
        try:
            proc = subprocess.run([str(exe), kind], capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            return None
    if proc.returncode == 0:
        return None
    said = proc.stdout.strip() or proven.describe_exit(proc.returncode)
    return f"the {kind.upper()} probe failed here: {said}"


def refusal(variant: Variant, cpu_flags: set[str], cpu: str | None = None) -> str | None:
    """Why `variant` cannot run in this process though the CPU lists what it needs; None: try it."""
    if not variant.name.startswith("native"):
        return None  # portable and baseline use only what every x86-64-v3 / x86-64 CPU has
    amx = not variant.forbid_amx and any(flag.startswith("amx") for flag in cpu_flags)
    known = KNOWN_REFUSALS.get((cpu or proven.cpu_key(), LLAMA_VERSION, variant.name)) if amx else None
    if known:  # what died there was an AMX build on a CPU listing AMX
        return f"known on this CPU kind: {known}"
    if "avx512f" in cpu_flags:
        why = run_probe("avx512")
        if why:
            return why
    return run_probe("amx") if amx else None
