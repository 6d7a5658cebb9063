"""Which llama-server build runs on this CPU: the one record everyone reads.

A build is trusted only after it completed tokens on a real model here
(see `build.py`). The bootstrap writes `llama-server/proven.json` in the cache;
`serve`, `doctor`, the tests and the benchmarks read it. A binary whose bytes
or whose CPU changed since it was proven is not used. A build the CPU refused
is remembered as refused, so no later run picks it or rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from .gguf import sha256_of

RECORD_NAME = "proven.json"
STAMP_NAME = "verified.json"


def cpu_key() -> str:
    """A short hash of the CPU model and the instruction flags the kernel reports."""
    text = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith(("flags", "model name", "Features", "CPU part")):
                    text += line
                if line.strip() == "":  # first processor block is enough
                    break
    except OSError:
        text = os.uname().machine
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@dataclass
class Verdict:
    """The outcome of running one binary on a real model on one CPU."""

    ok: bool
    variant: str
    binary: str
    sha256: str
    cpu: str
    why: str = ""
    model: str = ""  # the model file the speeds were measured on
    by_signal: bool = False  # it died by a signal: this CPU refuses the binary, for good
    prompt_tps: float | None = None
    gen_tps: float | None = None
    seconds: float | None = None
    checked_at: float = field(default_factory=time.time)

    def matches(self, binary: Path) -> bool:
        """Still about this file, unchanged, on this CPU."""
        return (
            self.cpu == cpu_key()
            and Path(self.binary) == binary
            and binary.is_file()
            and self.sha256 == sha256_of(binary)
        )


def _read(path: Path) -> Verdict | None:
    try:
        data = json.loads(path.read_text())
        known = {f.name for f in fields(Verdict)}
        return Verdict(**{k: v for k, v in data.items() if k in known})  # a newer writer may add fields
    except (OSError, ValueError, TypeError):
        return None


def _write(path: Path, verdict: Verdict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(verdict), indent=2) + "\n")
    os.replace(tmp, path)


def stamp_of(binary: Path) -> Verdict | None:
    """The verdict stored beside a binary, if it still applies to it on this CPU."""
    verdict = _read(binary.parent / STAMP_NAME)
    return verdict if verdict is not None and verdict.matches(binary) else None


def save_stamp(verdict: Verdict) -> None:
    _write(Path(verdict.binary).parent / STAMP_NAME, verdict)


def record_path(cache_dir: Path) -> Path:
    return cache_dir / "llama-server" / RECORD_NAME


def save_record(cache_dir: Path, verdict: Verdict) -> None:
    _write(record_path(cache_dir), verdict)


def current(cache_dir: Path) -> Verdict | None:
    """The proven build for this CPU, or None when there is none (or it no longer applies)."""
    verdict = _read(record_path(cache_dir))
    if verdict is None or not verdict.ok or not verdict.matches(Path(verdict.binary)):
        return None
    return verdict


def speed_of(cache_dir: Path, binary: Path, model_name: str) -> tuple[float, float] | None:
    """(prompt, generation) tokens/s the smoke test measured for this binary on this model, if it did."""
    record = current(cache_dir)
    if record is None or Path(record.binary) != binary or record.model != model_name:
        return None
    if not record.prompt_tps or not record.gen_tps:
        return None
    return record.prompt_tps, record.gen_tps


def refuse(binary: Path, variant: str, why: str, cache_dir: Path | None = None) -> None:
    """Remember that this CPU refused this binary; drop it as the proven build if it was."""
    try:
        sha = sha256_of(binary)
    except OSError:
        return
    save_stamp(
        Verdict(ok=False, variant=variant, binary=str(binary), sha256=sha, cpu=cpu_key(), why=why, by_signal=True)
    )
    if cache_dir is not None:
        record = _read(record_path(cache_dir))
        if record is not None and Path(record.binary) == binary:
            record_path(cache_dir).unlink(missing_ok=True)


SIGNAL_WORDS = {
    signal.SIGILL: (
        "illegal instruction: this llama-server binary uses CPU instructions this machine does not "
        "allow (a CPU can advertise AMX or AVX-512 that a VM refuses)"
    ),
    signal.SIGSEGV: "segmentation fault: llama-server crashed",
    signal.SIGBUS: "bus error: llama-server read memory it could not map (a truncated model file?)",
    signal.SIGFPE: "arithmetic fault: llama-server crashed",
    signal.SIGABRT: "aborted: llama-server stopped on an internal check (see its log)",
    signal.SIGKILL: "killed: the system ended llama-server, usually for lack of memory",
}


def describe_exit(returncode: int) -> str:
    """An exit code in plain words; a signal gets its name and what it means."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        sig = signal.Signals(-returncode)
    except ValueError:
        return f"was killed by signal {-returncode}"
    return f"was killed by {sig.name} ({SIGNAL_WORDS.get(sig, 'killed by a signal')})"


REBUILD_HINT = (
    "run scripts/bootstrap.sh again: it re-proves the build on this CPU and falls back to a more portable "
    "variant (or force one with MEMORY_LLAMA_BUILD=portable)"
)
