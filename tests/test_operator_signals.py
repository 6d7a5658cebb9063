"""Operator signals (issue 42, item 10): `serve` names an unreachable model server in its log at start and
while it stays down; /health and /ready carry the version and uptime, /ready the data dir's free disk.

The real service in this process (its log captured as `serve` formats it), the real model pool against a
port nothing listens on and then the fake llama-server on that same port.
"""

from __future__ import annotations

import asyncio
import logging
import time
from importlib import metadata
from pathlib import Path

import pytest
from conftest import InProcessApp

from memory_service.api.routes import health
from memory_service.config import Settings
from memory_service.llm.pool import ModelPool
from memory_service.llm.runtime.server import free_port
from tests.fakes.fake_llama_server import FakeLlamaServer

DEADLINE_S = 60  # a bound on waiting for a log line, never a measured time


def _until(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_serve_warns_at_start_when_the_model_server_is_unreachable(inprocess_service) -> None:  # type: ignore[no-untyped-def]
    dead = f"http://127.0.0.1:{free_port()}"
    service = inprocess_service(dead)
    _until(lambda: "unreachable" in service.log(), "no warning about the model server")
    line = next(line for line in service.log().splitlines() if "unreachable" in line)
    assert "WARNING" in line and dead in line and "MEMORY_LLM_URL" in line and "doctor" in line, line
    assert "saves are kept and queued" in line, line


def test_the_warning_repeats_while_down_and_recovery_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    pool = ModelPool.open(Settings(llm_url=f"http://127.0.0.1:{port}"))
    caplog.set_level(logging.INFO, logger="memory_service.model")

    def said(level: int, words: str) -> int:
        return sum(1 for r in caplog.records if r.levelno == level and words in r.getMessage())

    async def scenario() -> None:
        watching = asyncio.create_task(pool.watch(every_s=0.05))
        try:
            while said(logging.WARNING, "unreachable") < 3:  # at start, then once a period while down
                await asyncio.sleep(0.02)
            with FakeLlamaServer(port=port):
                while said(logging.INFO, "answers again") < 1:
                    await asyncio.sleep(0.02)
                warned = said(logging.WARNING, "unreachable")
                await asyncio.sleep(0.2)  # several periods with the server up: no more warnings
                assert said(logging.WARNING, "unreachable") == warned
        finally:
            watching.cancel()
            await pool.aclose()

    asyncio.run(asyncio.wait_for(scenario(), DEADLINE_S))


@pytest.fixture
def app(tmp_path: Path) -> InProcessApp:
    made = InProcessApp(tmp_path / "data")
    yield made
    made.services.close()


def test_health_and_ready_carry_version_uptime_and_disk(app: InProcessApp, monkeypatch: pytest.MonkeyPatch) -> None:
    version = metadata.version("memory-service")
    with app.client(None) as http:
        alive = http.get("/health").json()
        assert alive["status"] == "ok" and alive["version"] == version and alive["uptime_s"] >= 0
        ready = http.get("/ready")
        body = ready.json()
        assert ready.status_code == 503  # no model server: the reason is in the body, with the rest
        assert body["version"] == version and body["uptime_s"] >= alive["uptime_s"]
        disk = body["disk"]
        assert 0 < disk["free_bytes"] <= disk["total_bytes"] and disk["state"] in ("ok", "low")
        monkeypatch.setattr(health, "LOW_DISK_BYTES", disk["total_bytes"] + 1)  # any disk is "low" now
        assert http.get("/ready").json()["disk"]["state"] == "low"
        components = http.get("/openapi.json").json()["components"]["schemas"]
    assert {"version", "uptime_s"} <= set(components["HealthOut"]["properties"])
    assert {"version", "uptime_s", "disk"} <= set(components["ReadyOut"]["properties"])
