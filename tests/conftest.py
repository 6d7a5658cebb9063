"""Fixtures that run the real thing: the service in this process or as a subprocess, llama-server with real
GGUF models, or the fault-injecting fake llama-server (tests/fakes) on a thread.

Everything talks over real HTTP on loopback. The tiers (pyproject.toml's markers):
- `process`: the test starts a subprocess (`serve`, the CLI, llama-server, `chroma run`, Chromium, a child
  interpreter). Added here from the fixtures a test uses, and by the test's own mark when it spawns one itself.
- `model`: the test needs a real GGUF model, hence llama-server (always a `process` test too).
- neither: the fast tier, `pytest -m "not process and not model"`. The session's PostgreSQL cluster is part of
  it: started once (initdb + pg_ctl, a couple of seconds) like a database the suite is given, not a process
  a test drives. MEMORY_TESTS_NO_SUBPROCESS=1 makes any other subprocess a fast-tier test starts an error.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from inprocess import InProcessService

from memory_service.app import create_app
from memory_service.config import Settings
from memory_service.llm.runtime.gguf import ensure_model
from memory_service.llm.runtime.server import LlamaServerProcess, free_port, stop_group
from memory_service.services import Services
from memory_service.storage.database import Database, PostgresDatabase, SqliteDatabase
from memory_service.storage.journal import Journal
from memory_service.testbed.chroma_server import ChromaServer
from memory_service.testbed.postgres import PostgresCluster
from memory_service.testbed.service_runner import ServiceRunner

ROOT = Path(__file__).resolve().parents[1]
CACHE = Settings.from_env().cache_dir
KEYS = {"key-a": "team-a", "key-b": "team-b"}

# fixtures that start a subprocess, and those that start llama-server on a real model
PROCESS_FIXTURES = frozenset({"service_factory", "tiny_service", "chroma_server"})
MODEL_FIXTURES = frozenset({"tiny_llama", "default_llama", "tiny_model"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tiers from what a test uses: a test cannot reach a subprocess fixture without being marked."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & MODEL_FIXTURES or item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.model)
            item.add_marker(pytest.mark.process)  # the model runs in llama-server
        elif used & PROCESS_FIXTURES:
            item.add_marker(pytest.mark.process)


class SubprocessForbidden(AssertionError):
    """A test outside the `process` and `model` tiers started a subprocess: mark it, or keep it in-process."""


_spawn_allowed = [False]  # set while the session's PostgreSQL cluster starts or stops


@contextmanager
def spawning_allowed() -> Iterator[None]:
    _spawn_allowed[0] = True
    try:
        yield
    finally:
        _spawn_allowed[0] = False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """With MEMORY_TESTS_NO_SUBPROCESS=1, a fast-tier test (setup and teardown included) cannot spawn."""
    tiered = item.get_closest_marker("process") or item.get_closest_marker("model")
    if tiered or os.environ.get("MEMORY_TESTS_NO_SUBPROCESS") != "1":
        yield
        return
    # ignore[attr-defined]: a private method of Popen, the one every way of starting a child goes through
    execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    fork = os.fork

    def refuse(*args, **kwargs):
        if _spawn_allowed[0]:
            return (execute_child if args and isinstance(args[0], subprocess.Popen) else fork)(*args, **kwargs)
        raise SubprocessForbidden(f"{item.nodeid} started a subprocess but is not marked `process`")

    subprocess.Popen._execute_child = refuse  # type: ignore[attr-defined]
    os.fork = refuse
    try:
        yield
    finally:
        subprocess.Popen._execute_child = execute_child  # type: ignore[attr-defined]
        os.fork = fork


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
    with spawning_allowed():
        cluster = PostgresCluster(tmp_path_factory.mktemp("postgres")).start()
    yield cluster
    with spawning_allowed():
        # no shutdown checkpoint: it would write every database the tests made (seconds to a minute) just
        # before they are deleted
        stop = [*cluster._as, str(cluster.bin / "pg_ctl"), "-D", str(cluster.data), "-m", "immediate", "-w", "stop"]
        subprocess.run(stop, capture_output=True)
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
    """The real app and its real stores (SQLite, Chroma, embedder) in this process, with no model server and
    no workers (InProcessService runs both).

    For tests that never reach the model (validation, auth, error shapes): no subprocess, same handlers.
    """

    def __init__(self, data_dir: Path) -> None:
        # a port nothing listens on: a test that reached the model would fail, not pass by accident
        self.settings = Settings(
            data_dir=data_dir, api_keys=KEYS, llm_url=f"http://127.0.0.1:{free_port()}", chroma_process=False
        )
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


@pytest.fixture
def inprocess_service(tmp_path: Path) -> Iterator:
    """Make InProcessService(s) (the app with its workers, served on a thread) on this test's data dirs;
    all are stopped at the end."""
    started: list[InProcessService] = []

    def make(
        llm_url: str | None, *, data_dir: Path | None = None, env: dict[str, str] | None = None, start: bool = True
    ) -> InProcessService:
        svc = InProcessService(data_dir or tmp_path / f"data{len(started)}", llm_url, env)
        started.append(svc)
        return svc.start() if start else svc

    yield make
    for svc in started:
        svc.stop()


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


@pytest.fixture(scope="session")
def tiny_service(tiny_llama, tmp_path_factory) -> Iterator[ServiceProcess]:
    """One `serve` on the tiny model for every module that reads or saves through it (teams key-a and key-b;
    a test that needs an empty team or a store of its own starts its own service)."""
    svc = ServiceProcess(tmp_path_factory.mktemp("svc") / "data", tiny_llama.url).start()
    yield svc
    svc.kill()


def eventually(what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
    """`check()`'s first truthy answer, polled every 50 ms; an AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def wait_status(client: httpx.Client, memory_id: str, statuses=("done", "failed"), timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    body: dict = {}
    while time.monotonic() < deadline:
        body = client.get(f"/v1/memories/{memory_id}").json()
        if body.get("status") in statuses:
            return body
        time.sleep(0.2)
    raise AssertionError(f"memory {memory_id} did not reach {statuses}: {body}")
