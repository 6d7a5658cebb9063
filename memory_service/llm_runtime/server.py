"""Find and run a local llama-server as a child process that never outlives us.

The child is started in its own process group with a parent-death signal
(Linux), so even a SIGKILL of the service does not leave an orphaned
llama-server burning the CPU. Only flags that never download are used.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


class LlamaServerError(RuntimeError):
    pass


def find_binary(configured: str | None, cache_dir: Path) -> Path:
    """MEMORY_LLAMA_BIN, then the bootstrap's cached build, then PATH."""
    if configured:
        path = Path(configured).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LlamaServerError(f"MEMORY_LLAMA_BIN={configured!r} is not an executable file")
        return path
    builds = sorted((cache_dir / "llama-server").glob("*/llama-server"), key=lambda p: p.stat().st_mtime, reverse=True)
    for build in builds:
        if os.access(build, os.X_OK):
            return build
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    raise LlamaServerError(
        "no llama-server found: run scripts/bootstrap.sh (it builds one), set MEMORY_LLAMA_BIN, "
        "or point MEMORY_LLM_URL at a running server"
    )


def wait_until_healthy(url: str, process: subprocess.Popen, timeout_s: float) -> str | None:
    """Poll `url/health` until it answers 200. None when it did; otherwise why not (exited or timed out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"exited with code {process.returncode}"
        try:
            if httpx.get(url + "/health", timeout=1.0, trust_env=False).status_code == 200:
                return None
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return f"did not answer /health within {timeout_s:.0f}s"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    os.setpgrp()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


@dataclass
class LlamaServerProcess:
    binary: Path
    model: Path
    threads: int
    ctx: int
    port: int = 0
    slots: int = 1
    chat_template_file: str | None = None
    log_path: Path | None = None
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            str(self.binary), "--model", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
            "--parallel", str(self.slots), "--threads", str(self.threads), "--ctx-size", str(self.ctx),
            "--no-webui", "--offline", "--jinja",
        ]
        if self.chat_template_file:
            cmd += ["--chat-template-file", self.chat_template_file]
        return cmd

    def start(self, wait_s: float = 120.0) -> "LlamaServerProcess":
        if not self.port:
            self.port = free_port()
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        problem = wait_until_healthy(self.url, self.process, wait_s)
        if problem is None:
            return self
        self.stop()
        raise LlamaServerError(
            f"llama-server {problem} while loading" + (f"; see {self.log_path}" if self.log_path else "")
        )

    def stop(self, grace_s: float = 5.0) -> None:
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
