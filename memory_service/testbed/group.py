"""Several `memory-service serve` processes sharing one PostgreSQL database and one Chroma server.

The multi-process deployment as the tests and the scale benchmark run it: every process has a data
dir of its own (each takes a lock on it) but nothing of value lives there; the journal, jobs, limits
and keys are in PostgreSQL and the vectors on the Chroma server. Started in parallel (each loads its
embedder), and always stopped together, also when one of them failed to start.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .service_runner import ServiceRunner


def shared_env(database_url: str | None, chroma_url: str | None, lease_s: float | None = None) -> dict[str, str]:
    """The variables that make processes one deployment: the same database, vector server and job lease."""
    env: dict[str, str] = {}
    if database_url:
        env["MEMORY_DATABASE_URL"] = database_url
    if chroma_url:
        env["MEMORY_CHROMA_URL"] = chroma_url
    if lease_s is not None:
        env["MEMORY_JOB_LEASE_S"] = f"{lease_s:g}"
    return env


class ServiceGroup:
    """`n` services with the same keys, model server and shared stores; a context manager."""

    def __init__(
        self,
        root: Path,
        n: int,
        *,
        api_keys: Mapping[str, str],
        llm_url: str,
        env: Mapping[str, str] | None = None,
        model: str = "default",
    ) -> None:
        self.runners = [
            ServiceRunner(root / f"api{i}" / "data", api_keys=api_keys, llm_url=llm_url, model=model, env=env)
            for i in range(n)
        ]

    def __enter__(self) -> ServiceGroup:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __getitem__(self, i: int) -> ServiceRunner:
        return self.runners[i]

    def __len__(self) -> int:
        return len(self.runners)

    def start(self, timeout_s: float = 300.0) -> ServiceGroup:
        for runner in self.runners:
            runner.data_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            for runner in self.runners:  # launched from this thread, which outlives them (the parent-death signal)
                runner.launch()
            with ThreadPoolExecutor(len(self.runners)) as pool:
                for future in [pool.submit(r.wait_healthy, timeout_s) for r in self.runners]:
                    future.result()
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self, i: int) -> None:
        """SIGKILL process `i` and everything it started: a crash, no clean shutdown, no lease released."""
        proc = self.runners[i].proc
        assert proc is not None
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # ServiceRunner starts each in its own session
        except ProcessLookupError:
            pass
        proc.wait()

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop every process (in parallel: each may take its grace period); safe to call twice."""
        with ThreadPoolExecutor(len(self.runners)) as pool:
            list(pool.map(lambda r: r.stop(grace_s), self.runners))

    def urls(self) -> list[str]:
        return [r.url for r in self.runners]
