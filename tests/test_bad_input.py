"""Bad input gets a clear 4xx that names the problem, and stores nothing.

In process: the real app, handlers and stores, no model server (none of this reaches it).
"""

from __future__ import annotations

import pytest

from memory_service.contract.ids import ID_RULE
from memory_service.contract.limit_rules import InvalidInput

REMEMBER_CASES = [
    ({"text": "", "agent_id": "a"}, 422, "text"),
    ({"text": "   \n\t ", "agent_id": "a"}, 422, "empty"),
    ({"text": "hello there friend", "agent_id": ""}, 422, "agent_id"),
    ({"text": "hello there friend"}, 422, "agent_id: field required"),
    ({"text": 42, "agent_id": "a"}, 422, "text"),
    ({"text": "ok text", "agent_id": "a", "tags": "not-a-list"}, 422, "tags"),
    ({"text": "ok text", "agent_id": "a", "colour": "blue"}, 422, "colour: unknown field"),
    ({"text": "ok text", "agent_id": "a", "wait_s": -1}, 422, "wait_s"),
    ({"text": "x" * (64 * 1024 + 1), "agent_id": "a"}, 413, "65536"),
]


@pytest.mark.parametrize("body,status,needle", REMEMBER_CASES)
def test_remember_rejects_bad_bodies(inprocess, body, status, needle):
    with inprocess.client() as client:
        before = inprocess.jobs()
        response = client.post("/v1/remember", json=body)
        assert response.status_code == status, response.text
        assert needle in response.json()["detail"]
        assert inprocess.jobs() == before


def test_invalid_json_is_a_400(inprocess):
    with inprocess.client() as client:
        response = client.post(
            "/v1/remember", content=b'{"text": "unterminated', headers={"content-type": "application/json"}
        )
        assert response.status_code == 400 and "not valid JSON" in response.json()["detail"]


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"query": "x", "k": 0}, "k"),
        ({"query": "x", "k": 101}, "k"),
        ({"query": ""}, "query"),
        ({"query": "x", "scope": "agent"}, "agent_id"),
        ({"query": "x", "scope": "galaxy"}, "scope"),
        ({"query": "x", "kinds": ["opinion"]}, "kinds"),
        ({"query": "x", "since": "2030-01-01T00:00:00Z", "until": "2020-01-01T00:00:00Z"}, "since"),
    ],
)
def test_recall_rejects_bad_queries(inprocess, body, needle):
    with inprocess.client() as client:
        response = client.post("/v1/recall", json=body)
        assert response.status_code == 422, response.text
        assert needle in response.json()["detail"]


def test_auth_is_required_and_checked(inprocess):
    with inprocess.client(None) as anonymous, inprocess.client("wrong-key") as wrong:
        assert anonymous.post("/v1/recall", json={"query": "x"}).status_code == 401
        assert wrong.post("/v1/remember", json={"text": "t", "agent_id": "a"}).status_code == 401
        assert "Bearer" in anonymous.get("/v1/memories/x").json()["detail"]


def test_unknown_memory_is_404(inprocess):
    with inprocess.client() as client:
        response = client.get("/v1/memories/mem_nope")
        assert response.status_code == 404 and "mem_nope" in response.json()["detail"]


def test_oversized_body_is_refused_before_it_is_read(inprocess):
    with inprocess.client() as client:
        before = inprocess.jobs()
        response = client.post("/v1/remember", json={"text": "y" * 400_000, "agent_id": "a"})
        assert response.status_code == 413 and "MEMORY_MAX_TEXT_BYTES" in response.json()["detail"]
        assert inprocess.jobs() == before


BAD_AGENT = "has space"
AGENT_ID_REFUSALS = [
    ("POST", "/v1/remember", {"json": {"text": "hello", "agent_id": BAD_AGENT}}),
    ("POST", "/v1/recall", {"json": {"query": "x", "scope": "agent", "agent_id": BAD_AGENT}}),
    ("GET", "/v1/memories", {"params": {"agent_id": BAD_AGENT}}),
    ("DELETE", "/v1/memories", {"params": {"agent_id": BAD_AGENT, "confirm": "true"}}),
    ("GET", "/v1/limits", {"params": {"agent_id": BAD_AGENT}}),
    ("POST", "/v1/limits/any/consume", {"json": {"agent_id": BAD_AGENT}}),
    ("POST", "/v1/handled", {"json": {"key": "k", "agent_id": BAD_AGENT}}),
    ("GET", "/v1/handled/k", {"params": {"agent_id": "x" * 129}}),
]


@pytest.mark.parametrize("method,path,options", AGENT_ID_REFUSALS)
def test_agent_id_has_one_rule_on_every_route(inprocess, method, path, options):
    with inprocess.client() as client:
        response = client.request(method, path, **options)
        assert response.status_code == 422, response.text
        body = response.json()
        assert body["error"] == "invalid_request" and body["errors"][0]["field"].endswith("agent_id")
        assert f"agent_id: must be {ID_RULE}" in body["detail"]


def test_the_limit_store_keeps_the_same_rule(inprocess):
    with pytest.raises(InvalidInput, match="starting with a letter or digit"):
        inprocess.services.limits.consume("team-a", "any", "line\nbreak")
