"""What /openapi.json (and so /docs) says each route answers is what the server really sends.

In process, with the real app and real storage, no model server: every request below is real, and its
status must be documented for its route, its content type documented for that status, and its body valid
against the schema documented there (JSON Schema 2020-12, as FastAPI emits OpenAPI 3.1).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator


class Contract:
    """The OpenAPI document, and a checker of real responses against it."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.checked: set[tuple[str, str]] = set()

    def problems(self, response: httpx.Response, path: str) -> list[str]:
        """Every way `response` differs from what the document declares for `path` (a template)."""
        method = response.request.method.lower()
        where = f"{method.upper()} {path} -> {response.status_code}"
        operation = self.doc["paths"].get(path, {}).get(method)
        if operation is None:
            return [f"{method.upper()} {path}: not in the document"]
        self.checked.add((path, method))
        documented = operation["responses"].get(str(response.status_code))
        if documented is None:
            return [f"{where}: status not documented (documented: {sorted(operation['responses'])})"]
        content = documented.get("content", {})
        if not response.content:
            return [f"{where}: no body, but the document declares {sorted(content)}"] if content else []
        media = response.headers.get("content-type", "").split(";")[0].strip()
        if media not in content:
            return [f"{where}: content type {media!r} not documented (documented: {sorted(content)})"]
        if media == "application/json":
            return self._invalid(where, content[media].get("schema"), response.json())
        if media == "application/x-ndjson":
            lines = [json.loads(line) for line in response.text.splitlines() if line.strip()]
            return [
                p
                for n, line in enumerate(lines, 1)
                for p in self._invalid(f"{where} line {n}", content[media].get("itemSchema"), line)
            ]
        if media == "text/plain":  # Prometheus metrics: parsed by tests/test_metrics.py
            return [] if response.text.strip() else [f"{where}: empty text body"]
        return [f"{where}: unexpected content type {media!r}"]

    def _invalid(self, where: str, schema: dict[str, Any] | None, body: Any) -> list[str]:
        if not schema:
            return [f"{where}: no schema documented for the body"]
        # the document's components under the same pointer, so "#/components/schemas/..." resolves
        validator = Draft202012Validator({**schema, "components": self.doc.get("components", {})})
        return [
            f"{where}: {'/'.join(map(str, e.absolute_path)) or 'body'}: {e.message}"
            for e in validator.iter_errors(body)
        ]

    def check(self, response: httpx.Response, path: str, status: int) -> httpx.Response:
        assert response.status_code == status, (path, response.status_code, response.text)
        problems = self.problems(response, path)
        assert not problems, "\n".join(problems)
        return response


@pytest.fixture(scope="module")
def contract(inprocess) -> Contract:
    with inprocess.client() as client:
        return Contract(client.get("/openapi.json").json())


@pytest.fixture
def a(inprocess) -> Iterator:
    with inprocess.client("key-a") as client:
        yield client


@pytest.fixture
def anon(inprocess) -> Iterator:
    with inprocess.client(None) as client:
        yield client


def test_the_document_is_valid_openapi_31_with_one_error_shape(contract: Contract) -> None:
    assert contract.doc["openapi"].startswith("3.1")
    schemas = contract.doc["components"]["schemas"]
    assert "HTTPValidationError" not in schemas  # FastAPI's default 422 shape is never sent
    assert set(schemas["ErrorOut"]["required"]) == {"error", "detail"}
    for schema in schemas.values():
        Draft202012Validator.check_schema(schema)


def test_memories_routes(contract: Contract, a, anon) -> None:
    c = contract.check
    saved = c(
        a.post(
            "/v1/remember",
            json={"text": "The depot holds 12 pallets.", "agent_id": "mover", "idempotency_key": "contract-1"},
        ),
        "/v1/remember",
        202,
    )
    replay = c(
        a.post(
            "/v1/remember",
            json={"text": "The depot holds 12 pallets.", "agent_id": "mover", "idempotency_key": "contract-1"},
        ),
        "/v1/remember",
        202,
    )
    assert replay.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in saved.headers
    c(a.post("/v1/remember", json={"text": "x", "agent_id": "no spaces"}), "/v1/remember", 422)
    c(a.post("/v1/remember", json={"text": "x" * (64 * 1024 + 1), "agent_id": "mover"}), "/v1/remember", 413)
    c(a.post("/v1/remember", json={"text": "y" * 400_000, "agent_id": "mover"}), "/v1/remember", 413)
    c(a.post("/v1/remember", content=b"{nope", headers={"content-type": "application/json"}), "/v1/remember", 400)
    c(anon.post("/v1/remember", json={"text": "x", "agent_id": "mover"}), "/v1/remember", 401)
    for n in range(3):
        a.post("/v1/remember", json={"text": f"Pallet count {n}.", "agent_id": "mover", "run_id": "run-1"})

    memory_id = saved.json()["id"]
    c(a.get(f"/v1/memories/{memory_id}"), "/v1/memories/{memory_id}", 200)
    c(a.get("/v1/memories/mem_nope"), "/v1/memories/{memory_id}", 404)
    c(anon.get(f"/v1/memories/{memory_id}"), "/v1/memories/{memory_id}", 401)

    first = c(a.get("/v1/memories", params={"limit": 2, "agent_id": "mover"}), "/v1/memories", 200).json()
    assert first["next_cursor"]
    c(
        a.get("/v1/memories", params={"limit": 2, "cursor": first["next_cursor"], "status": "queued"}),
        "/v1/memories",
        200,
    )
    c(a.get("/v1/memories", params={"cursor": "not-a-cursor"}), "/v1/memories", 400)
    c(a.get("/v1/memories", params={"agent_id": "bad agent"}), "/v1/memories", 422)
    c(a.get("/v1/memories", params={"status": "deleted"}), "/v1/memories", 422)
    c(anon.get("/v1/memories"), "/v1/memories", 401)

    c(a.delete(f"/v1/memories/{memory_id}"), "/v1/memories/{memory_id}", 204)
    c(a.delete(f"/v1/memories/{memory_id}"), "/v1/memories/{memory_id}", 404)
    c(anon.delete(f"/v1/memories/{memory_id}"), "/v1/memories/{memory_id}", 401)
    c(a.delete("/v1/memories", params={"run_id": "run-1"}), "/v1/memories", 400)
    c(a.delete("/v1/memories", params={"run_id": "run 1", "confirm": "true"}), "/v1/memories", 422)
    assert (
        c(a.delete("/v1/memories", params={"run_id": "run-1", "confirm": "true"}), "/v1/memories", 200).json()[
            "deleted"
        ]
        == 3
    )
    c(anon.delete("/v1/memories", params={"run_id": "run-1", "confirm": "true"}), "/v1/memories", 401)


def test_recall_route(contract: Contract, a, anon) -> None:
    c = contract.check
    a.post("/v1/remember", json={"text": "The canal lock opens at dawn.", "agent_id": "keeper", "tags": ["canal"]})
    c(a.post("/v1/recall", json={"query": "canal lock", "k": 3}), "/v1/recall", 200)
    c(
        a.post("/v1/recall", json={"query": "canal", "scope": "agent", "agent_id": "keeper", "tags": ["canal"]}),
        "/v1/recall",
        200,
    )
    c(a.post("/v1/recall", json={"query": "x", "k": 0}), "/v1/recall", 422)
    c(a.post("/v1/recall", json={"query": "x", "scope": "agent"}), "/v1/recall", 422)
    c(a.post("/v1/recall", content=b"[", headers={"content-type": "application/json"}), "/v1/recall", 400)
    c(anon.post("/v1/recall", json={"query": "x"}), "/v1/recall", 401)


def test_export_and_import_routes(contract: Contract, inprocess, a, anon) -> None:
    c = contract.check
    a.post(
        "/v1/remember",
        json={"text": "Exported note: the ferry leaves at nine.", "agent_id": "porter", "metadata": {"source": "test"}},
    )
    exported = c(a.get("/v1/export"), "/v1/export", 200)
    assert exported.headers["content-type"].startswith("application/x-ndjson") and exported.text.strip()
    c(anon.get("/v1/export"), "/v1/export", 401)
    with inprocess.client("key-b") as b:
        body = exported.content + b'{"id": "broken"}\n'
        result = c(b.post("/v1/import", content=body), "/v1/import", 200).json()
        assert result["imported"] >= 1 and result["failed"] == 1
        c(b.post("/v1/import", params={"re_extract": "maybe"}, content=b""), "/v1/import", 422)
    c(anon.post("/v1/import", content=exported.content), "/v1/import", 401)


def test_limits_routes(contract: Contract, a, anon) -> None:
    c = contract.check
    spec = {"daily_limit": 2, "timezone": "Europe/Madrid", "per": "agent"}
    c(a.put("/v1/limits/mails", json=spec), "/v1/limits/{name}", 201)
    c(a.put("/v1/limits/mails", json=spec), "/v1/limits/{name}", 200)
    c(a.put("/v1/limits/a..b", json=spec), "/v1/limits/{name}", 422)
    c(anon.put("/v1/limits/mails", json=spec), "/v1/limits/{name}", 401)

    consume = "/v1/limits/{name}/consume"
    c(a.post("/v1/limits/mails/consume", json={"agent_id": "mailer", "idempotency_key": "m-1"}), consume, 200)
    replay = c(a.post("/v1/limits/mails/consume", json={"agent_id": "mailer", "idempotency_key": "m-1"}), consume, 200)
    assert replay.headers["Idempotent-Replayed"] == "true"
    c(a.post("/v1/limits/mails/consume", json={"agent_id": "other", "idempotency_key": "m-1"}), consume, 409)
    c(a.post("/v1/limits/mails/consume", json={"agent_id": "mailer"}), consume, 200)
    denied = c(a.post("/v1/limits/mails/consume", json={"agent_id": "mailer"}), consume, 429)
    assert denied.json()["allowed"] is False and int(denied.headers["Retry-After"]) > 0
    c(a.post("/v1/limits/nope/consume", json={"agent_id": "mailer"}), consume, 404)
    c(a.post("/v1/limits/mails/consume", json={"agent_id": "bad agent"}), consume, 422)
    c(anon.post("/v1/limits/mails/consume", json={"agent_id": "mailer"}), consume, 401)

    c(a.get("/v1/limits"), "/v1/limits", 200)
    c(a.get("/v1/limits", params={"agent_id": "mailer"}), "/v1/limits", 200)
    c(a.get("/v1/limits", params={"agent_id": "bad agent"}), "/v1/limits", 422)
    c(anon.get("/v1/limits"), "/v1/limits", 401)
    c(a.get("/v1/limits/mails"), "/v1/limits/{name}", 200)
    c(a.get("/v1/limits/mails", params={"agent_id": "mailer", "days": 3}), "/v1/limits/{name}", 200)
    c(a.get("/v1/limits/nope"), "/v1/limits/{name}", 404)
    c(a.get("/v1/limits/mails", params={"days": 0}), "/v1/limits/{name}", 422)
    c(anon.get("/v1/limits/mails"), "/v1/limits/{name}", 401)
    c(a.delete("/v1/limits/mails"), "/v1/limits/{name}", 204)
    c(a.delete("/v1/limits/mails"), "/v1/limits/{name}", 404)
    c(a.delete("/v1/limits/a..b"), "/v1/limits/{name}", 422)
    c(anon.delete("/v1/limits/mails"), "/v1/limits/{name}", 401)


def test_handled_routes(contract: Contract, a, anon) -> None:
    c = contract.check
    key = "https://example.com/inbox/42"
    c(a.post("/v1/handled", json={"key": key, "ttl_days": 2}), "/v1/handled", 200)
    c(a.post("/v1/handled", json={"key": key, "agent_id": "triage"}), "/v1/handled", 200)
    c(a.post("/v1/handled", json={"key": key, "agent_id": "bad agent"}), "/v1/handled", 422)
    c(anon.post("/v1/handled", json={"key": key}), "/v1/handled", 401)
    c(a.get("/v1/handled", params={"key": key}), "/v1/handled", 200)
    c(a.get("/v1/handled", params={"key": "never"}), "/v1/handled", 404)
    c(a.get("/v1/handled"), "/v1/handled", 422)
    c(anon.get("/v1/handled", params={"key": key}), "/v1/handled", 401)
    c(a.get(f"/v1/handled/{key}"), "/v1/handled/{key}", 200)
    c(a.get("/v1/handled/never/seen", params={"agent_id": "triage"}), "/v1/handled/{key}", 404)
    c(a.get(f"/v1/handled/{key}", params={"agent_id": "bad agent"}), "/v1/handled/{key}", 422)
    c(anon.get(f"/v1/handled/{key}"), "/v1/handled/{key}", 401)


def test_gate_routes(contract: Contract, a, anon) -> None:
    c = contract.check
    reserve, finish, release = "/v1/gate/reserve", "/v1/gate/finish", "/v1/gate/release"
    c(a.put("/v1/limits/gated", json={"daily_limit": 1, "timezone": "UTC"}), "/v1/limits/{name}", 201)
    held = c(a.post(reserve, json={"tool": "send", "key": "gate:1", "limit": "gated"}), reserve, 200).json()
    c(a.post(reserve, json={"tool": "send", "key": "gate:1"}), reserve, 409)  # in progress
    denied = c(a.post(reserve, json={"tool": "send", "limit": "gated"}), reserve, 429)
    assert int(denied.headers["Retry-After"]) > 0
    c(a.post(reserve, json={"tool": "send", "limit": "nope"}), reserve, 404)
    c(a.post(reserve, json={"tool": "send"}), reserve, 422)
    c(a.post(reserve, content=b"{", headers={"content-type": "application/json"}), reserve, 400)
    c(anon.post(reserve, json={"tool": "send", "key": "gate:1"}), reserve, 401)
    c(a.post(finish, json={"reservation": held["reservation"], "result": "sent"}), finish, 200)
    c(a.post(reserve, json={"tool": "send", "key": "gate:1"}), reserve, 409)  # handled
    c(a.post(finish, json={"reservation": held["reservation"]}), finish, 404)
    c(a.post(finish, json={"reservation": "res_x"}), finish, 422)
    c(anon.post(finish, json={"reservation": held["reservation"]}), finish, 401)
    again = c(a.post(reserve, json={"tool": "send", "key": "gate:2"}), reserve, 200).json()
    c(a.post(release, json={"reservation": again["reservation"], "error": "timed out"}), release, 200)
    c(a.post(release, json={"reservation": again["reservation"]}), release, 404)
    c(a.post(release, json={"reservation": again["reservation"], "extra": 1}), release, 422)
    c(anon.post(release, json={"reservation": again["reservation"]}), release, 401)


def test_team_and_keys_routes(contract: Contract, inprocess, a, anon) -> None:
    c = contract.check
    c(a.get("/v1/team"), "/v1/team", 200)
    c(anon.get("/v1/team"), "/v1/team", 401)
    made = c(a.post("/v1/keys", json={"role": "read", "label": "reader"}), "/v1/keys", 201).json()
    c(a.post("/v1/keys", json={"role": "root"}), "/v1/keys", 422)
    c(a.post("/v1/keys", content=b"{", headers={"content-type": "application/json"}), "/v1/keys", 400)
    c(anon.post("/v1/keys", json={"role": "read"}), "/v1/keys", 401)
    c(a.get("/v1/keys"), "/v1/keys", 200)
    c(a.get("/v1/keys", params={"include_revoked": "perhaps"}), "/v1/keys", 422)
    c(anon.get("/v1/keys"), "/v1/keys", 401)
    with inprocess.client(made["key"]) as reader:
        c(reader.get("/v1/team"), "/v1/team", 200)
        for path, method, template in (
            ("/v1/keys", "post", "/v1/keys"),
            ("/v1/keys", "get", "/v1/keys"),
            ("/v1/remember", "post", "/v1/remember"),
            ("/v1/limits/mails/consume", "post", "/v1/limits/{name}/consume"),
            ("/v1/handled", "post", "/v1/handled"),
            ("/v1/gate/reserve", "post", "/v1/gate/reserve"),
            ("/v1/gate/finish", "post", "/v1/gate/finish"),
            ("/v1/gate/release", "post", "/v1/gate/release"),
            ("/v1/import", "post", "/v1/import"),
            ("/v1/limits/mails", "put", "/v1/limits/{name}"),
            ("/v1/limits/mails", "delete", "/v1/limits/{name}"),
            ("/v1/memories/mem_x", "delete", "/v1/memories/{memory_id}"),
            ("/v1/memories", "delete", "/v1/memories"),
            (f"/v1/keys/{made['id']}", "delete", "/v1/keys/{key_id}"),
        ):
            c(reader.request(method.upper(), path, json={"role": "read"} if method == "post" else None), template, 403)
    c(a.delete(f"/v1/keys/{made['id']}"), "/v1/keys/{key_id}", 204)
    c(a.delete(f"/v1/keys/{made['id']}x"), "/v1/keys/{key_id}", 404)
    c(anon.delete(f"/v1/keys/{made['id']}"), "/v1/keys/{key_id}", 401)


def test_webhooks_routes(contract: Contract, a, anon) -> None:
    c = contract.check  # a public address literal: no look-up; this app runs no delivery loop, so nothing is sent
    body = {"url": "https://93.184.215.14/hook", "events": ["memory.failed"]}
    made = c(a.post("/v1/webhooks", json=body), "/v1/webhooks", 201).json()
    c(a.post("/v1/webhooks", json={**body, "url": "ftp://example.com/"}), "/v1/webhooks", 422)
    c(a.post("/v1/webhooks", content=b"{", headers={"content-type": "application/json"}), "/v1/webhooks", 400)
    c(anon.post("/v1/webhooks", json=body), "/v1/webhooks", 401)
    c(a.get("/v1/webhooks"), "/v1/webhooks", 200)
    c(anon.get("/v1/webhooks"), "/v1/webhooks", 401)
    c(a.delete(f"/v1/webhooks/{made['id']}"), "/v1/webhooks/{webhook_id}", 204)
    c(a.delete(f"/v1/webhooks/{made['id']}"), "/v1/webhooks/{webhook_id}", 404)
    c(anon.delete(f"/v1/webhooks/{made['id']}"), "/v1/webhooks/{webhook_id}", 401)


def test_health_routes(contract: Contract, a) -> None:
    c = contract.check
    c(a.get("/health"), "/health", 200)
    c(a.get("/ready"), "/ready", 503)  # no model server in process
    c(a.get("/metrics"), "/metrics", 200)
    c(a.get("/v1/stats"), "/v1/stats", 200)


def test_every_documented_operation_was_checked(contract: Contract) -> None:
    documented = {(p, m) for p, ops in contract.doc["paths"].items() for m in ops}
    assert documented - contract.checked == set()
