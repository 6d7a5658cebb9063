"""Keys never hide data (issue 42, item 2): the first key while keyless memories sit in team `local` needs a
choice, the last key is revoked only with `--keyless`, and the MCP server's no-tools message says the real reason.

The real `memory-service` console script in a subprocess, on the data dir of a keyless app running in this
process (real stores, no model, no workers): the CLI changes the key store under it, as it does in real life.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from conftest import ROOT
from fastapi.testclient import TestClient
from inprocess import LoopbackServer
from mcp import Client

from memory_service.app import create_app
from memory_service.client import AsyncMemoryClient
from memory_service.config import Settings
from memory_service.llm.runtime.server import free_port
from memory_service.mcp_server.server import build_server, instructions, probe
from memory_service.mcp_server.tools import Toolbox
from memory_service.services import Services

CLI = ROOT / ".venv" / "bin" / "memory-service"


@pytest.fixture
def keyless(tmp_path: Path) -> Iterator[Services]:
    """A keyless loopback service whose team `local` holds two memories (queued: no model here)."""
    settings = Settings(data_dir=tmp_path / "data", llm_url=f"http://127.0.0.1:{free_port()}", chroma_process=False)
    services = Services.open(settings.with_overrides(api_keys={}))
    assert not services.settings.api_keys
    for text in ("The staging db password rotates on Mondays.", "Invoice 12 was paid."):
        assert _http(services).post("/v1/remember", json={"text": text, "agent_id": "me"}).status_code == 202
    yield services
    services.close()


def _http(services: Services, key: str | None = None) -> TestClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    app = create_app(services.settings, services=services)
    return TestClient(app, headers=headers, base_url="http://127.0.0.1:8700")  # keyless mode answers loopback only


def _keys(services: Services, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(services.settings.data_dir.parent)}
    return subprocess.run(
        [str(CLI), "keys", *args, "--data-dir", str(services.settings.data_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_the_first_key_names_the_keyless_memories_and_needs_a_choice(keyless: Services) -> None:
    refused = _keys(keyless, "create", "--team", "ops", "--role", "admin")
    assert refused.returncode == 2 and refused.stdout == ""
    said = refused.stderr
    assert "team 'local' holds 2 memories (2 queued)" in said, said
    assert "--team local" in said and "--leave-local" in said and "memory-service export" in said, said
    assert keyless.keys.list() == []  # nothing created: the service is still keyless
    assert _http(keyless).get("/v1/memories").status_code == 200

    given = _keys(keyless, "create", "--team", "local", "--role", "admin")
    assert given.returncode == 0, given.stderr
    assert "keyless mode is over" in given.stderr and "this key sees them" in given.stderr
    made = json.loads(given.stdout)
    assert _http(keyless).get("/v1/memories").status_code == 401  # keyless mode ended with the first key
    assert len(_http(keyless, made["key"]).get("/v1/memories").json()["items"]) == 2  # and the key sees the data


def test_the_last_key_is_revoked_only_with_keyless(keyless: Services) -> None:
    made = json.loads(_keys(keyless, "create", "--team", "local", "--role", "admin").stdout)
    over_http = _http(keyless, made["key"]).delete(f"/v1/keys/{made['id']}")
    assert over_http.status_code == 409 and "--keyless" in over_http.json()["detail"]  # an admin never turns auth off

    refused = _keys(keyless, "revoke", made["id"])
    assert refused.returncode == 2 and "last active key" in refused.stderr and "--keyless" in refused.stderr
    assert _http(keyless).get("/v1/memories").status_code == 401  # still keyed

    chosen = _keys(keyless, "revoke", made["id"], "--keyless")
    assert chosen.returncode == 0, chosen.stderr
    assert "keyless" in chosen.stderr and "team 'local'" in chosen.stderr
    assert len(_http(keyless).get("/v1/memories").json()["items"]) == 2  # keyless again, by choice

    left = _keys(keyless, "create", "--team", "ops", "--role", "admin", "--leave-local")
    assert left.returncode == 0, left.stderr
    assert "team 'local' holds 2 memories" in left.stderr and "out of this key's sight" in left.stderr


def test_the_mcp_server_says_why_it_has_no_tools_and_an_empty_team_is_no_reason(keyless: Services) -> None:
    """The README's path: the first key for a new team (`ops`), then the MCP server. No key: the service's
    401, named as such (it used to say "start the memory service"); the `ops` key, whose team has no memories:
    every tool; nothing listening: the URL and how to start the service."""
    made = json.loads(_keys(keyless, "create", "--team", "ops", "--role", "write", "--leave-local").stdout)
    server = LoopbackServer(create_app(keyless.settings, services=keyless), lifespan="off").start()
    nobody = f"http://127.0.0.1:{free_port()}"

    async def start(url: str, key: str | None) -> tuple[str, list[str]]:
        async with AsyncMemoryClient(url, api_key=key, retry_budget_s=0.5) as memory:
            found = await probe(memory, url)
            async with Client(build_server(Toolbox(memory, url=url, agent_id="a"), found)) as client:
                listed = [tool.name for tool in (await client.list_tools()).tools]
                return instructions(found, tuple(listed)), listed

    try:
        said, listed = anyio.run(start, server.url, None)
        assert listed == [] and "refused the API key" in said and "missing API key" in said, said
        assert "MEMORY_API_KEY" in said and "keys create" in said and "Start the memory service" not in said, said
        said, listed = anyio.run(start, server.url, made["key"])
        assert listed == ["remember", "recall", "consume_limit", "mark_handled"], said
        said, listed = anyio.run(start, nobody, made["key"])
        assert listed == [] and f"{nobody} is unreachable" in said and "memory-service serve" in said, said
    finally:
        server.stop()


@pytest.mark.process  # `memory-service serve`, stopped once it has said how it authenticates
def test_serve_names_keyless_mode_and_its_team(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MEMORY_DATA_DIR": str(tmp_path / "data")}
    env["MEMORY_LLM_URL"] = f"http://127.0.0.1:{free_port()}"  # no model needed: the line comes first
    serve = subprocess.Popen(
        [str(CLI), "serve", "--port", str(free_port())], stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert serve.stderr is not None
        line = next((line for line in serve.stderr if "keyless mode" in line or "Uvicorn running" in line), "")
    finally:
        serve.terminate()
        serve.wait(60)
    assert "keyless mode" in line and "team 'local'" in line and "--team local" in line, line
