"""The soak benchmark's faults: kill the service, kill the model server, stall the model, fill the disk.

Each fault blocks until the system it broke is back (service healthy, llama-server answering, disk
freed), and says when it started and how long it lasted. They run in the main thread: a child
started from a thread dies with that thread (the parent-death signal), so restarts happen here.
The disk is only ever filled on a small tmpfs of our own, mounted for the run (root only).
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..llm.runtime.server import LlamaServerProcess
    from ..testbed.service_runner import ServiceRunner

KINDS = ("service_kill", "llama_kill", "model_stall", "disk_full")
TMPFS_SIZE_MB = 512
LLAMA_DOWN_S = 5.0  # how long llama-server stays dead before its restart
STALL_S = 20.0  # how long llama-server stays frozen (SIGSTOP) before SIGCONT
DISK_FULL_S = 10.0  # how long the disk stays full
FILL_CHUNK = b"\0" * (1 << 20)


@dataclass
class Fault:
    kind: str
    at_s: float  # since the start of the load
    duration_s: float
    detail: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "at_s": round(self.at_s, 1), "duration_s": round(self.duration_s, 1)} | self.detail


class SmallDisk:
    """A tmpfs of TMPFS_SIZE_MB for the data dir, when we may mount one; otherwise why not."""

    def __init__(self, mount_point: Path) -> None:
        self.mount_point = mount_point
        self.mounted = False
        self.skipped: str | None = None

    def mount(self) -> SmallDisk:
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            self.skipped = "not root: cannot mount a dedicated tmpfs, and the host's real disk is never filled"
            return self
        self.mount_point.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE_MB}m,mode=0700", "tmpfs", str(self.mount_point)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            self.skipped = f"mounting a tmpfs failed: {proc.stderr.strip()[:200]}"
        else:
            self.mounted = True
        return self

    def unmount(self) -> None:
        if self.mounted:
            if subprocess.run(["umount", str(self.mount_point)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(self.mount_point)], capture_output=True)
            self.mounted = False

    def fill(self, hold_s: float) -> dict[str, Any]:
        """Write one file until ENOSPC, keep it `hold_s`, delete it: the disk is full for that long."""
        assert self.mounted, "fill only our own tmpfs"
        path = self.mount_point / "soak-fill.bin"
        written = 0
        try:
            with open(path, "wb", buffering=0) as handle:
                while True:
                    try:
                        written += handle.write(FILL_CHUNK)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
            free = shutil.disk_usage(self.mount_point).free
            time.sleep(hold_s)
        finally:
            path.unlink(missing_ok=True)
        return {"filled_mb": round(written / 2**20, 1), "free_bytes_while_full": free}


class Injector:
    """Runs each fault against the live service and llama-server, and keeps the record."""

    def __init__(self, service: ServiceRunner, llama: LlamaServerProcess, disk: SmallDisk, started: float) -> None:
        self.service, self.llama, self.disk, self.started = service, llama, disk, started
        self.faults: list[Fault] = []
        self.skipped: dict[str, str] = {}

    def inject(self, kind: str) -> None:
        if kind == "disk_full" and not self.disk.mounted:
            self.skipped[kind] = self.disk.skipped or "no tmpfs"
            return
        at = time.monotonic()
        try:
            detail = getattr(self, kind)()
        except Exception as exc:  # a system that does not come back is a finding, not the end of the report
            detail = {"error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        self.faults.append(Fault(kind, at - self.started, time.monotonic() - at, detail))

    def service_kill(self) -> dict[str, Any]:
        """SIGKILL the service's whole process group (a crash), then start it again on the same port."""
        old = self.service.pid
        os.killpg(old, signal.SIGKILL)
        assert self.service.proc is not None
        self.service.proc.wait()
        down = time.monotonic()
        self.service.launch().wait_healthy(300.0)
        return {"killed_pid": old, "restart_s": round(time.monotonic() - down, 1)}

    def final_kill(self) -> dict[str, Any]:
        return self.service_kill()

    def llama_kill(self) -> dict[str, Any]:
        """SIGKILL llama-server, leave it dead a moment, start it again on the same port."""
        assert self.llama.process is not None
        old = self.llama.process.pid
        os.killpg(old, signal.SIGKILL)
        self.llama.process.wait()
        time.sleep(LLAMA_DOWN_S)
        down = time.monotonic()
        self.llama.start(wait_s=300.0)
        return {"killed_pid": old, "down_s": LLAMA_DOWN_S, "restart_s": round(time.monotonic() - down, 1)}

    def model_stall(self) -> dict[str, Any]:
        """Freeze llama-server (SIGSTOP) for STALL_S: it accepts connections and answers nothing."""
        assert self.llama.process is not None
        os.killpg(self.llama.process.pid, signal.SIGSTOP)
        try:
            time.sleep(STALL_S)
        finally:
            os.killpg(self.llama.process.pid, signal.SIGCONT)
        return {"stall_s": STALL_S}

    def disk_full(self) -> dict[str, Any]:
        return self.disk.fill(DISK_FULL_S) | {"tmpfs_mb": TMPFS_SIZE_MB}


def schedule(kinds: list[str], start_s: float, end_s: float, every_s: float) -> list[tuple[float, str]]:
    """Fault times spread evenly over [start_s, end_s): the kinds in turn, at least one of each."""
    if not kinds or end_s <= start_s:
        return []
    count = max(len(kinds), int((end_s - start_s) // every_s))
    step = (end_s - start_s) / (count + 1)
    return [(start_s + step * (i + 1), kinds[i % len(kinds)]) for i in range(count)]
