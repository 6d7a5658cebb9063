"""The llama-server build is trusted only after it ran a real model here, and falls back when the CPU refuses it.

No real rebuild happens here: the build step is injected and writes stand-in
executables. A refused variant is a script that kills itself with SIGILL, as a
binary with AMX instructions does on a VM that hides AMX. A working variant is
a script that execs the real, already proven llama-server, so the smoke test
still completes tokens on a real model.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import CACHE

from memory_service.config import Settings
from memory_service.llm.runtime import build, proven
from memory_service.llm.runtime.gguf import ensure_model
from memory_service.llm.runtime.server import LlamaServerError, LlamaServerProcess, find_binary, launch

AMX_CPU = {"avx2", "fma", "avx512f", "amx_tile", "amx_int8", "amx_bf16"}


def real_llama_server() -> Path:
    return find_binary(os.environ.get("MEMORY_LLAMA_BIN"), CACHE)


def write_exe(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


class InjectedBuilds:
    """A build step that writes stand-ins: the named variants die with SIGILL, the rest run the real server."""

    def __init__(self, refused: set[str]) -> None:
        self.refused = refused
        self.built: list[str] = []

    def __call__(self, variant: build.Variant, binary: Path, cache_dir: Path) -> None:
        self.built.append(variant.name)
        if variant.name in self.refused:
            write_exe(binary, "kill -ILL $$")
        else:
            write_exe(binary, f'exec "{real_llama_server()}" "$@"')


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    return ensure_model("tiny", CACHE)


def test_a_refused_build_falls_back_to_the_next_variant_and_is_never_cached_as_good(tmp_path, tiny_model):
    cache = tmp_path / "cache"
    builds = InjectedBuilds(refused={"native", "native-noamx"})
    lines: list[str] = []

    # a probe that passes (as AMX's does on a VM that grants it): only the smoke test can tell
    verdict = build.ensure_llama_server(
        cache, tiny_model, build=builds, cpu_flags=AMX_CPU, log=lines.append, refusal=lambda _: None
    )
    print("\n".join(lines))  # the fallback output, as a user sees it

    assert builds.built == ["native", "native-noamx", "portable"]
    assert verdict.ok and verdict.variant == "portable"
    assert verdict.gen_tps and verdict.gen_tps > 0  # the real model completed tokens
    falls = [line for line in lines if "failed its smoke test" in line]
    assert len(falls) == 2
    assert "'native'" in falls[0] and "SIGILL" in falls[0] and "illegal instruction" in falls[0]
    assert "falling back to 'native-noamx'" in falls[0]
    assert "falling back to 'portable'" in falls[1]
    assert any("'portable' runs here" in line for line in lines)

    # One truth: the record names the portable build, and that is what serve/doctor/tests find.
    assert find_binary(None, cache) == build.binary_path(cache, build.VARIANTS["portable"])
    for name in ("native", "native-noamx"):
        stamp = proven.stamp_of(build.binary_path(cache, build.VARIANTS[name]))
        assert stamp is not None and not stamp.ok and "SIGILL" in stamp.why

    # A second bootstrap neither rebuilds nor re-runs anything: refused stays refused, proven stays proven.
    smoked: list[str] = []

    def no_smoke(binary: Path, model: Path, variant: str) -> proven.Verdict:
        smoked.append(variant)
        raise AssertionError("a proven or refused build was tested again")

    again = build.ensure_llama_server(
        cache, tiny_model, build=builds, smoke=no_smoke, cpu_flags=AMX_CPU, log=lines.append, refusal=lambda _: None
    )
    assert again.variant == "portable" and builds.built == ["native", "native-noamx", "portable"]
    assert smoked == []


def test_a_changed_binary_is_not_trusted_until_proven_again(tmp_path, tiny_model):
    cache = tmp_path / "cache"
    builds = InjectedBuilds(refused=set())
    first = build.ensure_llama_server(cache, tiny_model, build=builds, cpu_flags={"avx2"}, log=lambda _: None)
    assert first.variant == "native"
    binary = Path(first.binary)
    assert find_binary(None, cache) == binary

    # The bytes change (a rebuild, a copy from another machine): the record no longer applies.
    write_exe(binary, "kill -ILL $$")
    assert proven.current(cache) is None
    try:
        found: Path | None = find_binary(None, cache)
    except LlamaServerError as exc:
        assert "no llama-server proven" in str(exc)
        found = None
    assert found != binary

    lines: list[str] = []
    verdict = build.ensure_llama_server(cache, tiny_model, build=builds, cpu_flags={"avx2"}, log=lines.append)
    assert verdict.variant == "portable"
    assert any("'native' failed its smoke test" in line for line in lines)


def test_a_build_is_proven_on_every_model_since_each_quantisation_reaches_other_kernels(tmp_path, tiny_model):
    """A binary that runs one model and dies on another's kernels is refused, not kept half-proven."""
    cache = tmp_path / "cache"
    default_model = ensure_model("default", CACHE)

    def build_dying_on_the_second_model(variant: build.Variant, binary: Path, cache_dir: Path) -> None:
        if variant.name == "native":  # dies only when it loads the tiny model's Q4_1 weights
            write_exe(
                binary, f'case "$*" in *{tiny_model.name}*) kill -ILL $$;; esac\nexec "{real_llama_server()}" "$@"'
            )
        else:
            InjectedBuilds(refused=set())(variant, binary, cache_dir)

    lines: list[str] = []
    verdict = build.ensure_llama_server(
        cache, [default_model, tiny_model], build=build_dying_on_the_second_model, cpu_flags={"avx2"}, log=lines.append
    )
    assert verdict.variant == "portable" and verdict.model == default_model.name  # speeds of the first model
    assert any("'native' failed its smoke test" in line and tiny_model.name in line for line in lines)


def test_a_build_that_fails_without_a_signal_falls_back_now_but_is_tried_again_next_time(tmp_path, tiny_model):
    """Only a death by signal is the CPU's verdict; an exit code may be passing trouble (memory, a full disk)."""
    cache = tmp_path / "cache"
    builds = InjectedBuilds(refused=set())
    failing = build.binary_path(cache, build.VARIANTS["native"])

    def build_with_a_failing_native(variant: build.Variant, binary: Path, cache_dir: Path) -> None:
        builds(variant, binary, cache_dir)
        if variant.name == "native":
            write_exe(binary, "exit 3")

    first = build.ensure_llama_server(
        cache, tiny_model, build=build_with_a_failing_native, cpu_flags={"avx2"}, log=lambda _: None
    )
    assert first.variant == "portable"
    assert proven.stamp_of(failing) is None  # not remembered as refused
    write_exe(failing, f'exec "{real_llama_server()}" "$@"')  # the trouble has passed
    second = build.ensure_llama_server(cache, tiny_model, build=builds, cpu_flags={"avx2"}, log=lambda _: None)
    assert second.variant == "native"


def test_a_forced_variant_that_the_cpu_refuses_fails_with_every_reason(tmp_path, tiny_model):
    builds = InjectedBuilds(refused={"native"})
    with pytest.raises(build.BuildError) as err:
        build.ensure_llama_server(tmp_path, tiny_model, "native", build=builds, cpu_flags=AMX_CPU, log=lambda _: None)
    assert "native: llama-server was killed by SIGILL" in str(err.value)
    assert "MEMORY_LLAMA_BUILD=auto" in str(err.value)
    with pytest.raises(build.BuildError, match="must be 'auto' or one of"):
        build.ladder("fastest", AMX_CPU)


def test_the_ladder_follows_the_cpu():
    names = lambda flags: [v.name for v in build.ladder("auto", flags, machine="x86_64")]  # noqa: E731
    assert names(AMX_CPU) == ["native", "native-noamx", "portable", "baseline"]
    assert names({"avx2", "fma"}) == ["native", "portable", "baseline"]
    assert names({"sse4_2"}) == ["native", "baseline"]
    assert [v.name for v in build.ladder("auto", set(), machine="aarch64")] == ["native"]
    # Every cache key carries the variant; CPU-specific builds carry the CPU too.
    native, portable = build.build_key(build.VARIANTS["native"]), build.build_key(build.VARIANTS["portable"])
    assert "-native-" in native and proven.cpu_key() in native
    assert "-portable-" in portable and proven.cpu_key() not in portable


def test_a_sigill_at_run_time_names_the_cause_and_the_remedy_and_retires_the_build(tmp_path, tiny_model):
    cache = tmp_path / "cache"
    builds = InjectedBuilds(refused=set())
    verdict = build.ensure_llama_server(cache, tiny_model, build=builds, cpu_flags={"avx2"}, log=lambda _: None)
    binary = Path(verdict.binary)
    # The proven build starts dying later (say, a kernel the smoke test never reached).
    write_exe(binary, "kill -ILL $$")
    proven.save_stamp(
        proven.Verdict(
            ok=True, variant="native", binary=str(binary), sha256=proven.sha256_of(binary), cpu=proven.cpu_key()
        )
    )
    proven.save_record(cache, proven.stamp_of(binary))
    settings = Settings(cache_dir=cache, llama_threads=1, llama_ctx=512)

    with pytest.raises(LlamaServerError) as err:
        launch(settings, tiny_model, tmp_path / "llama.log")
    message = str(err.value)
    assert err.value.returncode == -signal.SIGILL
    assert "illegal instruction" in message and "CPU instructions this machine does not allow" in message
    assert "scripts/bootstrap.sh" in message and "MEMORY_LLAMA_BUILD=portable" in message
    assert "code -4" not in message
    # The next bootstrap will not pick it again.
    assert proven.current(cache) is None
    assert proven.stamp_of(binary) is not None and not proven.stamp_of(binary).ok


def test_other_deaths_are_named_in_plain_words(tmp_path, tiny_model):
    for body, words in (("kill -SEGV $$", "segmentation fault"), ("exit 3", "exited with code 3")):
        exe = tmp_path / "llama-server"
        write_exe(exe, body)
        with pytest.raises(LlamaServerError, match=words):
            LlamaServerProcess(binary=exe, model=tiny_model, threads=1, ctx=512).start(wait_s=30)


def test_build_progress_is_one_line_per_tenth_in_a_log():
    out = io.StringIO()
    progress = build.Progress("building llama-server (native)", stream=out)
    for step in range(1, 209):
        progress.update(step, 208)
    progress.finish()
    lines = out.getvalue().splitlines()
    assert 10 <= len(lines) <= 11
    assert lines[-1].startswith("[bootstrap] building llama-server (native): 100% [208/208]")


@pytest.mark.process  # a stand-in ninja script
def test_build_progress_reads_ninja_output(tmp_path):
    script = tmp_path / "fake-ninja"
    write_exe(script, 'for i in 1 2 3 4; do echo "[$i/4] Building CXX object x$i.o"; done; echo done')
    out = io.StringIO()
    code = build.run_with_progress([str(script)], tmp_path / "build.log", build.Progress("b", stream=out))
    assert code == 0
    assert "100% [4/4]" in out.getvalue()
    assert (tmp_path / "build.log").read_text().count("Building CXX") == 4


@pytest.mark.model
@pytest.mark.process  # runs the proven llama-server binary
def test_the_build_in_use_here_was_proven_on_this_cpu():
    if os.environ.get("MEMORY_LLAMA_BIN"):
        pytest.skip("MEMORY_LLAMA_BIN chooses the binary; nothing to prove")
    record = proven.current(CACHE)
    assert record is not None and record.ok, "the bootstrap must leave a proven build"
    assert Path(record.binary) == real_llama_server()
    assert record.variant in build.VARIANTS
    # It really runs here: the real binary answers --version (and the smoke test completed tokens).
    assert subprocess.run([record.binary, "--version"], capture_output=True).returncode == 0


# --------------------------------------------------------------------------- the ladder's start (issue 34)
# In-process: the builds write stand-in files and a stand-in smoke test judges them by name, so these run
# in milliseconds; the real probe is tests/test_amx_probe.py.


class StandInSmoke:
    """A smoke test that runs nothing: the variants named in `dying` die by SIGSEGV, as native did here."""

    def __init__(self, dying: set[str]) -> None:
        self.dying = dying
        self.smoked: list[str] = []

    def __call__(self, binary: Path, model: Path, variant: str) -> proven.Verdict:
        self.smoked.append(variant)
        dies = variant in self.dying
        return proven.Verdict(
            ok=not dies,
            variant=variant,
            binary=str(binary),
            sha256=proven.sha256_of(binary),
            cpu=proven.cpu_key(),
            model=model.name,
            why="llama-server was killed by SIGSEGV while loading the model" if dies else "",
            by_signal=dies,
            prompt_tps=None if dies else 70.0,
            gen_tps=None if dies else 12.0,
        )


def refusing(*names: str):
    """A stand-in probe: these variants cannot run in this process; it records what it was asked."""
    asked: list[str] = []

    def refusal(variant: build.Variant) -> str | None:
        asked.append(variant.name)
        return "the AMX probe failed here: stand-in" if variant.name in names else None

    refusal.asked = asked  # type: ignore[attr-defined]
    return refusal


def start_ladder(cache: Path, refusal, dying: set[str] = frozenset(), choice: str = "auto"):
    builds, smoke, lines = InjectedBuilds(refused=set()), StandInSmoke(set(dying)), []
    verdict = build.ensure_llama_server(
        cache,
        cache / "stand-in.gguf",
        choice,
        build=builds,
        smoke=smoke,
        cpu_flags=AMX_CPU,
        log=lines.append,
        refusal=refusal,
    )
    return verdict, builds.built, smoke.smoked, lines


def test_a_failing_probe_skips_native_so_llama_server_is_built_once(tmp_path):
    verdict, built, smoked, lines = start_ladder(tmp_path, refusing("native"))
    assert built == ["native-noamx"] and smoked == ["native-noamx"]
    assert verdict.ok and verdict.variant == "native-noamx"
    assert any(
        "skipping llama-server 'native' (the AMX probe failed" in line and "'native-noamx'" in line for line in lines
    )
    # the next bootstrap finds the proven build: nothing built, nothing smoked
    again, built_again, smoked_again, _ = start_ladder(tmp_path, refusing("native"))
    assert again.variant == "native-noamx" and built_again == [] and smoked_again == []


def test_a_passing_probe_keeps_native(tmp_path):
    refusal = refusing()
    verdict, built, smoked, _ = start_ladder(tmp_path, refusal)
    assert built == ["native"] and smoked == ["native"] and verdict.variant == "native"
    assert refusal.asked == ["native"]


def test_a_variant_the_probe_passes_that_dies_in_its_smoke_test_falls_back_as_before(tmp_path):
    verdict, built, smoked, lines = start_ladder(tmp_path, refusing(), dying={"native"})
    assert built == ["native", "native-noamx"] and smoked == ["native", "native-noamx"]
    assert verdict.variant == "native-noamx"
    assert any("'native' failed its smoke test" in line and "SIGSEGV" in line for line in lines)
    stamp = proven.stamp_of(build.binary_path(tmp_path, build.VARIANTS["native"]))
    assert stamp is not None and not stamp.ok and stamp.by_signal


def test_the_proof_beats_the_probe_and_a_forced_variant_is_not_probed(tmp_path):
    # native built and proven earlier: a probe that now refuses it costs no rebuild and no other variant
    first, _, _, _ = start_ladder(tmp_path, refusing())
    refusal = refusing("native")
    again, built, _, _ = start_ladder(tmp_path, refusal)
    assert first.variant == again.variant == "native" and built == [] and refusal.asked == []
    # MEMORY_LLAMA_BUILD=native: the operator asked for it, the smoke test decides
    forced = refusing("native")
    verdict, built, _, _ = start_ladder(tmp_path / "forced", forced, choice="native")
    assert verdict.variant == "native" and built == ["native"] and forced.asked == []


def test_the_background_compile_starts_where_the_ladder_will(tmp_path):
    """prebuild (run before the dependencies exist) must compile what ensure_llama_server then proves."""
    from memory_service.llm.runtime import prebuild

    steps = build.ladder("auto", AMX_CPU, machine="x86_64")
    quiet = lambda _: None  # noqa: E731
    assert prebuild.next_to_build(tmp_path, steps, refusing("native"), quiet).name == "native-noamx"
    assert prebuild.next_to_build(tmp_path, steps, refusing(), quiet).name == "native"
    # native built and then refused by its smoke test: the compile goes on with the next variant
    start_ladder(tmp_path, refusing(), dying={"native"})
    assert proven.stamp_of(build.binary_path(tmp_path, build.VARIANTS["native"])).by_signal
    build.binary_path(tmp_path, build.VARIANTS["native-noamx"]).unlink()
    assert prebuild.next_to_build(tmp_path, steps, refusing(), quiet).name == "native-noamx"
    # a built variant waits for its proof: nothing to compile
    InjectedBuilds(set())(
        build.VARIANTS["native-noamx"], build.binary_path(tmp_path, build.VARIANTS["native-noamx"]), tmp_path
    )
    assert prebuild.next_to_build(tmp_path, steps, refusing(), quiet) is None


def test_the_build_progress_estimates_the_rest_from_the_first_tenth():
    out = io.StringIO()
    progress = build.Progress("building llama-server (native-noamx)", stream=out)
    for step in range(1, 209):
        progress.update(step, 208)
    progress.finish()
    lines = out.getvalue().splitlines()
    assert "left" not in lines[0]  # before 10%: no speed measured yet
    assert all("left (speed of the first 10%)" in line for line in lines[1:-1]), lines
    assert "left" not in lines[-1]
