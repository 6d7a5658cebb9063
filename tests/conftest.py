"""Fixtures that run the real thing: llama-server with real GGUF models, the service as a subprocess.

Everything talks over real HTTP on loopback. The fault-injecting fake
llama-server (tests/fakes) is used only where a real server can't produce the
fault on demand.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from chroma_server import ChromaServer
from fastapi.testclient import TestClient

from memory_service.api.app import create_app
from memory_service.bench.common import ServiceRunner
from memory_service.bench.postgres import PostgresCluster
from memory_service.config import Settings
from memory_service.llm.runtime.models import ensure_model
from memory_service.llm.runtime.server import LlamaServerProcess, free_port, stop_group
from memory_service.services import Services
from memory_service.storage.database import Database, PostgresDatabase, SqliteDatabase
from memory_service.storage.journal import Journal

ROOT = Path(__file__).resolve().parents[1]
CACHE = Settings.from_env().cache_dir
KEYS = {"key-a": "team-a", "key-b": "team-b"}


def start_llama(model: str, tmp: Path, **kwargs) -> LlamaServerProcess:
    """A real llama-server like `serve` starts, with one thread and a 4096 context unless told otherwise."""
    settings = Settings.from_env()
    kwargs.setdefault("threads", int(os.environ.get("MEMORY_LLAMA_THREADS", "1")))
    kwargs.setdefault("ctx", 4096)
    kwargs.setdefault("chat_template_file", None)
    return LlamaServerProcess.from_settings(
        settings, ensure_model(model, CACHE), tmp / f"llama-{model}.log", **kwargs
    ).start()


@pytest.fixture(scope="session")
def pg_cluster(tmp_path_factory) -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL cluster (initdb + pg_ctl, loopback only); tests create a database each."""
    cluster = PostgresCluster(tmp_path_factory.mktemp("postgres")).start()
    yield cluster
    cluster.remove()


@pytest.fixture
def postgres_url(pg_cluster: PostgresCluster) -> str:
    """A fresh, empty database on the session's cluster."""
    return pg_cluster.create_database()


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """The same storage contract on both backends: a SQLite file, then a fresh PostgreSQL database."""
    if request.param == "sqlite":
        db: Database = SqliteDatabase(tmp_path / "journal.sqlite3")
    else:
        db = PostgresDatabase(request.getfixturevalue("postgres_url"))
    yield db
    db.close()


@pytest.fixture
def journal(database: Database) -> Journal:
    return Journal(database)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Iterator[LlamaServerProcess]:
    server = start_llama("tiny", tmp_path_factory.mktemp("llama-tiny"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def default_llama(tmp_path_factory) -> Iterator[LlamaServerProcess]:
    server = start_llama("default", tmp_path_factory.mktemp("llama-default"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory) -> Iterator[ChromaServer]:
    """A real `chroma run` for the session: what MEMORY_CHROMA_URL points at in a multi-process deployment."""
    root = tmp_path_factory.mktemp("chroma-server")
    server = ChromaServer(root / "db", root / "chroma.log").start()
    yield server
    server.stop()


class InProcessApp:
    """The real app and its real stores (SQLite, Chroma, embedder) in this process, with no model server.

    For tests that never reach the model (validation, auth, error shapes): no subprocess, same handlers.
    """

    def __init__(self, data_dir: Path) -> None:
        # a port nothing listens on: a test that reached the model would fail, not pass by accident
        self.settings = Settings(data_dir=data_dir, api_keys=KEYS, llm_url=f"http://127.0.0.1:{free_port()}")
        self.services = Services.open(self.settings)
        self.app = create_app(self.settings, services=self.services)

    def client(self, key: str | None = "key-a") -> TestClient:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return TestClient(self.app, headers=headers)

    def jobs(self) -> int:
        counts = self.services.journal.counts()
        return sum(counts[s] for s in ("queued", "extracting", "done", "failed"))


@pytest.fixture(scope="module")
def inprocess(tmp_path_factory) -> Iterator[InProcessApp]:
    app = InProcessApp(tmp_path_factory.mktemp("inprocess") / "data")
    yield app
    app.services.close()


class ServiceProcess(ServiceRunner):
    """`memory-service serve` in a subprocess: the benchmarks' launcher, with the test keys, INFO logs and
    quick retries."""

    def __init__(self, data_dir: Path, llm_url: str | None, env: dict[str, str] | None = None) -> None:
        super().__init__(
            data_dir,
            api_keys=KEYS,
            llm_url=llm_url,
            env={"MEMORY_LOG_LEVEL": "INFO", "MEMORY_RETRY_BASE_S": "0.2", **(env or {})},
        )

    def start(self, timeout: float = 120) -> ServiceProcess:
        super().start(timeout)
        return self

    def client(self, key: str | None = "key-a", timeout: float = 60) -> httpx.Client:
        return super().client(key, timeout)

    def stop(self) -> int | None:  # type: ignore[override]
        return stop_group(self.proc, 30)

    def kill(self) -> None:
        stop_group(self.proc, 0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def service_factory(tmp_path) -> Iterator:
    started: list[ServiceProcess] = []

    def make(
        llm_url: str | None, *, data_dir: Path | None = None, env: dict[str, str] | None = None, start: bool = True
    ) -> ServiceProcess:
        svc = ServiceProcess(data_dir or tmp_path / f"data{len(started)}", llm_url, env)
        started.append(svc)
        return svc.start() if start else svc

    yield make
    for svc in started:
        svc.kill()


@pytest.fixture(scope="module")
def tiny_service(tiny_llama, tmp_path_factory) -> Iterator[ServiceProcess]:
    svc = ServiceProcess(tmp_path_factory.mktemp("svc") / "data", tiny_llama.url).start()
    yield svc
    svc.kill()


def wait_status(client: httpx.Client, memory_id: str, statuses=("done", "failed"), timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    body: dict = {}
    while time.monotonic() < deadline:
        body = client.get(f"/v1/memories/{memory_id}").json()
        if body.get("status") in statuses:
            return body
        time.sleep(0.2)
    raise AssertionError(f"memory {memory_id} did not reach {statuses}: {body}")
