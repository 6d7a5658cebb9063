"""A real `chroma run` server: what MEMORY_CHROMA_URL points at, for the tests and the scale benchmark.

The server is Chroma's own binary (the `chroma` command of the chromadb package), on loopback and a
free port, with its data in a temporary directory. ANONYMIZED_TELEMETRY=False is Chroma's documented
switch for a server's product telemetry; the server sends no traces unless its config asks for them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from ..llm.runtime.server import free_port, stop_group


def chroma_command() -> list[str]:
    """The `chroma` CLI installed beside this interpreter, else the same CLI through `python -c`."""
    beside = Path(sys.executable).with_name("chroma")
    if beside.is_file():
        return [str(beside)]
    return [sys.executable, "-c", "from chromadb.cli.cli import app; app()"]


class ChromaServer:
    def __init__(self, path: Path, log_path: Path) -> None:
        self.path = path
        self.log_path = log_path
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> ChromaServer:
        env = {**os.environ, "ANONYMIZED_TELEMETRY": "False", "NO_COLOR": "1"}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*chroma_command(), "run", "--path", str(self.path), "--host", "127.0.0.1", "--port", str(self.port)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chroma run exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/api/v2/heartbeat", timeout=2, trust_env=False).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"chroma run did not answer its heartbeat within {timeout_s:.0f}s:\n{self.log()}")

    def stop(self) -> None:
        stop_group(self.proc, 10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
