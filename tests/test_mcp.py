"""`memory-service mcp` with the MCP SDK's own client, over stdio and streamable HTTP, against a real service
(in this process: the real app and workers, Chroma, SQLite and embedder, with the fake llama-server).

The MCP server itself is always a subprocess (`python -m memory_service mcp`): those tests are the `process` tier.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from conftest import ROOT
from inprocess import InProcessService
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from memory_service.contract import limits as contract_limits
from memory_service.contract import models as api_models
from memory_service.llm.runtime.server import free_port
from memory_service.mcp_server.profiles import PROFILES
from memory_service.mcp_server.tools import TOOL_NAMES, TOOLS
from tests.fakes.fake_llama_server import FakeLlamaServer

READ_TOOLS = {
    "full": tuple(spec.name for spec in TOOLS if not spec.writes),
    "core": ("recall", "check_limit", "was_handled"),
}
CORE = ("remember", "recall", "consume_limit", "mark_handled")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        svc = InProcessService(tmp_path_factory.mktemp("mcp") / "data", fake.url).start()
        yield svc
        svc.stop()


def _env(url: str, key: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}
    env.update({"MEMORY_URL": url, "MEMORY_AGENT_ID": "mcp-tester", "MEMORY_LOG_LEVEL": "WARNING", **extra})
    if key:
        env["MEMORY_API_KEY"] = key
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return env


def stdio(url: str, key: str | None = "key-a", *args: str, **extra: str) -> Client:
    """The harness's view: it spawns `python -m memory_service mcp` and talks over its stdin/stdout."""
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "memory_service", "mcp", *args], env=_env(url, key, **extra), cwd=str(ROOT)
    )
    return Client(params)


def text_of(result: Any) -> str:
    return "\n".join(part.text for part in result.content if getattr(part, "text", None))


async def call(client: Client, tool: str, /, **arguments: Any) -> tuple[bool, str]:
    """(is_error, text) of one tool call."""
    result = await client.call_tool(tool, arguments)
    return bool(result.is_error), text_of(result)


def run(fn: Any, *args: Any) -> Any:
    return anyio.run(fn, *args)


# ---------------------------------------------------------------- what the MCP server loads

PURITY_PROBE = (
    "import sys, memory_service.mcp_server.server, memory_service.mcp_server.http_access, "
    "memory_service.api.http_guard; "
    "print(sorted({m.split('.')[0] if not m.startswith('memory_service.') else '.'.join(m.split('.')[:2]) "
    "for m in sys.modules}))"
)


@pytest.mark.process  # a fresh interpreter: this one has the server loaded
def test_importing_the_mcp_server_loads_no_store_and_no_service() -> None:
    """The MCP server is a client of the HTTP API (issue 45): a harness that spawns it pays for no key store,
    SQLite-backed store, PostgreSQL driver or Chroma, nor FastAPI. The HTTP transport's guards are imported too."""
    out = subprocess.run([sys.executable, "-c", PURITY_PROBE], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(out.stdout.strip()))
    forbidden = {"memory_service.storage", "memory_service.services", "psycopg", "chromadb", "sqlite3", "fastapi"}
    assert loaded & forbidden == set(), out.stderr
    assert {"memory_service.contract", "memory_service.client", "mcp"} <= loaded  # the probe sees what it should


# ---------------------------------------------------------------- the round trip, both transports


async def _round_trip(client: Client, marker: str) -> None:
    """Over the full profile (`--tools full`): every tool that takes a memory id."""
    tools = await client.list_tools()
    assert [t.name for t in tools.tools] == list(TOOL_NAMES)
    failed, saved = await call(
        client, "remember", text=f"Invoice {marker} was paid by Acme Corp on Monday.", tags=["billing"]
    )
    assert not failed, saved
    memory_id = re.search(r"mem_[0-9a-f]+", saved).group(0)
    failed, found = await call(client, "recall", query=f"invoice {marker}")
    assert not failed and memory_id in found and marker in found, found
    failed, shown = await call(client, "get_memory", memory_id=memory_id)
    assert not failed and marker in shown and "mcp-tester" in shown, shown
    failed, gone = await call(client, "forget", memory_id=memory_id)
    assert not failed and memory_id in gone, gone
    failed, stale = await call(client, "get_memory", memory_id=memory_id)
    assert failed and "No memory with id" in stale and "recall" in stale, stale
    failed, after = await call(client, "recall", query=f"invoice {marker}")
    assert not failed and memory_id not in after, after


@pytest.mark.process  # the MCP server, spawned as a harness does
def test_stdio_lists_tools_and_remembers_recalls_gets_forgets(service: InProcessService) -> None:
    async def scenario() -> None:
        async with stdio(service.url) as client:  # the default: the core profile
            assert "recall" in (client.instructions or "")
            assert [t.name for t in (await client.list_tools()).tools] == list(CORE)
            failed, saved = await call(client, "remember", text="Invoice INV-7730 was paid by Acme Corp.")
            assert not failed, saved
            failed, found = await call(client, "recall", query="invoice INV-7730")
            assert not failed and "INV-7730" in found, found
        async with stdio(service.url, "key-a", "--tools", "full") as client:
            await _round_trip(client, "INV-7731")

    run(scenario)


@pytest.mark.process  # the MCP server, spawned as a harness does
def test_streamable_http_round_trip(service: InProcessService, tmp_path) -> None:
    port = free_port()
    log = open(tmp_path / "mcp-http.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "memory_service", "mcp", "--transport", "http", "--port", str(port)],
        env=_env(service.url, "key-a", MEMORY_MCP_TOOLS="full"),
        cwd=str(ROOT),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "mcp-http.log").read_text()
                time.sleep(0.2)

        async def scenario() -> None:
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                await _round_trip(client, "INV-8842")

        run(scenario)
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


# ---------------------------------------------------------------- stale ids and empty answers


@pytest.mark.process  # the MCP server, spawned as a harness does
def test_stale_ids_and_unknown_limits_are_tool_errors_that_say_what_exists(service: InProcessService) -> None:
    with service.client("key-b") as http:  # team-b: its own limits, invisible to team-a
        for name in ("emails", "posts"):
            assert http.put(f"/v1/limits/{name}", json={"daily_limit": 1, "timezone": "UTC"}).status_code in (200, 201)

    async def scenario() -> None:
        async with stdio(service.url, "key-b", "--tools", "full") as client:
            failed, text = await call(client, "consume_limit", name="emial")
            assert failed and "No limit named 'emial'" in text and "emails, posts" in text, text
            failed, text = await call(client, "check_limit", name="tweets")
            assert failed and "emails, posts" in text, text
            failed, text = await call(client, "consume_limit", name="emails")
            assert not failed and text.startswith("ALLOWED"), text
            failed, text = await call(client, "consume_limit", name="emails")
            assert not failed and text.startswith("DENIED"), text
            failed, text = await call(client, "forget", memory_id="mem_0000deadbeef")
            assert failed and "No memory with id 'mem_0000deadbeef'" in text, text
            failed, text = await call(client, "get_memory", memory_id="not an id at all")
            assert failed and "No memory with id" in text, text
            # the session survived every error
            assert len((await client.list_tools()).tools) == len(TOOL_NAMES)
            failed, text = await call(client, "mark_handled", key="msg-1187")
            assert not failed and "Marked" in text, text
            failed, text = await call(client, "mark_handled", key="msg-1187")
            assert not failed and "already handled" in text, text
            failed, text = await call(client, "was_handled", key="msg-0001")
            assert not failed and "not handled" in text, text

        async with stdio(service.url, "key-a", "--tools", "full") as client:  # none of team-b's limits or keys
            failed, text = await call(client, "consume_limit", name="emails")
            assert failed and "no daily limits yet" in text and "posts" not in text, text
            failed, text = await call(client, "was_handled", key="msg-1187")
            assert not failed and "not handled" in text, text

    run(scenario)


@pytest.mark.process  # the MCP server, spawned as a harness does
def test_empty_recall_says_memory_works_and_what_to_filter_on(service: InProcessService, tmp_path) -> None:
    async def scenario() -> None:
        empty = InProcessService(tmp_path / "empty", service.env["MEMORY_LLM_URL"]).start()
        try:
            async with stdio(empty.url) as client:
                failed, text = await call(client, "recall", query="anything at all")
                assert not failed and "empty so far" in text, text
        finally:
            empty.stop()
        with service.client("key-a") as http:  # another agent of the team, with its own tag
            body = {"text": "Rotated the backup keys.", "agent_id": "ops-b", "tags": ["ops"]}
            assert http.post("/v1/remember", json=body).status_code == 202
        async with stdio(service.url) as client:
            failed, saved = await call(
                client, "remember", text="The staging database moved to host db-7.", tags=["infra"]
            )
            assert not failed, saved
            # an agent id the team never used is a guess: dropped, said in one line, the team's answer comes back
            failed, text = await call(client, "recall", query="staging database", agent_id="nobody-here")
            assert not failed and text.startswith("No agent 'nobody-here'") and "mcp-tester" in text, text
            assert "db-7" in text, text
            # known filters that match nothing together: the answer says memory works and what to filter on
            failed, text = await call(client, "recall", query="staging database", agent_id="ops-b", tags=["infra"])
            assert not failed
            assert "memory is working" in text and "agent_id='ops-b'" in text, text
            assert "mcp-tester" in text and "infra" in text, text

    run(scenario)


# ---------------------------------------------------------------- tools that can't work are not listed


@pytest.mark.process  # the MCP server, spawned as a harness does
def test_unreachable_service_lists_no_tools_and_says_why(tmp_path) -> None:
    async def scenario() -> None:
        async with stdio(f"http://127.0.0.1:{free_port()}") as client:
            assert (await client.list_tools()).tools == []
            assert "unreachable" in client.instructions and "No tools" in client.instructions

    run(scenario)


@pytest.mark.process  # the MCP server, spawned as a harness does
def test_refused_key_lists_no_tools_and_names_the_setting(service: InProcessService) -> None:
    async def scenario() -> None:
        async with stdio(service.url, "not-a-key") as client:
            assert (await client.list_tools()).tools == []
            assert "MEMORY_API_KEY" in client.instructions

    run(scenario)


@pytest.mark.process  # the MCP server, spawned as a harness does
@pytest.mark.parametrize("profile", PROFILES)
def test_read_only_hides_every_tool_that_writes(service: InProcessService, profile: str) -> None:
    async def scenario() -> None:
        async with stdio(service.url, "key-a", "--read-only", "--tools", profile) as client:
            assert tuple(t.name for t in (await client.list_tools()).tools) == READ_TOOLS[profile]
            failed, text = await call(client, "remember", text="should not be saved")
            assert failed, text
            assert "only read" in client.instructions

    run(scenario)


@pytest.mark.process  # the MCP server, spawned as a harness does
def test_tools_follow_the_keys_role(service: InProcessService) -> None:
    with service.client("key-a") as admin:
        keys = {role: admin.post("/v1/keys", json={"role": role}).json()["key"] for role in ("read", "write")}

    async def scenario() -> None:
        async with stdio(service.url, keys["read"], "--tools", "full") as client:
            assert tuple(t.name for t in (await client.list_tools()).tools) == READ_TOOLS["full"]
        async with stdio(service.url, keys["read"]) as client:
            assert tuple(t.name for t in (await client.list_tools()).tools) == READ_TOOLS["core"]
        async with stdio(service.url, keys["write"]) as client:
            assert [t.name for t in (await client.list_tools()).tools] == list(CORE)
        async with stdio(service.url, keys["write"], "--tools", "full") as client:
            assert [t.name for t in (await client.list_tools()).tools] == [n for n in TOOL_NAMES if n != "forget"]
            failed, text = await call(client, "remember", text="Written with a write key.")
            assert not failed, text

    run(scenario)


# ---------------------------------------------------------------- the sweep


def _api_field_names() -> set[str]:
    names: set[str] = set()
    for module in (api_models, contract_limits):
        for value in vars(module).values():
            if isinstance(value, type) and hasattr(value, "model_fields"):
                names |= set(value.model_fields)
    return names


async def _everything_the_model_reads(client: Client) -> tuple[list[str], set[str], set[str]]:
    """Texts (instructions, descriptions, schemas, answers to bad calls), visible tools, argument names."""
    tools = (await client.list_tools()).tools
    visible = {t.name for t in tools}
    arguments = {name for t in tools for name in t.input_schema.get("properties", {})}
    texts = [client.instructions or ""]
    texts += [f"{t.description}\n{json.dumps(t.input_schema)}" for t in tools]
    probes = {
        "recall": {"query": "zz-nothing-matches-this-qq", "agent_id": "nobody"},
        "get_memory": {"memory_id": "mem_00000000"},
        "forget": {"memory_id": "mem_00000000"},
        "consume_limit": {"name": "no-such-limit"},
        "check_limit": {"name": "no-such-limit"},
        "was_handled": {"key": "never-seen"},
        "remember": {"text": "   "},
    }
    for name, arguments_ in probes.items():
        if name in visible:
            texts.append(text_of(await client.call_tool(name, arguments_)))
    return texts, visible, arguments


@pytest.mark.process  # the MCP server, spawned as a harness does
@pytest.mark.parametrize("profile", PROFILES)
def test_every_tool_name_the_model_reads_is_a_tool_it_can_see(service: InProcessService, profile: str) -> None:
    """Instructions, descriptions, argument docs and error messages may name only visible tools, in each
    profile."""
    fields = _api_field_names()

    async def sweep(client: Client) -> None:
        texts, visible, arguments = await _everything_the_model_reads(client)
        allowed = visible | arguments | fields
        for text in texts:
            # snake_case words of letters only: tool names; ids such as mem_3f2a9c are data, not names
            for word in re.findall(r"\b[a-z]+(?:_[a-z]+)+\b", text):
                assert word in allowed, f"{word!r} is not a visible tool (visible: {sorted(visible)}): {text!r}"
            for hidden in set(TOOL_NAMES) - visible:
                assert not re.search(rf"\b{hidden}\b", text, re.I), f"hidden tool {hidden!r} named in {text!r}"

    with service.client("key-a") as admin:
        writer = admin.post("/v1/keys", json={"role": "write"}).json()["key"]

    async def scenario() -> None:
        for key, args in (("key-a", ()), ("key-a", ("--read-only",)), (writer, ())):
            async with stdio(service.url, key, *args, "--tools", profile) as client:
                await sweep(client)
        async with stdio(f"http://127.0.0.1:{free_port()}", "key-a", "--tools", profile) as client:
            await sweep(client)

    run(scenario)


def test_team_view_counts_only_the_callers_team(service: InProcessService) -> None:
    """/v1/team (what the MCP server probes) is team-scoped: another team's agents, tags and counts never show."""
    with service.client("key-a") as a, service.client("key-b") as b:
        before_b = b.get("/v1/team").json()
        assert (
            a.post(
                "/v1/remember",
                json={"text": "Rotated the TLS certificate.", "agent_id": "ops-a", "tags": ["secret-tag-a"]},
            ).status_code
            == 202
        )
        mine, theirs = a.get("/v1/team").json(), b.get("/v1/team").json()
    assert mine["team"] == "team-a" and theirs["team"] == "team-b" and mine["role"] == "admin"
    assert "ops-a" in [x["agent_id"] for x in mine["agents"]] and "secret-tag-a" in [x["tag"] for x in mine["tags"]]
    assert theirs == before_b
    assert "ops-a" not in json.dumps(theirs) and "secret-tag-a" not in json.dumps(theirs)
