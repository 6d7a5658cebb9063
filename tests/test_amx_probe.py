"""The C probe that decides where the llama-server ladder starts asks this machine, and agrees with the kernel.

It compiles and runs a few lines of C (so it is a `process` test). The permission half is checked against the
kernel directly: this test process asks for the AMX tile state itself, through ctypes, and the probe must
give the same answer. A CPU kind with a measured refusal the probe cannot see skips native by its key.
"""

from __future__ import annotations

import ctypes
import os

import pytest

from memory_service.llm.runtime import probe, proven
from memory_service.llm.runtime.variants import VARIANTS

pytestmark = pytest.mark.process  # compiles and runs the probe

ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA, SYS_ARCH_PRCTL = 0x1023, 18, 158
x86 = pytest.mark.skipif(os.uname().machine != "x86_64", reason="AMX and AVX-512 are x86 instructions")


@x86
def test_the_amx_probe_says_what_the_kernel_says():
    if not any(flag.startswith("amx") for flag in proven.cpu_flags()):
        pytest.skip("this CPU lists no AMX")
    libc = ctypes.CDLL(None, use_errno=True)
    granted = libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0
    why = probe.run_probe("amx")
    print(f"kernel grants AMX: {granted}; probe: {why or 'passes'}")
    if granted:
        assert why is None  # granted and the tile instructions ran
    else:
        assert why is not None and "AMX probe failed" in why and "arch_prctl" in why


@x86
def test_the_avx512_probe_runs_where_the_cpu_lists_it():
    if "avx512f" not in proven.cpu_flags():
        pytest.skip("this CPU lists no AVX-512")
    why = probe.run_probe("avx512")
    assert why is None or why.startswith("the AVX512 probe failed here: SIGILL"), why


def test_only_native_builds_are_probed_and_a_known_refusal_is_kept_by_cpu_kind():
    amx_cpu = {"avx2", "avx512f", "amx_tile", "amx_int8"}
    # portable and baseline use nothing a CPU can list and refuse: no probe, no compiler needed
    assert probe.refusal(VARIANTS["portable"], amx_cpu) is None
    assert probe.refusal(VARIANTS["baseline"], amx_cpu) is None
    (cpu, version, name), why = next(iter(probe.KNOWN_REFUSALS.items()))
    assert name == "native"
    said = probe.refusal(VARIANTS["native"], amx_cpu, cpu=cpu)
    assert said is not None and said.startswith("known on this CPU kind") and why in said
    # native-noamx carries no AMX: that kind's refusal is not about it
    assert probe.refusal(VARIANTS["native-noamx"], {"avx2"}, cpu=cpu) is None
