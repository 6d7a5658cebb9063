"""Hostile ids (issue 31): an id, limit name or key id that a caller (or a prompt-injected model) hands over is
one path segment, never a path.

The review's finding: `MemoryClient(url, key).forget("../limits/burst")` deleted the limit `burst`: the client
put ids into URL paths unescaped, and httpx resolves `..`. Each test plants a limit, a key and two memories
of one agent in the real service (in this process, over loopback HTTP), aims every client method and MCP tool
that puts a value into a path at them, and then checks that all of them are still there, unchanged.
"""

from __future__ import annotations

import asyncio
import http.client
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from inprocess import InProcessService
from mcp import Client

from memory_service.client import AsyncMemoryClient, MemoryClient, MemoryServiceError
from memory_service.mcp_server.server import build_server, probe
from memory_service.mcp_server.tools import Toolbox
from tests.fakes.fake_llama_server import FakeLlamaServer


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        svc = InProcessService(tmp_path_factory.mktemp("hostile") / "data", fake.url).start()
        yield svc
        svc.stop()


@dataclass(frozen=True)
class Targets:
    """What an attacker would like to delete, change or read through a crafted id."""

    limit: str
    key_id: str
    memory_id: str
    agent: str


def plant(service: InProcessService) -> Targets:
    marker = uuid.uuid4().hex[:8]
    limit, agent = f"burst-{marker}", f"victim-{marker}"
    with service.client("key-a") as http:
        assert http.put(f"/v1/limits/{limit}", json={"daily_limit": 5, "timezone": "UTC"}).status_code == 201
        key = http.post("/v1/keys", json={"role": "read", "label": "victim"})
        assert key.status_code == 201, key.text
        ids = []
        for n in range(2):
            saved = http.post("/v1/remember", json={"text": f"Victim note {n} {marker}.", "agent_id": agent})
            assert saved.status_code == 202, saved.text
            ids.append(saved.json()["id"])
    return Targets(limit, key.json()["id"], ids[0], agent)


def assert_intact(service: InProcessService, t: Targets) -> None:
    with service.client("key-a") as http:
        view = http.get(f"/v1/limits/{t.limit}")
        assert view.status_code == 200, f"the limit is gone: {view.text}"
        assert (view.json()["daily_limit"], view.json()["used"]) == (5, 0), view.json()
        keys = {k["id"]: k for k in http.get("/v1/keys").json()}
        assert t.key_id in keys and keys[t.key_id]["revoked_at"] is None, "the key was revoked"
        assert http.get(f"/v1/memories/{t.memory_id}").status_code == 200, "the memory is gone"
        assert len(http.get("/v1/memories", params={"agent_id": t.agent}).json()["items"]) == 2


def hostile(t: Targets) -> list[str]:
    """Ids that climb out of their segment (plain, percent-encoded, mixed), or smuggle a query or fragment."""
    return [
        f"../limits/{t.limit}",
        f"..%2Flimits%2F{t.limit}",
        f"%2e%2e/limits/{t.limit}",
        f"%2E%2E%2Flimits%2F{t.limit}",
        f"%252e%252e%252flimits%252f{t.limit}",
        f"a/../../v1/keys/{t.key_id}",
        f"../keys/{t.key_id}",
        f"../memories/{t.memory_id}",
        f"../memories?agent_id={t.agent}&confirm=true",
        f"x/../{t.limit}",
        f"x%2F..%2F{t.limit}",
        f"{t.memory_id}/../../limits/{t.limit}",
        "..",
        ".",
        "",
        "%2e%2e",
        ".%2E",
        f"{t.limit}?daily_limit=999",
        f"{t.limit}#frag",
        f"{t.memory_id}?x=1",
        f"{t.memory_id}#frag",
    ]


CLIENT_CALLS: dict[str, Callable[[Any, str], Any]] = {
    "get": lambda m, v: m.get(v),
    "forget": lambda m, v: m.forget(v),
    "limits.set": lambda m, v: m.limits.set(v, daily_limit=999),
    "limits.get": lambda m, v: m.limits.get(v),
    "limits.consume": lambda m, v: m.limits.consume(v, agent_id="attacker", amount=1),
    "limits.delete": lambda m, v: m.limits.delete(v),
}


def refused(exc: BaseException | None, value: str) -> str | None:
    """None when the call failed clearly: a ValueError naming the value, or the service's 4xx."""
    if isinstance(exc, ValueError) and repr(value) in str(exc):
        return None
    if isinstance(exc, MemoryServiceError) and 400 <= exc.status < 500:
        return None
    return f"not refused: {type(exc).__name__}: {str(exc)[:90]!r}" if exc else "succeeded"


def test_the_sync_client_sends_every_id_as_one_segment(service: InProcessService) -> None:
    t = plant(service)
    failures = []
    with MemoryClient(service.url, api_key="key-a", retry_budget_s=1) as memory:
        for name, call in CLIENT_CALLS.items():
            for value in hostile(t):
                try:
                    call(memory, value)
                    problem = refused(None, value)
                except (ValueError, MemoryServiceError) as exc:
                    problem = refused(exc, value)
                if problem:
                    failures.append(f"{name}({value!r}): {problem}")
    assert not failures, "\n".join(failures)
    assert_intact(service, t)


def test_the_async_client_sends_every_id_as_one_segment(service: InProcessService) -> None:
    t = plant(service)
    failures = []

    async def scenario() -> None:
        async with AsyncMemoryClient(service.url, api_key="key-a", retry_budget_s=1) as memory:
            for name, call in CLIENT_CALLS.items():
                for value in hostile(t):
                    try:
                        await call(memory, value)
                        problem = refused(None, value)
                    except (ValueError, MemoryServiceError) as exc:
                        problem = refused(exc, value)
                    if problem:
                        failures.append(f"{name}({value!r}): {problem}")

    asyncio.run(scenario())
    assert not failures, "\n".join(failures)
    assert_intact(service, t)


def test_a_dot_segment_is_refused_before_anything_is_sent(service: InProcessService) -> None:
    """`..` (even as %2e%2e, which a proxy may decode) is refused by the client itself, with the value named."""
    sent: list[httpx.Request] = []
    transport = httpx.HTTPTransport()

    class Recording(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            sent.append(request)
            return transport.handle_request(request)

    with MemoryClient(service.url, api_key="key-a", transport=Recording()) as memory:
        for value in ("..", ".", "", "%2e%2e", "a/../b", "..%2Fkeys", "%252E%252E"):
            with pytest.raises(ValueError, match="path segment") as exc:
                memory.limits.delete(value)
            assert repr(value) in str(exc.value)
        # what is left of a hostile value is sent percent-encoded, as one segment
        with pytest.raises(MemoryServiceError) as exc:
            memory.get("mem_x?y#z/w%")
        assert exc.value.status == 404
    assert [r.url.raw_path for r in sent] == [b"/v1/memories/mem_x%3Fy%23z%2Fw%25"]


def test_the_server_treats_an_encoded_slash_or_dot_as_part_of_one_segment(service: InProcessService) -> None:
    """Raw requests (http.client normalizes nothing): a decoded %2F or %2e%2e reaches no other route."""
    t = plant(service)
    paths = [
        f"/v1/memories/../limits/{t.limit}",
        f"/v1/memories/..%2Flimits%2F{t.limit}",
        f"/v1/memories/%2e%2e/limits/{t.limit}",
        f"/v1/memories/%2e%2e%2flimits%2f{t.limit}",
        f"/v1/memories/%2E%2E/keys/{t.key_id}",
        f"/v1/limits/x%2F..%2F{t.limit}",
        f"/v1/limits/%2e%2e%2f{t.limit}",
        "/v1/limits/%2e%2e",
        f"/v1/keys/..%2Fkeys%2F{t.key_id}",
        f"/v1/keys/%2e%2e/keys/{t.key_id}",
        f"/v1/memories/%2e%2e?agent_id={t.agent}&confirm=true",
    ]
    statuses = {}
    for path in paths:
        connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
        try:
            connection.request("DELETE", path, headers={"Authorization": "Bearer key-a"})
            statuses[path] = connection.getresponse().status
        finally:
            connection.close()
    assert all(400 <= s < 500 for s in statuses.values()), statuses
    assert_intact(service, t)


def test_mcp_tools_refuse_a_hostile_id_before_any_http_call(service: InProcessService) -> None:
    """The real MCP server (in process) over the real service: the schema refuses, the model reads why."""
    t = plant(service)
    sent: list[httpx.Request] = []
    inner = httpx.AsyncHTTPTransport()

    class Recording(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            sent.append(request)
            return await inner.handle_async_request(request)

    failures = []

    async def scenario() -> None:
        async with AsyncMemoryClient(service.url, api_key="key-a", transport=Recording()) as memory:
            found = await probe(memory, service.url)
            toolbox = Toolbox(memory, url=service.url, agent_id="mcp-attacker")
            server = build_server(toolbox, found, profile="full")  # every tool that takes an id or a name
            async with Client(server) as client:
                schemas = {tool.name: tool.input_schema for tool in (await client.list_tools()).tools}
                for tool, argument in (
                    ("forget", "memory_id"),
                    ("get_memory", "memory_id"),
                    ("consume_limit", "name"),
                    ("check_limit", "name"),
                ):
                    schema = schemas[tool]["properties"][argument]
                    if "pattern" not in schema or "maxLength" not in schema:
                        failures.append(f"{tool}.{argument} schema has no pattern/maxLength: {schema}")
                    for value in hostile(t):
                        before = len(sent)
                        result = await client.call_tool(tool, {argument: value})
                        text = "\n".join(getattr(part, "text", "") for part in result.content)
                        if not result.is_error or len(sent) != before or argument not in text:
                            failures.append(f"{tool}({value!r}): error={result.is_error} sent={len(sent) - before}")
                # a handled key is data (a JSON body, a query parameter), never a path: kept as given
                result = await client.call_tool("mark_handled", {"key": f"../limits/{t.limit}"})
                assert not result.is_error, result

    asyncio.run(scenario())
    assert not failures, "\n".join(failures)
    assert_intact(service, t)


def test_the_cli_refuses_a_path_climbing_id_as_a_usage_error(service: InProcessService) -> None:
    """`memory-service forget ../limits/burst` (or `get`, `limits set/consume/show`) is a usage error (exit 2)
    before anything is sent, not a deleted limit."""
    from memory_service.cli.main import main

    t = plant(service)
    client = ["--url", service.url, "--api-key", "key-a"]
    for bad in hostile(t)[:4] + ["..", "."]:
        for argv in (
            ["forget", bad, *client],
            ["get", bad, *client],
            ["limits", "set", bad, "--daily-limit", "999", "--timezone", "UTC", *client],
            ["limits", "consume", bad, "--agent-id", t.agent, *client],
        ):
            with pytest.raises(SystemExit) as refused:
                main(argv)
            assert refused.value.code == 2, argv
    assert_intact(service, t)
    assert main(["get", t.memory_id, *client]) == 0  # a real id still works
