"""Nothing acknowledged is lost: not to a dead model server, a restart, or a SIGKILL under load."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from conftest import wait_status

from memory_service.llm.runtime.server import free_port

pytestmark = pytest.mark.process  # SIGKILL and restarts of serve


def test_saves_wait_for_a_dead_model_and_resume_after_restart(tiny_llama, service_factory, tmp_path):
    dead_url = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    data_dir = tmp_path / "shared-data"
    first = service_factory(dead_url, data_dir=data_dir)
    marker = uuid.uuid4().hex[:8]
    with first.client() as client:
        ready = client.get("/ready")
        assert ready.status_code == 503 and ready.json()["model_server"]["reachable"] is False
        memory_id = client.post(
            "/v1/remember", json={"text": f"Invoice {marker} from Acme Corp was paid on 3 March.", "agent_id": "ledger"}
        ).json()["id"]
        time.sleep(1.5)
        memory = client.get(f"/v1/memories/{memory_id}").json()
        assert memory["status"] == "queued" and memory["attempts"] == 0  # waiting costs no attempt
        # recall works with no model at all
        items = client.post("/v1/recall", json={"query": f"invoice {marker}"}).json()["items"]
        assert items and items[0]["memory_id"] == memory_id
    first.stop()

    second = service_factory(tiny_llama.url, data_dir=data_dir)
    with second.client() as client:
        memory = wait_status(client, memory_id)
        assert memory["status"] == "done", memory


def _post(url: str, i: int, marker: str, acked: list, lock: threading.Lock) -> None:
    try:
        response = httpx.post(
            url + "/v1/remember",
            json={
                "text": f"Inflight note {i} tag {marker}{i}: user asked to archive ticket {1000 + i}.",
                "agent_id": f"agent-{i % 4}",
            },
            headers={"Authorization": "Bearer key-a"},
            timeout=30,
            trust_env=False,
        )
    except httpx.HTTPError:
        return
    if response.status_code == 202:
        with lock:
            acked.append((i, response.json()["id"]))


def test_sigkill_with_200_saves_in_flight_loses_nothing_acked(tiny_llama, service_factory, tmp_path):
    data_dir = tmp_path / "kill-data"
    service = service_factory(tiny_llama.url, data_dir=data_dir)
    marker = "k" + uuid.uuid4().hex[:6]
    acked: list[tuple[int, str]] = []
    lock = threading.Lock()
    with ThreadPoolExecutor(max_workers=16) as pool:
        futures = [pool.submit(_post, service.url, i, marker, acked, lock) for i in range(200)]
        while len(acked) < 60:
            time.sleep(0.01)
        service.kill()
        for future in futures:
            future.result()
    assert 60 <= len(acked) <= 200

    restarted = service_factory(tiny_llama.url, data_dir=data_dir)
    with restarted.client(timeout=120) as client:
        for i, memory_id in acked:
            memory = wait_status(client, memory_id, timeout=300)
            assert memory["status"] in {"done", "failed"}
            assert f"{marker}{i}:" in memory["text"]
        for i, memory_id in acked[:: max(1, len(acked) // 10)]:
            items = client.post("/v1/recall", json={"query": f"{marker}{i}", "k": 5, "kinds": ["passage"]}).json()[
                "items"
            ]
            assert any(item["memory_id"] == memory_id for item in items), (i, items)
