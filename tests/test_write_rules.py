"""Every route that saves a text keeps /v1/remember's promises (issue 53): the same size bounds, the same scope for
a key pinned to an agent, the same rule for idempotency keys in the namespace the service derives its own in.

One test over a table of the write routes: a new route is a new row, and it cannot pass without keeping all
three. The real app and stores (SQLite, Chroma, the embedder) in this process, no model and no workers.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import InProcessApp
from fastapi.testclient import TestClient

from memory_service.contract.hindsight import derived_key

TEAM = "team-a"
MAX_METADATA_BYTES = 8 * 1024  # the bound docs/api.md gives metadata, as stored


@dataclass(frozen=True)
class Save:
    agent: str
    text: str
    metadata: dict[str, str]
    run: str | None = None
    key: str | None = None


@dataclass(frozen=True)
class Outcome:
    status: int  # the HTTP status; for an import line refused, the status /v1/remember would answer
    detail: str  # the refusal's words ("" when stored)

    @property
    def stored(self) -> bool:
        return self.status < 300


def _http(answer: Any) -> Outcome:
    detail = answer.json().get("detail", "") if answer.status_code >= 300 else ""
    return Outcome(answer.status_code, str(detail))


def remember(http: TestClient, save: Save) -> Outcome:
    body = {"text": save.text, "agent_id": save.agent, "metadata": save.metadata, "run_id": save.run}
    return _http(http.post("/v1/remember", json=body | ({"idempotency_key": save.key} if save.key else {})))


def mem0_add(http: TestClient, save: Save) -> Outcome:
    body = {"messages": [{"role": "user", "content": save.text}], "agent_id": save.agent, "metadata": save.metadata}
    body |= {"run_id": save.run, "idempotency_key": save.key}  # mem0 has no key: a sent one must not be taken
    return _http(http.post("/mem0/v3/memories/add/", json={k: v for k, v in body.items() if v is not None}))


def mem0_update(http: TestClient, save: Save, admin: TestClient) -> Outcome:
    """Update a memory of `save.agent` (made first by an unpinned key) to the save's text and metadata."""
    first = {"messages": [{"content": f"First version for {save.agent}."}], "agent_id": save.agent, "run_id": save.run}
    made = admin.post("/mem0/v3/memories/add/", json={k: v for k, v in first.items() if v is not None})
    assert made.status_code == 200, made.text
    memory_id = made.json()["results"][0]["id"]
    body = {"text": save.text, "metadata": save.metadata} | ({"idempotency_key": save.key} if save.key else {})
    return _http(http.put(f"/mem0/v1/memories/{memory_id}/", json=body))


def retain(http: TestClient, save: Save) -> Outcome:
    item: dict[str, Any] = {"content": save.text, "metadata": save.metadata}
    item |= {"idempotency_key": save.key} if save.key else {}  # Hindsight has no key: a sent one must not be taken
    return _http(http.post(f"/v1/default/banks/{save.agent}/memories", json={"items": [item]}))


def import_line(http: TestClient, save: Save) -> Outcome:
    line = {"id": f"mem_{uuid.uuid4().hex}", "text": save.text, "agent_id": save.agent}
    line |= {"metadata": save.metadata, "created_at": 1_700_000_000.0, "run_id": save.run, "idempotency_key": save.key}
    answer = http.post("/v1/import", content=(json.dumps(line) + "\n").encode())
    if answer.status_code != 200 or not answer.json()["failed"]:
        return _http(answer)
    (error,) = answer.json()["errors"]
    status = 413 if "bytes" in error["detail"] else 403 if "pinned" in error["detail"] else 422
    return Outcome(status, error["detail"])


Route = Callable[..., Outcome]
ROUTES: dict[str, Route] = {
    "v1 remember": remember,
    "mem0 add": mem0_add,
    "mem0 update": mem0_update,
    "hindsight retain": retain,
    "import": import_line,
}


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    made = InProcessApp(tmp_path_factory.mktemp("write-rules") / "data")
    yield made
    made.services.close()


def _keys(app: InProcessApp, agent: str) -> set[str | None]:
    with app.services.journal.reading() as conn:
        sql = "SELECT idempotency_key FROM memories WHERE team = ? AND agent_id = ? AND status != 'deleted'"
        return {row[0] for row in conn.execute(sql, (TEAM, agent))}


@pytest.mark.parametrize("route", list(ROUTES))
def test_every_write_route_takes_the_native_bounds_scope_and_key_rules(app: InProcessApp, route: str) -> None:
    write = ROUTES[route]
    admin = app.client("key-a")
    bank = "bank-" + route.replace(" ", "-")
    pinned = app.client(app.services.keys.create(TEAM, "admin", agent_id="pin-" + bank).key)
    call: Callable[[TestClient, Save], Outcome] = (
        (lambda http, save: write(http, save, admin)) if route == "mem0 update" else write
    )
    limit = app.settings.max_text_bytes

    # boundary: the text, and the metadata as it would be stored (an export line of it must import back)
    big_text = call(admin, Save(bank, "x" * (limit + 1), {}))
    assert (big_text.status, "MEMORY_MAX_TEXT_BYTES" in big_text.detail) == (413, True), big_text
    fits = MAX_METADATA_BYTES - len(json.dumps({"note": ""}))  # {"note": "mmm..."} is 8 KiB as JSON exactly
    big_meta = call(admin, Save(bank, "A note with big metadata.", {"note": "m" * (fits + 1)}))
    assert (big_meta.status, f"{MAX_METADATA_BYTES} bytes as JSON" in big_meta.detail) == (413, True), big_meta
    # at the bound: refused, or stored so that its export line imports back (mem0 kept its ids beside it and
    # the line failed the import's bound)
    at_bound = call(admin, Save(bank, "A note with metadata at the bound.", {"note": "m" * fits}))
    assert at_bound.stored or at_bound.status == 413, at_bound
    lines = [line for line in admin.get("/v1/export").text.split("\n") if line and json.loads(line)["agent_id"] == bank]
    moved = app.client("key-b").post("/v1/import", content="\n".join(lines).encode())
    assert moved.status_code == 200 and moved.json()["failed"] == 0, moved.json()

    # scope: a key pinned to an agent writes as that agent only (an update of another agent's memory is a 404:
    # a pinned key does not see it), and an import, which writes as any agent, is for unpinned keys
    before = _keys(app, bank)
    other = call(pinned, Save(bank, "Posing as another agent.", {}))
    assert other.status in (403, 404) and not other.stored, other
    assert other.status == 404 or "pinned" in other.detail, other
    assert len(_keys(app, bank)) <= len(before) + (1 if route == "mem0 update" else 0)  # only the update's first

    # keys: one in the derived namespace is never taken from a client; the owner's retain it was aimed at
    # still stores its item (it answered 200 and stored nothing, or 409 on every retry)
    aimed = derived_key(bank, "document", "d53", 0)
    planted = call(admin, Save(bank, "A planted note.", {}, run="d53", key=aimed))
    assert planted.stored or (planted.status == 422 and "reserved" in planted.detail), planted
    assert aimed not in _keys(app, bank), planted
    owner = app.client("key-a").post(
        f"/v1/default/banks/{bank}/memories",
        json={"items": [{"content": "The owner's d53 note.", "document_id": "d53"}]},
    )
    assert owner.status_code == 200, owner.text
    assert aimed in _keys(app, bank)
    other_bank = call(admin, Save("not-" + bank, "Another bank's key.", {}, run="d53", key=aimed))
    assert other_bank.stored or (other_bank.status == 422 and "reserved" in other_bank.detail), other_bank
    assert aimed not in _keys(app, "not-" + bank)
