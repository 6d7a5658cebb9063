"""Find and run a local llama-server as a child process that never outlives us.

The child is started in its own process group with a parent-death signal
(Linux), so even a SIGKILL of the service does not leave an orphaned
llama-server burning the CPU. Only flags that never download are used.

It runs at a lower OS priority (`MEMORY_LLAMA_NICE`, +10 by default): its work may wait,
a save's acknowledgement or a recall should not. The scheduler then gives the API's short
bursts the CPU before the model's long computation; alone, the model still gets every
cycle it asks for.
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
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from . import proven

if TYPE_CHECKING:
    from ...config import Settings


class LlamaServerError(RuntimeError):
    """llama-server could not be found or started; `returncode` is set when it died."""

    def __init__(self, message: str, returncode: int | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode


def find_binary(configured: str | None, cache_dir: Path) -> Path:
    """MEMORY_LLAMA_BIN, then the build the bootstrap proved on this CPU, then PATH.

    A cached build that was never proven here is not used: it may die on its
    first matrix multiply (see build.py).
    """
    if configured:
        path = Path(configured).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LlamaServerError(f"MEMORY_LLAMA_BIN={configured!r} is not an executable file")
        return path
    record = proven.current(cache_dir)
    if record is not None:
        return Path(record.binary)
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    raise LlamaServerError(
        "no llama-server proven on this CPU: run scripts/bootstrap.sh (it builds one and proves it on a real "
        "model), set MEMORY_LLAMA_BIN, or point MEMORY_LLM_URL at a running server"
    )


def build_variant(binary: Path, cache_dir: Path) -> str:
    """Which build this binary is, for logs and doctor: a variant name, or where it came from."""
    record = proven.current(cache_dir)
    if record is not None and Path(record.binary) == binary:
        return record.variant
    return "unverified (MEMORY_LLAMA_BIN or PATH)"


def wait_until_healthy(url: str, process: subprocess.Popen, timeout_s: float) -> str | None:
    """Poll `url/health` until it answers 200. None when it did; otherwise why not (exited or timed out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return proven.describe_exit(process.returncode)
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


def _child_setup(nice: int) -> None:
    """In the llama-server child before exec: its own process group, a lower priority, death with its parent.

    The niceness is set before exec, so every thread llama-server starts inherits it (Linux keeps one per
    thread: setting it from outside once the server runs would reach its main thread only).
    """
    os.setpgrp()
    if nice:
        os.nice(nice)
    die_with_parent(signal.SIGKILL)


def die_with_parent(signum: int) -> None:
    """In a child before exec: the kernel sends it `signum` when its parent dies (Linux; elsewhere nothing).

    The parent is the thread that forked it: start such a child from a thread that lives as long as it."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signum)  # PR_SET_PDEATHSIG
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
    extra_args: tuple[str, ...] = ()  # more llama-server flags (benchmarks: --cache-ram 0)
    nice: int = 0  # added to this process's niceness (MEMORY_LLAMA_NICE)
    process: subprocess.Popen | None = None

    @classmethod
    def from_settings(
        cls, settings: Settings, model: Path, log_path: Path | None, **overrides: Any
    ) -> LlamaServerProcess:
        """The llama-server `serve` runs: the proven binary, threads, context and chat template from settings."""
        values: dict[str, Any] = dict(
            binary=find_binary(settings.llama_bin, settings.cache_dir),
            model=model,
            threads=settings.llama_threads,
            ctx=settings.llama_ctx,
            chat_template_file=settings.llama_chat_template_file,
            log_path=log_path,
            nice=settings.llama_nice,
        )
        return cls(**{**values, **overrides})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            str(self.binary),
            "--model",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--parallel",
            str(self.slots),
            "--threads",
            str(self.threads),
            "--ctx-size",
            str(self.ctx),
            "--no-webui",
            "--offline",
            "--jinja",
        ]
        if self.chat_template_file:
            cmd += ["--chat-template-file", self.chat_template_file]
        return [*cmd, *self.extra_args]

    def start(self, wait_s: float = 120.0) -> LlamaServerProcess:
        if not self.port:
            self.port = free_port()
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=partial(_child_setup, self.nice),
        )
        problem = wait_until_healthy(self.url, self.process, wait_s)
        if problem is None:
            return self
        code = self.process.poll()
        self.stop()
        message = f"llama-server {problem} while loading {self.model.name}"
        if code is not None and code < 0:
            message += f". What to do: {proven.REBUILD_HINT}"
        raise LlamaServerError(message + (f"; log: {self.log_path}" if self.log_path else ""), returncode=code)

    def stop(self, grace_s: float = 5.0) -> None:
        stop_group(self.process, grace_s)


def stop_group(proc: subprocess.Popen | None, grace_s: float) -> int | None:
    """Stop a child started in its own process group, and everything it started: SIGTERM, then SIGKILL.

    `grace_s=0` kills at once. Returns the exit code (None when there was no process).
    """
    if proc is None:
        return None
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
            proc.wait(grace_s if grace_s > 0 else None)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            proc.wait()
    return proc.returncode


def launch(settings: Settings, model: Path, log_path: Path | None) -> LlamaServerProcess:
    """Start the llama-server `serve` runs: binary, model, threads, context and chat template from settings.

    A proven build that the CPU refuses at run time (SIGILL) is marked refused,
    so the next bootstrap falls back to a more portable variant.
    """
    server = LlamaServerProcess.from_settings(settings, model, log_path)
    try:
        return server.start()
    except LlamaServerError as exc:
        if exc.returncode == -signal.SIGILL and not settings.llama_bin:
            proven.refuse(server.binary, build_variant(server.binary, settings.cache_dir), str(exc), settings.cache_dir)
        raise
