"""The service in this process: the real app, stores and workers, served on loopback by uvicorn on a thread.

What `memory-service serve` runs, minus the process: Settings from the same MEMORY_* names, the same guarded
HTTP/1.1 protocol with its header and body timeouts, and the app's lifespan running the extraction workers on
the server's event loop (`create_app(..., run_workers=True)`). A test that needs no signal, no second process
and no real model uses `InProcessService` where it used `ServiceProcess`: same `url`, `client()`, `log()`,
`stop()`, and jobs reach `done` against the fake llama-server thread.

Two things differ on purpose: the embedded Chroma store runs in this process (MEMORY_CHROMA_PROCESS=0 unless a
test says otherwise), so nothing is spawned; and `log()` holds what the `memory_service` and `uvicorn` loggers
wrote while the service ran (any other in-process service's lines too, should two run at once).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from memory_service.api.http_guard import protocol_for
from memory_service.app import create_app
from memory_service.client.service import service_client
from memory_service.config import Settings
from memory_service.logs import TEXT_FORMAT, JsonFormatter, RequestIdFilter
from memory_service.services import Services

KEYS = {"key-a": "team-a", "key-b": "team-b"}
# what ServiceProcess sets for every test service: INFO logs, quick retries (and here: Chroma in-process)
DEFAULT_ENV = {"MEMORY_LOG_LEVEL": "INFO", "MEMORY_RETRY_BASE_S": "0.2", "MEMORY_CHROMA_PROCESS": "0"}
# MEMORY_* names `serve` reads that are not Settings fields, and the field one name is an alias of
_NOT_SETTINGS = frozenset({"MEMORY_LOG_LEVEL"})
_ALIASES = {"chat_template_file": "llama_chat_template_file"}
_LOGGERS = ("memory_service", "uvicorn")


def settings_from_env(env: dict[str, str]) -> Settings:
    """Settings as `serve` would read them from `env`; a name the in-process service cannot honour is refused,
    so a converted test never loses a setting silently."""
    fields: dict[str, Any] = {}
    for name, value in env.items():
        if name in _NOT_SETTINGS:
            continue
        field = name.removeprefix("MEMORY_").lower()
        field = _ALIASES.get(field, field)
        if not name.startswith("MEMORY_") or field not in Settings.model_fields:
            raise ValueError(f"{name} is not a setting the in-process service reads: use ServiceProcess")
        fields[field] = value
    return Settings(**fields)


class LoopbackServer:
    """uvicorn serving `app` on a thread, bound to a free 127.0.0.1 port before it starts."""

    def __init__(self, app: Any, *, lifespan: str = "on", http: Any = "auto", log_level: str = "warning") -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # log_config=None: uvicorn's loggers propagate as under `serve --log-format json`, not to its own handlers
        config = uvicorn.Config(
            app, lifespan=lifespan, http=http, log_level=log_level, log_config=None, access_log=False
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="loopback-uvicorn", daemon=True
        )

    def start(self, timeout: float = 60) -> LoopbackServer:
        """Serve, once the lifespan's startup (the workers' start) has run."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the in-process server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30) -> None:
        """Graceful, as uvicorn on SIGTERM: open requests finish, then the lifespan's shutdown runs."""
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LogCapture(logging.Handler):
    """The service's log lines, formatted as `serve` formats them (text or JSON, with the request id)."""

    def __init__(self, log_format: str, level: str) -> None:
        super().__init__()
        self.addFilter(RequestIdFilter())
        self.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
        self.lines: list[str] = []
        self._level = level.upper()
        self._levels: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        line = self.format(record)
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            self.lines.append(line)

    def attach(self) -> None:
        for name in _LOGGERS:
            logger = logging.getLogger(name)
            self._levels[name] = logger.level
            logger.setLevel(self._level)
            logger.addHandler(self)

    def detach(self) -> None:
        for name, level in self._levels.items():
            logging.getLogger(name).removeHandler(self)
            logging.getLogger(name).setLevel(level)

    def text(self) -> str:
        with self.lock:  # type: ignore[union-attr]
            return "".join(line + "\n" for line in self.lines)


class InProcessService:
    """ServiceProcess's interface over the service in this process (see the module docstring)."""

    def __init__(self, data_dir: Path, llm_url: str | None, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.env = {**DEFAULT_ENV, "MEMORY_DATA_DIR": str(data_dir), **(env or {})}
        if llm_url:
            self.env["MEMORY_LLM_URL"] = llm_url
        self.settings = settings_from_env(self.env).with_overrides(api_keys=KEYS)
        self.services: Services | None = None
        self._server: LoopbackServer | None = None
        self._log = LogCapture(self.settings.log_format, self.env["MEMORY_LOG_LEVEL"])

    @property
    def url(self) -> str:
        assert self._server is not None, "start() first"
        return self._server.url

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return self._server.port

    def start(self, timeout: float = 120) -> InProcessService:
        self._log.attach()
        self.services = Services.open(self.settings)
        app = create_app(self.settings, services=self.services, run_workers=True)
        protocol = protocol_for(self.settings)
        self._server = LoopbackServer(app, http=protocol, log_level=self.env["MEMORY_LOG_LEVEL"].lower())
        self._server.start(timeout)
        return self

    def stop(self) -> None:
        """Stop serving and the workers, then close the stores (a job cut off mid-extraction is queued again)."""
        if self._server is not None:
            self._server.stop()
        if self.services is not None:
            self.services.close()
            self.services = None
        self._log.detach()

    kill = stop  # there is no process to kill: what needs a kill -9 stays a ServiceProcess test

    def client(self, key: str | None = "key-a", timeout: float = 60) -> httpx.Client:
        return service_client(self.url, key, timeout=timeout)

    def log(self) -> str:
        return self._log.text()

    def __enter__(self) -> InProcessService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
