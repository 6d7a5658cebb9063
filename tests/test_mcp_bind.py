"""`memory-service mcp --transport http`: whoever reaches its port acts with its API key, so who may reach it.

Beyond loopback it does not start without a bearer token (MEMORY_MCP_TOKEN / --token), which every request
must then carry; on loopback without a token it answers only loopback Host names (a web page re-pointing its
own name to 127.0.0.1, DNS rebinding, is refused) and no request marked as from another site.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import ROOT

from memory_service.llm.runtime.server import free_port

pytestmark = pytest.mark.process  # the MCP server, spawned as a harness does

TOKEN = "s3cret-token-for-the-mcp-test"
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}
    return {**env, "MEMORY_URL": "http://127.0.0.1:9", **extra}  # no service: the server starts with no tools


def _mcp(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memory_service", "mcp", "--transport", "http", *args],
        env=_env(**env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10", "::"])
def test_beyond_loopback_without_a_token_it_refuses_to_start(host: str) -> None:
    result = _mcp("--host", host, "--port", str(free_port()))
    assert result.returncode == 2, result.stderr
    assert "MEMORY_MCP_TOKEN" in result.stderr and host in result.stderr and "Traceback" not in result.stderr


def test_a_short_token_is_refused() -> None:
    result = _mcp("--host", "0.0.0.0", "--port", str(free_port()), MEMORY_MCP_TOKEN="short")
    assert result.returncode == 2 and "16 characters" in result.stderr and "Traceback" not in result.stderr


def _running(tmp_path: Path, **env: str) -> Iterator[str]:
    port = free_port()
    log = open(tmp_path / "mcp-http.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "memory_service", "mcp", "--transport", "http", "--port", str(port)],
        env=_env(**env),
        cwd=str(ROOT),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url, timeout=1, trust_env=False)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "mcp-http.log").read_text()
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.fixture
def open_mcp(tmp_path: Path) -> Iterator[str]:
    yield from _running(tmp_path)


@pytest.fixture
def token_mcp(tmp_path: Path) -> Iterator[str]:
    yield from _running(tmp_path, MEMORY_MCP_TOKEN=TOKEN)


def test_without_a_token_a_foreign_host_or_another_site_is_refused(open_mcp: str) -> None:
    with httpx.Client(timeout=10, trust_env=False) as http:
        ok = http.post(open_mcp, json=INIT, headers=MCP_HEADERS)
        assert ok.status_code == 200, ok.text
        rebound = http.post(open_mcp, json=INIT, headers={**MCP_HEADERS, "Host": "evil.example"})
        assert rebound.status_code == 421 and rebound.json()["error"] == "untrusted_host", rebound.text
        cross = http.post(open_mcp, json=INIT, headers={**MCP_HEADERS, "Origin": "http://evil.example"})
        assert cross.status_code == 403 and cross.json()["error"] == "cross_site", cross.text


def test_with_a_token_a_request_without_it_is_a_401(token_mcp: str) -> None:
    with httpx.Client(timeout=10, trust_env=False) as http:
        missing = http.post(token_mcp, json=INIT, headers=MCP_HEADERS)
        assert missing.status_code == 401 and missing.json()["error"] == "unauthorized", missing.text
        assert missing.headers["www-authenticate"].startswith("Bearer")
        wrong = http.post(token_mcp, json=INIT, headers={**MCP_HEADERS, "Authorization": "Bearer " + "x" * 29})
        assert wrong.status_code == 401
        right = http.post(token_mcp, json=INIT, headers={**MCP_HEADERS, "Authorization": f"Bearer {TOKEN}"})
        assert right.status_code == 200, right.text
