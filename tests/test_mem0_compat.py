"""mem0's own PyPI client (`mem0ai`, in the dev extra) against this service's mem0 API under /mem0.

Nothing here reads mem0's code: its real `MemoryClient` and `AsyncMemoryClient` (with their key check at
construction) talk over loopback HTTP to the in-process service (real stores and workers; a fake llama-server
thread extracts), on two teams with two keys. The mapping is in docs/mem0.md.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import tempfile
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import eventually
from tests.fakes.fake_llama_server import FakeLlamaServer
from tests.inprocess import InProcessService

# mem0's names, imported by the fixture below when these tests run
MemoryClient: Any = None
AsyncMemoryClient: Any = None
Mem0Error: Any = None
MemoryNotFoundError: Any = None
mem0_telemetry: Any = None


@pytest.fixture(scope="module", autouse=True)
def mem0_package() -> None:
    """Imported when these tests run, not when tests/ is collected: `import mem0` took 25-60 s here (it loads
    qdrant_client and openai), which every run of any tier would pay otherwise."""
    global MemoryClient, AsyncMemoryClient, Mem0Error, MemoryNotFoundError, mem0_telemetry
    # mem0's documented switch, read when it is imported: on, its client sends PostHog events from every call
    os.environ["MEM0_TELEMETRY"] = "False"
    os.environ.setdefault("MEM0_DIR", tempfile.mkdtemp(prefix="mem0-dir-"))  # its config.json, written on import
    from mem0 import AsyncMemoryClient, MemoryClient
    from mem0.exceptions import MemoryError as Mem0Error
    from mem0.exceptions import MemoryNotFoundError
    from mem0.memory import telemetry as mem0_telemetry


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    with FakeLlamaServer("ok", n_ctx=4096, tokens_per_s=5000) as fake:
        svc = InProcessService(tmp_path_factory.mktemp("mem0") / "data", fake.url)
        with svc:
            yield svc


@pytest.fixture(autouse=True)
def stays_on_this_machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Every connection the test opens (mem0's client, its PostHog, anything) goes to loopback: nothing leaves."""
    assert mem0_telemetry.MEM0_TELEMETRY is False and mem0_telemetry.client_telemetry.posthog is None
    outside: list[Any] = []
    connect = socket.socket.connect

    def watched(sock: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else str(address)
        if sock.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "::1", "localhost"):
            outside.append(address)
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", watched)
    yield outside
    assert outside == [], f"connections off this machine: {outside}"


def mem0(service: InProcessService, key: str = "key-a") -> Any:
    return MemoryClient(api_key=key, host=f"{service.url}/mem0")


def raw(service: InProcessService, method: str, path: str, key: str = "key-a", **kw: Any) -> httpx.Response:
    with httpx.Client(base_url=f"{service.url}/mem0", headers={"Authorization": f"Token {key}"}, timeout=30) as http:
        return http.request(method, path, **kw)


def added_id(answer: dict[str, Any]) -> str:
    (result,) = answer["results"]
    assert result["event"] == "ADD" and answer["event_id"] == result["id"]
    return str(result["id"])


def test_sync_client_add_search_list_update_history_delete(service: InProcessService) -> None:
    client = mem0(service)
    first = added_id(client.add("Mira moved to the Lisbon office in March.", user_id="mira", metadata={"src": "hr"}))
    found = client.search("Lisbon office", filters={"user_id": "mira"}, top_k=5)["results"]
    assert found and all(r["id"] == first for r in found) and any("Lisbon" in r["memory"] for r in found)
    listed = client.get_all(filters={"user_id": "mira"})
    assert listed["count"] == 1 and [m["id"] for m in listed["results"]] == [first]
    one = client.get(first)
    assert one["memory"] == "Mira moved to the Lisbon office in March." and one["user_id"] == "mira"
    assert one["metadata"] == {"src": "hr"} and one["agent_id"] is None

    updated = client.update(first, text="Mira moved to the Porto office in May.")
    second = updated["id"]
    assert second != first and updated["replaces"] == first and updated["memory"].startswith("Mira moved to the Porto")
    assert updated["user_id"] == "mira" and updated["metadata"] == {"src": "hr"}
    steps = client.history(second)
    assert [s["event"] for s in steps] == ["ADD", "UPDATE"]
    assert steps[1]["old_memory"] == "Mira moved to the Lisbon office in March."
    assert steps[1]["new_memory"] == "Mira moved to the Porto office in May."
    with pytest.raises(MemoryNotFoundError):
        client.get(first)  # the old version is forgotten
    assert [m["memory"] for m in client.get_all(filters={"user_id": "mira"})["results"]] == [
        "Mira moved to the Porto office in May."
    ]

    assert client.delete(second)["message"]
    with pytest.raises(MemoryNotFoundError):
        client.get(second)
    for n in range(3):
        client.add(f"Deploy {n} of the billing service went out.", user_id="ops", run_id="week-9", infer=False)
    page = client.get_all(filters={"AND": [{"user_id": "ops"}, {"run_id": "week-9"}]}, page=1, page_size=2)
    assert page["count"] == 3 and len(page["results"]) == 2 and page["next"] and page["previous"] is None
    last = client.get_all(filters={"user_id": "ops"}, page=2, page_size=2)
    assert len(last["results"]) == 1 and last["next"] is None and last["previous"]
    assert client.delete_all(user_id="ops")["deleted"] == 3
    assert client.get_all(filters={"user_id": "ops"})["count"] == 0
    client.client.close()


def test_async_client_round_trip(service: InProcessService) -> None:
    async def main() -> None:
        async with AsyncMemoryClient(api_key="key-a", host=f"{service.url}/mem0") as client:
            first = added_id(
                await client.add([{"role": "user", "content": "Ola prefers the night shift."}], user_id="ola")
            )
            found = (await client.search("night shift", filters={"user_id": "ola"}))["results"]
            assert found and found[0]["id"] == first
            assert (await client.get_all(filters={"user_id": "ola"}))["count"] == 1
            second = (await client.update(first, text="Ola prefers the early shift."))["id"]
            assert [s["event"] for s in await client.history(second)] == ["ADD", "UPDATE"]
            assert (await client.get(second))["memory"] == "Ola prefers the early shift."
            await client.delete(second)
            await client.add("Ola owns the on-call rota.", user_id="ola", agent_id="planner")
            assert (await client.delete_all(agent_id="planner"))["deleted"] == 1
            assert (await client.get_all(filters={"user_id": "ola"}))["count"] == 0

    asyncio.run(main())


def test_async_clients_of_two_teams_never_see_each_other(service: InProcessService) -> None:
    async def main() -> None:
        host = f"{service.url}/mem0"
        async with (
            AsyncMemoryClient(api_key="key-a", host=host) as a,
            AsyncMemoryClient(api_key="key-b", host=host) as b,
        ):
            theirs = added_id(await a.add("Team A's alarm code is 5820.", user_id="both"))
            ours = added_id(await b.add("Team B restocks the kitchen on Fridays.", user_id="both"))
            found = (await b.search("alarm code 5820", filters={"user_id": "*"}))["results"]
            assert not any("5820" in r["memory"] for r in found)
            assert [m["id"] for m in (await b.get_all(filters={"user_id": "both"}))["results"]] == [ours]
            for call in (b.get, b.history, b.delete):
                with pytest.raises(MemoryNotFoundError):
                    await call(theirs)
            with pytest.raises(MemoryNotFoundError):
                await b.update(theirs, text="overwritten by B")
            await b.delete_all(user_id="both")
            assert (await a.get(theirs))["memory"] == "Team A's alarm code is 5820."  # nothing B did reached it
            assert (await b.get_all(filters={"user_id": "both"}))["count"] == 0
            await a.delete(theirs)

    asyncio.run(main())


def test_search_threshold_is_the_least_similarity_returned(service: InProcessService) -> None:
    client = mem0(service)
    near = added_id(client.add("The staging database restarts every Sunday night.", user_id="thr"))
    added_id(client.add("Kofi brings pastries to the Monday retro.", user_id="thr"))
    query, scope = "when does the staging database restart", {"user_id": "thr"}
    # the threshold is on similarity, which a text has once it is embedded: on a busy box that can come after
    # add answers (the fast tier failed here once under load), so wait for it rather than for a fixed time
    nearest = eventually(
        "the text searchable by similarity",
        lambda: [r for r in client.search(query, filters=scope, threshold=0.0)["results"] if r["id"] == near],
        timeout=120,
    )
    best = max(r["score"] for r in nearest)
    for threshold in (0.0, round(best / 2, 3), round(best - 0.001, 3)):  # scores are rounded to 6 places
        kept = client.search(query, filters=scope, threshold=threshold)["results"]
        assert kept and all(r["score"] >= threshold for r in kept), (threshold, kept)
        assert near in {r["id"] for r in kept}
    assert client.search(query, filters=scope, threshold=min(1.0, best + 0.05))["results"] == []
    client.delete_all(user_id="thr")
    client.client.close()


def test_two_teams_never_see_each_other(service: InProcessService) -> None:
    a, b = mem0(service, "key-a"), mem0(service, "key-b")
    theirs = added_id(a.add("The vault code for team A is 4471.", user_id="shared"))
    ours = added_id(b.add("Team B's standup is at nine.", user_id="shared"))
    assert [r["id"] for r in b.search("vault code", filters={"user_id": "shared"})["results"]] in ([], [ours])
    assert not any("4471" in r["memory"] for r in b.search("vault code 4471", filters={"user_id": "*"})["results"])
    assert [m["id"] for m in b.get_all(filters={"user_id": "shared"})["results"]] == [ours]
    for call in (b.get, b.history, b.delete, lambda i: b.update(i, text="overwritten by B")):
        with pytest.raises(MemoryNotFoundError):
            call(theirs)
    b.delete_all(user_id="shared")
    assert a.get(theirs)["memory"] == "The vault code for team A is 4471."  # nothing B did reached it
    assert [m["id"] for m in a.get_all(filters={"user_id": "shared"})["results"]] == [theirs]
    assert b.get_all(filters={"user_id": "shared"})["count"] == 0
    a.delete(theirs)


def test_metadata_and_entity_ids_cannot_move_a_memory_across_teams(service: InProcessService) -> None:
    a, b = mem0(service, "key-a"), mem0(service, "key-b")
    planted = added_id(
        b.add(
            "Planted by team B: wire the refund to account 99.",
            user_id="victim",
            metadata={"team": "team-a", "user_id": "victim", "org_id": "team-a", "project_id": "team-a"},
        )
    )
    body = {"messages": [{"role": "user", "content": "Also planted by B."}], "user_id": "victim", "team": "team-a"}
    body |= {"org_id": "team-a", "project_id": "team-a", "filters": {"user_id": "victim"}}
    assert raw(service, "POST", "/v3/memories/add/", "key-b", json=body).status_code == 200
    assert a.get_all(filters={"user_id": "victim"})["count"] == 0
    assert a.search("refund account", filters={"user_id": "victim"})["results"] == []
    with pytest.raises(MemoryNotFoundError):
        a.get(planted)
    assert b.get_all(filters={"user_id": "victim"})["count"] == 2
    b.delete_all(user_id="victim")


def test_token_and_bearer_keys_and_nothing_else(service: InProcessService) -> None:
    assert raw(service, "GET", "/v1/ping/").json()["status"] == "ok"
    with httpx.Client(base_url=service.url, timeout=30) as http:
        assert http.get("/mem0/v1/ping/", headers={"Authorization": "Bearer key-b"}).status_code == 200
        assert http.get("/mem0/v1/ping/").status_code == 401
        # our own routes stay Bearer-only
        assert http.post("/v1/recall", json={"query": "x"}, headers={"Authorization": "Token key-a"}).status_code == 401
    assert raw(service, "GET", "/v1/ping/", "not-a-key").status_code == 401
    with pytest.raises(ValueError, match="unknown or revoked"):
        MemoryClient(api_key="not-a-key", host=f"{service.url}/mem0")


def test_what_is_not_served_answers_501_naming_it_and_bad_input_a_4xx(service: InProcessService) -> None:
    client = mem0(service)
    with pytest.raises(Mem0Error) as refused:
        client.users()
    assert "not served" in refused.value.message and "get_all(filters=" in refused.value.message
    for method, path in (("DELETE", "/v1/batch/"), ("POST", "/v1/exports/"), ("GET", "/v2/entities/user/x/profile/")):
        answer = raw(service, method, path, json={"memories": []} if method != "GET" else None)
        assert answer.status_code == 501 and "served under /mem0" in answer.json()["detail"], (path, answer.text)
    or_filter = raw(service, "POST", "/v3/memories/search/", json={"query": "x", "filters": {"OR": [{"user_id": "a"}]}})
    assert or_filter.status_code == 501 and "filters.OR" in or_filter.json()["detail"]
    message = [{"role": "user", "content": "x"}]
    categories = raw(service, "POST", "/v3/memories/add/", json={"messages": message, "custom_categories": [{"a": 1}]})
    assert categories.status_code == 501 and "custom_categories" in categories.json()["detail"]
    for path, body in (
        ("/v3/memories/add/", {"messages": []}),
        ("/v3/memories/add/", {"messages": [{"role": "user", "content": "x"}], "user_id": "u" * 200}),
        ("/v3/memories/add/", {"messages": [{"role": "user", "content": "x\u0000"}]}),
        ("/v3/memories/add/", {"messages": [{"role": "user", "content": "x\udc80"}]}),  # a lone surrogate
        ("/v3/memories/add/", {"messages": [{"content": "x"}], "metadata": {"k": ["v\udc80"]}}),
        ("/v3/memories/add/", {"messages": [{"role": "user", "content": " \n "}]}),
        ("/v3/memories/search/", {"query": "   "}),
        ("/v3/memories/search/", {"query": "x", "top_k": 0}),
        ("/v3/memories/search/", {"query": "x", "filters": {"created_at": {"gte": "0001-01-01T00:00:00-14:00"}}}),
        ("/v3/memories/search/", {"query": "x", "filters": {"user_id": "bad id"}}),
        ("/v3/memories/", {"filters": {"created_at": {"gte": "yesterday"}}}),
    ):
        sent = json.dumps(body)  # ASCII escapes: a lone surrogate travels as `\udc80`, as a JSON client may send it
        answer = raw(service, "POST", path, content=sent, headers={"Content-Type": "application/json"})
        assert answer.status_code == 422 and answer.json()["detail"], (body, answer.text)
    assert raw(service, "GET", "/v1/memories/not-an-id/").status_code == 422
    assert raw(service, "DELETE", "/v1/memories/").status_code == 400  # delete_all needs an entity ('*': all)
    big = {"messages": [{"role": "user", "content": "x" * (service.settings.max_text_bytes + 1)}]}
    assert raw(service, "POST", "/v3/memories/add/", json=big).status_code == 413


def test_a_key_pinned_to_an_agent_adds_and_sees_only_its_agents(service: InProcessService) -> None:
    assert service.services is not None
    pinned = service.services.keys.create("team-a", "admin", agent_id="mailer").key
    team, mailer = mem0(service, "key-a"), mem0(service, pinned)
    other = added_id(team.add("The planner books rooms on Mondays.", user_id="desk", agent_id="planner"))
    own = added_id(mailer.add("The mailer sends the digest at six.", user_id="desk"))  # no agent_id: its pin
    assert team.get(own)["agent_id"] == "mailer" and team.get_all(filters={"agent_id": "mailer"})["count"] == 1
    assert [m["id"] for m in mailer.get_all(filters={"user_id": "desk"})["results"]] == [own]
    assert all(r["id"] == own for r in mailer.search("rooms digest", filters={"user_id": "desk"})["results"])
    for call in (mailer.get, mailer.delete, mailer.history):
        with pytest.raises(MemoryNotFoundError):
            call(other)
    with pytest.raises(Mem0Error) as refused:
        mailer.add("Posing as the planner.", agent_id="planner")
    assert "pinned" in refused.value.message
    mailer.delete_all(user_id="desk")
    assert [m["id"] for m in team.get_all(filters={"user_id": "desk"})["results"]] == [other]
    team.delete(other)


def test_a_memory_saved_through_v1_reads_and_updates_through_mem0(service: InProcessService) -> None:
    body = {"text": "Invoice 12 was paid.", "agent_id": "billing", "run_id": "r-7", "tags": ["finance"]}
    with service.client("key-a") as http:
        saved = http.post("/v1/remember", json=body | {"metadata": {"source": "erp"}}).json()["id"]
    client = mem0(service)
    one = client.get(saved)
    assert (one["agent_id"], one["run_id"], one["metadata"], one["user_id"]) == (
        "billing",
        "r-7",
        {"source": "erp"},
        None,
    )
    assert saved in [m["id"] for m in client.get_all(filters={"agent_id": "billing", "run_id": "r-7"})["results"]]
    new = client.update(saved, text="Invoice 12 was paid twice.")
    assert (new["agent_id"], new["run_id"], new["metadata"]) == ("billing", "r-7", {"source": "erp"})
    with service.client("key-a") as http:
        assert http.get(f"/v1/memories/{new['id']}").json()["tags"] == ["finance"]
    client.delete(new["id"])


def test_a_wildcard_id_selects_memories_that_have_it_never_those_without(service: InProcessService) -> None:
    """mem0's `*` is "has this id, any value": delete_all(user_id="*") forgets the team's memories that have a
    user id and keeps those without one (issue 53: it forgot the whole team); get_all and search read it so."""
    client = mem0(service, "key-b")
    users = [
        added_id(client.add(f"Wildcard note {n}: the heron feeder is refilled.", user_id=f"wu{n}")) for n in (1, 2)
    ]
    agented = added_id(client.add("Wildcard note 3: the heron feeder moved.", agent_id="wildcard-bot"))
    bare = added_id(client.add("Wildcard note 4: the heron feeder is green."))  # no user, agent, app or run
    assert {m["id"] for m in client.get_all(filters={"user_id": "*"})["results"]} == set(users)
    assert {m["id"] for m in client.get_all(filters={"agent_id": "*"})["results"]} == {agented}
    assert {m["id"] for m in client.get_all(filters={"AND": [{"user_id": "*"}, {"user_id": "wu1"}]})["results"]} == {
        users[0]
    }
    found = eventually(
        "the four notes searchable",
        lambda: client.search("heron feeder", filters={"user_id": "*"}, top_k=10)["results"] or None,
        timeout=60,
    )
    assert found and {r["id"] for r in found} <= set(users), found
    assert {r["id"] for r in client.search("heron feeder", filters={"agent_id": "*"})["results"]} <= {agented}
    assert client.delete_all(user_id="*")["deleted"] == 2
    left = {m["id"] for m in client.get_all(filters={"created_at": {"gte": "2000-01-01"}})["results"]}
    assert {agented, bare} <= left and not set(users) & left
    assert client.delete_all(agent_id="*")["deleted"] == 1
    assert client.get(bare)["memory"] == "Wildcard note 4: the heron feeder is green."
    client.delete(bare)
    client.client.close()


def test_many_updates_of_a_long_chinese_note_keep_their_history_and_still_export_and_import(
    service: InProcessService,
) -> None:
    """Issue 53: each update kept the earlier versions in the memory's metadata; five updates of a 400-character
    Chinese note passed its 8 KiB bound and the exported line no longer imported. They are journal rows now."""
    client = mem0(service)
    note = "会议纪要：本周发布推迟到周五，负责人是王芳。" * 20  # 440 characters
    current = added_id(client.add("（第0版）" + note, user_id="cjk53", metadata={"src": "minutes"}))
    first_at = client.get(current)["created_at"]
    for n in range(1, 13):
        current = client.update(current, text=f"（第{n}版）" + note)["id"]
    steps = client.history(current)
    assert [s["event"] for s in steps] == ["ADD"] + ["UPDATE"] * 10  # the last 10 earlier versions, then this one
    assert [s["new_memory"][: s["new_memory"].index("）") + 1] for s in steps] == [f"（第{n}版）" for n in range(2, 13)]
    assert steps[-1]["new_memory"] == "（第12版）" + note and steps[-1]["old_memory"] == ("（第11版）" + note)[:400]
    assert all(s["memory_id"] == current and s["user_id"] == "cjk53" for s in steps)
    one = client.get(current)
    assert (one["metadata"], one["user_id"], one["created_at"]) == ({"src": "minutes"}, "cjk53", first_at)
    with service.client("key-a") as http:
        stored = http.get(f"/v1/memories/{current}").json()["metadata"]
        assert len(json.dumps(stored)) < 512, stored  # the history is not in it
        exported = [line for line in http.get("/v1/export").text.split("\n") if line and current in line]
    with service.client("key-b") as http:
        moved = http.post("/v1/import", content=exported[0].encode()).json()
    assert (moved["imported"], moved["failed"]) == (1, 0), moved
    other = mem0(service, "key-b")
    (copy,) = other.get_all(filters={"user_id": "cjk53"})["results"]
    assert (copy["memory"], copy["metadata"], copy["created_at"]) == ("（第12版）" + note, {"src": "minutes"}, first_at)
    assert other.delete_all(user_id="cjk53")["deleted"] == 1 and client.delete(current)["message"]
    client.client.close()
    other.client.close()
