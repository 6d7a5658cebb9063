"""`serve --workers N`: parsed, refused on the embedded stores with the reason and the way out, and
the settings a worker rebuilds from its environment are the ones `serve` resolved.

Several processes for real need the PostgreSQL journal (MEMORY_DATABASE_URL), so only the refusal
and the hand-over are tested end to end here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memory_service.api import workers
from memory_service.cli.main import build_parser
from memory_service.config import ConfigError, Settings, worker_speed_prior
from memory_service.llm.runtime.server import free_port


def test_workers_argument_is_a_positive_whole_number():
    assert build_parser().parse_args(["serve"]).workers == 1
    assert build_parser().parse_args(["serve", "--workers", "3"]).workers == 3
    for bad in ("0", "-2", "two"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--workers", bad])


def serve(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`serve` with no MEMORY_* setting from this environment and no llama-server to use: a refusal must come
    before one would be started."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_") or k == "MEMORY_CACHE_DIR"}
    clean.update({"MEMORY_DATA_DIR": str(tmp_path / "data"), "MEMORY_PORT": str(free_port()), **env})
    return subprocess.run(
        [sys.executable, "-m", "memory_service.cli.main", "serve", *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.process  # serve's own refusal, as a process exits with it
def test_serve_refuses_several_workers_on_the_embedded_stores(tmp_path):
    started = time.monotonic()
    result = serve(tmp_path, "--workers", "2")
    assert result.returncode == 2, result.stderr
    message = result.stderr
    assert "--workers 2 needs MEMORY_DATABASE_URL and MEMORY_CHROMA_URL" in message
    assert "one writer process per data dir" in message  # why
    assert "MEMORY_DATABASE_URL=postgresql://" in message and "MEMORY_CHROMA_URL=http://" in message  # what to set
    assert "--workers 1" in message and "Traceback" not in message  # or run one process
    assert not (tmp_path / "data" / "llama-server.log").exists()  # refused before any model was started
    assert time.monotonic() - started < 30


@pytest.mark.process  # serve's own refusal, as a process exits with it
def test_serve_names_only_the_missing_backend(tmp_path):
    result = serve(tmp_path, "--workers", "4", MEMORY_CHROMA_URL="http://127.0.0.1:9")
    assert result.returncode == 2
    assert "--workers 4 needs MEMORY_DATABASE_URL:" in result.stderr, result.stderr


def test_check_workers_allows_one_process_anywhere_and_many_on_shared_backends():
    embedded = Settings()
    workers.check_workers(embedded, 1)
    with pytest.raises(ConfigError):
        workers.check_workers(embedded, 2)
    shared = Settings(database_url="postgresql://memory@db/memory", chroma_url="http://chroma:8000")
    workers.check_workers(shared, 8)


def test_a_worker_rebuilds_the_settings_serve_resolved(monkeypatch, tmp_path):
    resolved = Settings(database_url="postgresql://memory@db/memory", chroma_url="http://chroma:8000").with_overrides(
        host="0.0.0.0",
        port=8123,
        data_dir=tmp_path / "data",
        model="tiny",
        llm_url="http://127.0.0.1:8181",
        header_timeout_s=3.5,
    )
    monkeypatch.setenv("MEMORY_DATABASE_URL", "postgresql://memory@db/memory")
    monkeypatch.setenv("MEMORY_CHROMA_URL", "http://chroma:8000")
    monkeypatch.setenv("MEMORY_HEADER_TIMEOUT_S", "3.5")
    for name, value in workers.worker_environment(resolved, (900.0, 45.5)).items():
        monkeypatch.setenv(name, value)
    assert Settings.from_env() == resolved
    assert worker_speed_prior() == (900.0, 45.5)
    protocol = workers.http_protocol  # what uvicorn imports by name in each worker
    assert protocol.header_timeout_s == 3.5 and protocol.body_timeout_s == resolved.body_timeout_s


def test_each_worker_builds_the_whole_app_from_the_name_uvicorn_imports(monkeypatch, tmp_path: Path) -> None:
    """uvicorn imports `workers.APP` by name in every worker: it must name a factory that builds the API with
    the console mounted, as single-process `serve` does (the app is composed above api/, in app.py)."""
    from uvicorn.importer import import_from_string

    monkeypatch.setenv("MEMORY_LLM_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("MEMORY_DATA_DIR", str(tmp_path / "data"))
    app = import_from_string(workers.APP)()
    assert app.url_path_for("remember") == "/v1/remember"
    assert app.url_path_for("login_form") == "/ui/login"  # the console, mounted by memory_service.app
