"""MEMORY_CHROMA_URL against a real `chroma run` server: the service over HTTP, its vectors on the server.

The fake model extracts (it answers at once and always with facts); everything else is real: the
service as a subprocess, Chroma's own server, the embedder, SQLite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import chromadb
import pytest
from chromadb.config import Settings as ChromaSettings
from conftest import KEYS, ServiceProcess, wait_status

from memory_service.llm.runtime.server import free_port
from memory_service.storage.vectors import collection_name
from memory_service.testbed.chroma_server import ChromaServer
from tests.fakes.fake_llama_server import FakeLlamaServer

pytestmark = pytest.mark.process  # a chroma run server and serve subprocesses

TEXT = "The night shift at the Gdansk depot starts at 22:00 and Piotr Nowak leads it ({marker})."


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLlamaServer]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as server:
        yield server


def server_collections(server: ChromaServer) -> set[str]:
    client = chromadb.HttpClient(
        host="127.0.0.1", port=server.port, settings=ChromaSettings(anonymized_telemetry=False)
    )
    return {c.name for c in client.list_collections()}


def test_service_keeps_its_vectors_on_a_chroma_server(chroma_server, fake, tmp_path):
    svc = ServiceProcess(tmp_path / "data", fake.url, {"MEMORY_CHROMA_URL": chroma_server.url}).start()
    try:
        marker = uuid.uuid4().hex[:8]
        with svc.client("key-a") as a, svc.client("key-b") as b:
            response = a.post("/v1/remember", json={"text": TEXT.format(marker=marker), "agent_id": "dispatcher"})
            assert response.status_code == 202, response.text
            memory = wait_status(a, response.json()["id"])
            assert memory["status"] == "done" and memory["facts"], memory

            query = {"query": f"who leads the night shift at the depot {marker}", "k": 10}
            found = a.post("/v1/recall", json=query)
            assert found.status_code == 200, found.text
            items = found.json()["items"]
            mine = [i for i in items if i["memory_id"] == memory["id"]]
            assert {i["kind"] for i in mine} == {"passage", "fact"}, items

            # one collection per team and kind, on the server; none in the data dir
            names = server_collections(chroma_server)
            assert {collection_name(team, kind) for team in ("team-a",) for kind in ("passage", "fact")} <= names
            assert not (svc.data_dir / "chroma").exists()

            # team B's key finds nothing of team A's, by meaning or by the exact marker
            for q in (query["query"], marker):
                leaked = b.post("/v1/recall", json={"query": q, "k": 100}).json()["items"]
                assert all(i["memory_id"] != memory["id"] and marker not in i["text"] for i in leaked), leaked
    finally:
        assert svc.stop() == 0
    assert "Traceback" not in svc.log()


def test_serve_refuses_to_start_without_its_chroma_server(fake, tmp_path):
    """An unreachable server is one line naming MEMORY_CHROMA_URL, before any model is started."""
    url = f"http://127.0.0.1:{free_port()}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")},
        "MEMORY_DATA_DIR": str(tmp_path / "data"),
        "MEMORY_LLM_URL": fake.url,
        "MEMORY_CHROMA_URL": url,
        "MEMORY_API_KEYS": ",".join(f"{k}:{t}" for k, t in KEYS.items()),
        "MEMORY_PORT": str(free_port()),
    }
    result = subprocess.run(
        [sys.executable, "-m", "memory_service.cli.main", "serve"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert f"MEMORY_CHROMA_URL={url}" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_malformed_chroma_url_is_a_configuration_error(tmp_path):
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")},
        "MEMORY_DATA_DIR": str(tmp_path / "data"),
        "MEMORY_CHROMA_URL": "127.0.0.1:8000",
    }
    result = subprocess.run(
        [sys.executable, "-m", "memory_service.cli.main", "serve"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "MEMORY_CHROMA_URL" in result.stderr, result.stderr
