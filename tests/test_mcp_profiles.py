"""The MCP server's tool profiles: `core` by default (one tool per job, under 500 tokens of the default
model's tokenizer), `full` on request; and answers a 4B model can act on.

In this process: the real MCP server (`build_server`) over the MCP SDK's in-memory client, against the real
service with the fake llama-server. The one test with the real tokenizer is the `model` tier.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from conftest import wait_status
from inprocess import InProcessService
from mcp import Client

from memory_service.cli.main import build_parser
from memory_service.client import AsyncMemoryClient, MemoryClient
from memory_service.contract.models import TeamOut
from memory_service.mcp_server.profiles import CORE_TOKEN_BUDGET, PROFILES, estimate_tokens, tool_list_text
from memory_service.mcp_server.server import Probe, build_server, probe
from memory_service.mcp_server.tools import TOOL_NAMES, Toolbox
from tests.fakes.fake_llama_server import FakeLlamaServer, count_tokens

CORE = ["remember", "recall", "consume_limit", "mark_handled"]
CORE_READ = ["recall", "check_limit", "was_handled"]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        svc = InProcessService(tmp_path_factory.mktemp("mcp-profiles") / "data", fake.url).start()
        yield svc
        svc.stop()


@asynccontextmanager
async def serving(url: str, key: str, profile: str = "core", read_only: bool = False) -> AsyncIterator[Client]:
    """The MCP server as `memory-service mcp --tools PROFILE` builds it, and a client connected to it."""
    async with AsyncMemoryClient(url, api_key=key) as memory:
        found = await probe(memory, url)
        toolbox = Toolbox(memory, url=url, agent_id="profile-tester")
        async with Client(build_server(toolbox, found, read_only=read_only, profile=profile)) as client:  # type: ignore[arg-type]
            yield client


async def listed(url: str, key: str, profile: str, read_only: bool = False) -> list[str]:
    async with serving(url, key, profile, read_only) as client:
        return [tool.name for tool in (await client.list_tools()).tools]


async def answer(client: Client, tool: str, /, **arguments: Any) -> tuple[bool, str]:
    result = await client.call_tool(tool, arguments)
    return bool(result.is_error), "\n".join(getattr(part, "text", "") for part in result.content)


def test_core_lists_one_tool_per_job_whatever_the_role(service: InProcessService) -> None:
    with service.client("key-a") as admin:
        keys = {role: admin.post("/v1/keys", json={"role": role}).json()["key"] for role in ("read", "write")}

    async def scenario() -> None:
        assert await listed(service.url, "key-a", "core") == CORE
        assert await listed(service.url, keys["write"], "core") == CORE
        assert await listed(service.url, keys["read"], "core") == CORE_READ
        assert await listed(service.url, "key-a", "core", read_only=True) == CORE_READ
        assert await listed(service.url, "key-a", "full") == list(TOOL_NAMES)
        assert await listed(service.url, keys["read"], "full") == ["recall", "get_memory", "check_limit", "was_handled"]

    anyio.run(scenario)


async def _tool_list(profile: str) -> str:
    """The tool list an admin key gets, as an agent hands it to its model (no service needed to list)."""
    team = TeamOut(team="t", role="admin", memories=0, agents=[], tags=[])
    async with AsyncMemoryClient("http://127.0.0.1:9") as memory:
        server = build_server(Toolbox(memory, url="http://127.0.0.1:9", agent_id="a"), Probe(team), profile=profile)  # type: ignore[arg-type]
        async with Client(server) as client:
            return tool_list_text((await client.list_tools()).tools)


def test_core_tool_list_fits_the_budget_by_the_over_counting_estimate() -> None:
    """The fast tier's guard: `estimate_tokens` over-counts the default tokenizer (the model test checks it)."""
    sizes = {profile: estimate_tokens(anyio.run(_tool_list, profile)) for profile in PROFILES}
    print(f"\nMCP tool lists, estimated tokens (over-counting): {sizes}")
    assert sizes["core"] <= CORE_TOKEN_BUDGET, f"the core tool list is about {sizes['core']} tokens"
    assert sizes["full"] > sizes["core"]


def test_tool_list_tokens_with_the_default_models_tokenizer(default_llama) -> None:
    """Small models pay for every token of the tool list in every prompt: count it with the model's own
    tokenizer, as the agent sends it (an OpenAI-style `tools` array)."""
    for profile in PROFILES:
        text = anyio.run(_tool_list, profile)
        tokens = len(httpx.post(f"{default_llama.url}/tokenize", json={"content": text}, timeout=30).json()["tokens"])
        print(f"\nMCP tool list, profile {profile}: {len(text)} bytes, {tokens} tokens (default model's tokenizer)")
        assert estimate_tokens(text) >= tokens, "the fast test's estimate must over-count"
        assert tokens <= (CORE_TOKEN_BUDGET if profile == "core" else 1500), f"{profile}: {tokens} tokens"


def test_profile_from_the_flag_or_MEMORY_MCP_TOOLS(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMORY_MCP_TOOLS", raising=False)
    assert build_parser().parse_args(["mcp"]).tools == "core"
    assert build_parser().parse_args(["mcp", "--tools", "full"]).tools == "full"
    monkeypatch.setenv("MEMORY_MCP_TOOLS", "full")
    assert build_parser().parse_args(["mcp"]).tools == "full"
    assert build_parser().parse_args(["mcp", "--tools", "core"]).tools == "core"
    monkeypatch.setenv("MEMORY_MCP_TOOLS", "everything")
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["mcp"])
    assert refused.value.code == 2


def test_core_answers_say_what_to_do_next_and_name_no_hidden_tool(service: InProcessService) -> None:
    """A denied consume says the limit is reached and when it resets; a recall filtered on a tag the team never
    used answers without it and says so; a repeat item says to skip it; an unknown limit says which exist."""
    with service.client("key-a") as admin:
        assert admin.put("/v1/limits/replies", json={"daily_limit": 1, "timezone": "UTC"}).status_code in (200, 201)
    hidden = set(TOOL_NAMES) - set(CORE)

    async def scenario() -> list[str]:
        async with serving(service.url, "key-a") as client:
            said = []
            schema = next(t for t in (await client.list_tools()).tools if t.name == "consume_limit").input_schema
            assert "amount" not in schema["properties"], schema  # not shown in core, still accepted
            failed, text = await answer(client, "consume_limit", name="replies", amount=1)
            assert not failed and text.startswith("ALLOWED") and "0 of 1 left" in text, text
            said.append(text)
            failed, text = await answer(client, "consume_limit", name="replies")
            assert not failed and text.startswith("DENIED") and "reached" in text and "resets at" in text, text
            assert "Do not" in text, text
            said.append(text)
            failed, text = await answer(client, "consume_limit", name="replys")
            assert failed and "No limit named 'replys'" in text and "replies" in text, text
            said.append(text)
            failed, text = await answer(client, "mark_handled", key="ticket-88")
            assert not failed and "Go ahead" in text, text
            failed, text = await answer(client, "mark_handled", key="ticket-88")
            assert not failed and "already handled" in text and "Skip it" in text, text
            said.append(text)
            failed, text = await answer(client, "remember", text="The office wifi password is in the blue binder.")
            assert not failed, text
            failed, text = await answer(client, "recall", query="wifi password", max_tokens=5)
            assert failed and "max_tokens=5 is not allowed" in text and "from 64 to 4000" in text, text
            said.append(text)
            failed, text = await answer(client, "recall", query="wifi password", tags=["nothing-tagged-so"])
            assert not failed and "tag 'nothing-tagged-so'" in text and "searched without it" in text, text
            assert "blue binder" in text, text  # a guessed tag is dropped: the team's answer comes back
            said.append(text)
            return said

    for text in anyio.run(scenario):
        assert len(text) <= 600, f"a long answer for a small model: {text!r}"
        for name in hidden:
            assert not re.search(rf"\b{name}\b", text), f"hidden tool {name!r} named in {text!r}"


def test_recall_answers_the_services_context_within_max_tokens(service: InProcessService) -> None:
    """The recall tool pastes /v1/recall's `context` (dated, attributed lines within max_tokens); ids only in
    `full`, where a tool takes one; a match longer than the budget says to ask for more, not that nothing
    matched."""
    notes = [f"Deploy {n} of the billing service went out on host web-{n} without errors." for n in range(1, 6)]
    long_note = "Kiln controller valve map: " + "-".join(f"v{n}" for n in range(400))  # no short sentence in it

    async def save() -> list[str]:
        async with serving(service.url, "key-a") as client:
            said = [await answer(client, "remember", text=text, tags=["deploys"]) for text in notes]
            said.append(await answer(client, "remember", text=long_note, tags=["kiln"]))
        assert not any(failed for failed, _ in said), said
        return [re.search(r"mem_[0-9a-f]+", text).group(0) for _, text in said]  # type: ignore[union-attr]

    async def recall() -> tuple[str, str, str]:
        async with serving(service.url, "key-a") as client:
            failed, core = await answer(client, "recall", query="billing service deploy", max_tokens=120)
            assert not failed, core
            failed, too_long = await answer(client, "recall", query="kiln valve map", tags=["kiln"], max_tokens=64)
            assert not failed, too_long
        async with serving(service.url, "key-a", "full") as client:
            failed, full = await answer(client, "recall", query="billing service deploy", max_tokens=120)
            assert not failed, full
        return core, too_long, full

    saved = anyio.run(save)
    with service.client("key-a") as http:
        for memory_id in saved:  # extraction settled: the same items answer both recalls
            wait_status(http, memory_id)
        core, too_long, full = anyio.run(recall)
    with MemoryClient(service.url, api_key="key-a") as memory:  # the same recall without a budget
        unbudgeted = memory.recall("billing service deploy").context.splitlines()
    head, *lines = core.splitlines()
    assert head.startswith(f"{len(lines)} result(s)") and set(lines) <= set(unbudgeted), (core, unbudgeted)
    # the service counted by the fake's /tokenize or by its estimate, which over-counts the fake's: within both
    assert count_tokens("\n".join(lines)) <= 120, core
    assert all(re.match(r"\[\d{4}-\d{2}-\d{2} profile-tester\] ", line) for line in lines), core
    assert "Deploy" in core and 1 <= len(lines) < len(unbudgeted), "120 tokens hold some of the lines, not all"
    assert "mem_" not in core
    assert all(re.search(r"\(memory_id mem_[0-9a-f]+\)$", line) for line in full.splitlines()[1:]), full
    assert "longer than max_tokens=64" in too_long and "larger max_tokens" in too_long, too_long
