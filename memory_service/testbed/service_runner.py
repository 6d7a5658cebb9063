"""The processes a benchmark or an eval measures, and the tests start: `memory-service serve` and llama-server.

Everything is measured over real HTTP against `memory-service serve` running as
a separate process, so the client never shares the server's interpreter, GIL or
event loop. A llama-server is started once and shared by services through
MEMORY_LLM_URL, so each benchmark does not pay the model load.
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from ..client.service import service_client
from ..llm.runtime.server import die_with_parent, stop_group, wait_until_healthy
from .probes import rss_mb

if TYPE_CHECKING:
    from ..llm.runtime.server import LlamaServerProcess

# the caller's MEMORY_* settings a child service keeps: where models live and how many threads it may use
INHERITED_SETTINGS = (
    "MEMORY_CACHE_DIR",
    "MEMORY_LLAMA_BIN",
    "MEMORY_LLAMA_THREADS",
    "MEMORY_EMBED_THREADS",
    "MEMORY_EMBEDDER",
)


def llama_busy(url: str) -> bool:
    """Is this llama-server in the middle of a completion (its /slots say so)? False when it does not answer."""
    try:
        slots = httpx.get(url + "/slots", timeout=2, trust_env=False).json()
    except (httpx.HTTPError, ValueError):
        return False
    return isinstance(slots, list) and any(slot.get("is_processing") for slot in slots)


def start_llama(
    model: str = "default", log_dir: Path | None = None, threads: int | None = None, extra_args: tuple[str, ...] = ()
) -> LlamaServerProcess:
    """One llama-server child with the service's own defaults (threads = cores - 1, 4096 ctx, one slot)."""
    from ..config import Settings
    from ..llm.runtime.gguf import resolve_model
    from ..llm.runtime.server import LlamaServerProcess

    settings = Settings.from_env()
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="bench-llama-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    return LlamaServerProcess.from_settings(
        settings,
        resolve_model(model, settings.cache_dir),
        log_dir / f"llama-{Path(model).stem}.log",
        threads=threads or settings.llama_threads,
        chat_template_file=None,
        extra_args=tuple(extra_args),
    ).start()


def service_env(
    data_dir: Path,
    port: int,
    *,
    api_keys: Mapping[str, str],
    llm_url: str | None,
    model: str,
    env: Mapping[str, str] | None,
) -> dict[str, str]:
    """The child's environment: none of the caller's MEMORY_* settings but INHERITED_SETTINGS, then ours."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_") or k in INHERITED_SETTINGS}
    child_env.update(
        {
            "MEMORY_DATA_DIR": str(data_dir),
            "MEMORY_PORT": str(port),
            "MEMORY_HOST": "127.0.0.1",
            "MEMORY_MODEL": model,
            "MEMORY_LOG_LEVEL": os.environ.get("MEMORY_BENCH_SERVICE_LOG_LEVEL", "WARNING"),
        }
    )
    if api_keys:
        child_env["MEMORY_API_KEYS"] = ",".join(f"{k}:{t}" for k, t in api_keys.items())
    if llm_url:
        child_env["MEMORY_LLM_URL"] = llm_url
    child_env.update(env or {})
    return child_env


class ServiceRunner:
    """`memory-service serve` in its own process group, on a free port, with a given data dir and keys."""

    def __init__(
        self,
        data_dir: Path,
        *,
        api_keys: Mapping[str, str],
        llm_url: str | None = None,
        model: str = "default",
        env: Mapping[str, str] | None = None,
    ) -> None:
        from ..llm.runtime.server import free_port

        self.data_dir = data_dir
        self.port = free_port()
        self.api_keys = dict(api_keys)
        self.log_path = data_dir.parent / f"{data_dir.name}-service.log"
        self.env = service_env(data_dir, self.port, api_keys=self.api_keys, llm_url=llm_url, model=model, env=env)
        # the operator's bearer: /metrics whole and /ready's every-team counts, which a team key no longer sees
        self.metrics_token = self.env.setdefault("MEMORY_METRICS_TOKEN", secrets.token_urlsafe(16))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout_s: float = 300.0) -> ServiceRunner:
        return self.launch().wait_healthy(timeout_s)

    def launch(self) -> ServiceRunner:
        """Start the process, without waiting for it. Call it from a thread that outlives the service (the
        main one): the parent-death signal fires when the thread that started the child ends."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memory_service.cli.main", "serve"],
            env=self.env,
            cwd=str(self.data_dir.parent),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            # a killed eval or benchmark must not leave its service extracting: SIGTERM lets it shut down
            # cleanly, and its own children (llama-server, the vector store) go with it
            preexec_fn=functools.partial(die_with_parent, signal.SIGTERM),
        )
        return self

    def wait_healthy(self, timeout_s: float = 300.0) -> ServiceRunner:
        assert self.proc is not None, "launch() first"
        problem = wait_until_healthy(self.url, self.proc, timeout_s)
        if problem is None:
            return self
        self.stop()
        raise RuntimeError(f"service {problem}:\n{self.log_tail()}")

    def wait_model_ready(self, timeout_s: float = 300.0) -> dict[str, Any]:
        """Until /ready says the model server is reachable (extraction can run)."""
        deadline = time.monotonic() + timeout_s
        body: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                response = httpx.get(self.url + "/ready", timeout=10.0, trust_env=False)
                body = response.json()
                if response.status_code == 200:
                    return body
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"service not ready within {timeout_s:.0f}s: {body}")

    def client(self, key: str | None, timeout: float = 60.0) -> httpx.Client:
        return service_client(self.url, key, timeout=timeout)

    def operator(self, timeout: float = 60.0) -> httpx.Client:
        """A client with the metrics token: every team's counts on /ready, the whole /metrics page."""
        return service_client(self.url, self.metrics_token, timeout=timeout)

    def ready(self) -> dict[str, Any]:
        """/ready as the operator sees it (every team's jobs and queue depth)."""
        with self.operator(timeout=30.0) as client:
            return client.get("/ready").json()

    def rss(self) -> dict[str, float | None]:
        return rss_mb(self.pid)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace_s: float = 30.0) -> None:
        stop_group(self.proc, grace_s)


def wait_queue_empty(
    url: str,
    timeout_s: float,
    *,
    progress: str = "",
    total: int | None = None,
    keys: Iterable[str | None] = (None,),
) -> dict[str, Any]:
    """Poll /ready until no job is queued or extracting; prints a progress line to stderr every ~10 s.

    /ready counts jobs only for whom they belong: pass the service's metrics token (every team's), or the
    key of each team that saved (their depths are added up); without any (keyless mode) it counts all.
    """
    started = time.monotonic()
    last_print = 0.0
    body: dict[str, Any] = {}
    while True:
        body, depth = _ready_of(url, list(dict.fromkeys(keys)))
        elapsed = time.monotonic() - started
        if depth == 0:
            return body
        if elapsed - last_print >= 10 or last_print == 0.0:
            last_print = elapsed or 0.001
            jobs = body.get("jobs") or {}
            done = f" done {jobs.get('done')} failed {jobs.get('failed')}" if jobs else ""
            of = f"/{total}" if total else ""
            print(f"[{progress}] queue {depth}{of}{done}, {elapsed:.0f}s", file=sys.stderr, flush=True)
        if elapsed > timeout_s:
            raise TimeoutError(f"queue still has {depth} job(s) after {timeout_s:.0f}s")
        time.sleep(1.0)


def _ready_of(url: str, keys: list[str | None]) -> tuple[dict[str, Any], int | None]:
    """/ready as each key sees it: the last body, and the queue depths added up (None if one had none)."""
    body: dict[str, Any] = {}
    depth: int | None = 0
    for key in keys:
        try:
            with service_client(url, key, timeout=30.0) as client:
                body = client.get("/ready").json()
        except (httpx.HTTPError, ValueError):
            body = {}
        seen = body.get("queue_depth")
        depth = None if seen is None or depth is None else depth + int(seen)
    return body, depth
