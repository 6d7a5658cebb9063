"""The vertical slice end to end: real service, real llama-server, real Chroma and SQLite, over HTTP."""

from __future__ import annotations

import uuid

import pytest
from conftest import wait_status

pytestmark = pytest.mark.process  # serve on a real model

EMAIL_TEXT = (
    "Sent the weekly digest to alice@example.com; the daily quota for outbound emails is 50 and we have used 12."
)


def test_remember_is_acked_then_extracted_and_recalled(tiny_service):
    with tiny_service.client() as client:
        marker = uuid.uuid4().hex[:8]
        response = client.post(
            "/v1/remember",
            json={
                "text": f"Deployed build {marker} of the billing service to the staging cluster in Frankfurt.",
                "agent_id": "deployer",
                "tags": ["deploy"],
                "metadata": {"ticket": "OPS-7"},
            },
        )
        assert response.status_code == 202, response.text
        body = response.json()
        assert body["status"] in {"queued", "extracting", "done"} and body["created"] is True
        memory = wait_status(client, body["id"])
        assert memory["status"] == "done", memory
        assert memory["attempts"] >= 1 and memory["metadata"] == {"ticket": "OPS-7"}
        assert memory["timings"]["predicted_n"] > 0 and memory["timings"]["prompt_n"] + memory["timings"]["cache_n"] > 0
        items = client.post("/v1/recall", json={"query": f"billing build {marker} staging", "k": 5}).json()["items"]
        assert items and items[0]["memory_id"] == body["id"]
        assert all(item["tags"] == ["deploy"] for item in items if item["memory_id"] == body["id"])


def test_recall_filters_by_agent_tags_kind_and_time(tiny_service):
    with tiny_service.client() as client:
        marker = uuid.uuid4().hex[:8]
        ids = {}
        for agent, tag in (("scout", "news"), ("writer", "drafts")):
            r = client.post(
                "/v1/remember",
                json={
                    "text": f"Agent {agent} filed report {marker} about the harbour crane outage.",
                    "agent_id": agent,
                    "tags": [tag],
                },
            )
            ids[agent] = r.json()["id"]
        for memory_id in ids.values():
            wait_status(client, memory_id)
        query = {"query": f"harbour crane report {marker}", "k": 20}
        mine = client.post("/v1/recall", json={**query, "scope": "agent", "agent_id": "scout"}).json()["items"]
        assert mine and {i["agent_id"] for i in mine} == {"scout"}
        tagged = client.post("/v1/recall", json={**query, "tags": ["drafts"]}).json()["items"]
        assert tagged and {i["memory_id"] for i in tagged} == {ids["writer"]}
        passages = client.post("/v1/recall", json={**query, "kinds": ["passage"]}).json()["items"]
        assert passages and {i["kind"] for i in passages} == {"passage"}
        future = client.post("/v1/recall", json={**query, "since": "2999-01-01T00:00:00Z"}).json()["items"]
        assert future == []


def test_idempotency_key_returns_first_id_and_stores_nothing_new(tiny_service):
    with tiny_service.client("key-a") as a, tiny_service.client("key-b") as b:
        key = "idem-" + uuid.uuid4().hex
        body = {
            "text": "Posted the changelog for release 4.2 to the forum.",
            "agent_id": "poster",
            "idempotency_key": key,
        }
        first = a.post("/v1/remember", json=body)
        again = a.post("/v1/remember", json={**body, "text": "a different text under the same key"})
        assert first.status_code == again.status_code == 202
        assert again.json()["id"] == first.json()["id"] and again.json()["created"] is False
        assert a.get(f"/v1/memories/{first.json()['id']}").json()["text"] == body["text"]
        other_team = b.post("/v1/remember", json=body)
        assert other_team.json()["created"] is True and other_team.json()["id"] != first.json()["id"]


def test_teams_cannot_see_each_others_memories(tiny_service):
    with tiny_service.client("key-a") as a, tiny_service.client("key-b") as b:
        secret = "zq" + uuid.uuid4().hex[:10]
        memory_id = a.post(
            "/v1/remember", json={"text": f"The vault code is {secret} for the archive room.", "agent_id": "keeper"}
        ).json()["id"]
        wait_status(a, memory_id)
        assert any(secret in i["text"] for i in a.post("/v1/recall", json={"query": secret}).json()["items"])
        leaked = b.post("/v1/recall", json={"query": f"vault code {secret} archive room", "k": 100}).json()["items"]
        assert all(secret not in i["text"] and i["memory_id"] != memory_id for i in leaked)
        foreign = b.get(f"/v1/memories/{memory_id}")
        unknown = b.get("/v1/memories/mem_doesnotexist")
        assert foreign.status_code == unknown.status_code == 404
        assert foreign.json()["detail"].replace(memory_id, "X") == unknown.json()["detail"].replace(
            "mem_doesnotexist", "X"
        )


@pytest.mark.slow
def test_default_model_extracts_the_key_figure(default_llama, service_factory):
    service = service_factory(default_llama.url)
    with service.client() as client:
        response = client.post("/v1/remember", json={"text": EMAIL_TEXT, "agent_id": "mailer"})
        assert response.status_code == 202
        memory = wait_status(client, response.json()["id"], timeout=180)
        assert memory["status"] == "done", memory
        fifty = [f for f in memory["facts"] if "50" in f["text"]]
        assert fifty, memory["facts"]
        items = client.post("/v1/recall", json={"query": "email quota", "k": 3}).json()["items"]
        assert any(i["kind"] == "fact" and "50" in i["text"] for i in items), items
        ready = client.get("/ready").json()
        assert ready["throughput"]["generation_tokens_per_s"] > 0
