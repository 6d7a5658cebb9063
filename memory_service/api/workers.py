"""`serve --workers N`: N API processes on one port, sharing the one llama-server `serve` started.

uvicorn's supervisor binds the port once and spawns fresh interpreters that import the app by name,
so a worker gets nothing from `serve` but its environment: `worker_environment` turns the settings
`serve` resolved (flags, and the URL of the llama-server it started) into MEMORY_* variables, and
each worker builds its app and its protocol class from them.

The embedded stores allow one writer process per data dir (SQLite files; Chroma's PersistentClient
keeps its index in memory and on disk for one process), so more than one worker needs the shared
backends: MEMORY_DATABASE_URL and MEMORY_CHROMA_URL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config import ConfigError, Settings, speed_prior_variable

if TYPE_CHECKING:
    pass

APP = "memory_service.app:worker_app"  # uvicorn imports it by name in each worker
HTTP_PROTOCOL = f"{__name__}:http_protocol"


def check_workers(settings: Settings, workers: int) -> None:
    """Refuse N > 1 processes on the embedded stores, saying why and what to set instead."""
    if workers <= 1:
        return
    missing = [
        name
        for name, value in (("MEMORY_DATABASE_URL", settings.database_url), ("MEMORY_CHROMA_URL", settings.chroma_url))
        if not value
    ]
    if missing:
        raise ConfigError(
            f"--workers {workers} needs {' and '.join(missing)}: the embedded stores in the data dir (SQLite files "
            "and Chroma's PersistentClient) allow one writer process per data dir. Set "
            "MEMORY_DATABASE_URL=postgresql://... and MEMORY_CHROMA_URL=http://... (a `chroma run` server), "
            "or run one process (--workers 1)"
        )


def worker_environment(settings: Settings, speed_prior: tuple[float, float] | None) -> dict[str, str]:
    """The variables a worker needs to build the same settings as `serve` (flags override the environment)."""
    env = {
        "MEMORY_HOST": settings.host,
        "MEMORY_PORT": str(settings.port),
        "MEMORY_DATA_DIR": str(settings.data_dir.absolute()),
        "MEMORY_MODEL": settings.model,
    }
    if settings.llm_url:
        env["MEMORY_LLM_URL"] = settings.llm_url
    if speed_prior is not None:
        env.update(speed_prior_variable(speed_prior))
    return env


def __getattr__(name: str) -> Any:
    """`http_protocol`: the guarded protocol with this worker's timeouts and caps, built when uvicorn asks for it."""
    if name == "http_protocol":
        from .http_guard import protocol_for

        return protocol_for(Settings.from_env())
    raise AttributeError(name)
