"""The MCP surface fits what small models send (issue 41): nothing in the instructions can be copied into an
argument, core shows only the arguments a small model needs, a guessed filter still gets the team's answer
(with one line saying it was dropped), and a bad argument answers one sentence, not pydantic's report.

In this process: the real MCP server (`build_server`) over the MCP SDK's in-memory client, against the real
service (app, workers, Chroma, SQLite, embedder) with the fake llama-server.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from conftest import wait_status
from inprocess import KEYS, InProcessService
from mcp import Client

from memory_service.client import AsyncMemoryClient
from memory_service.mcp_server.recall_filters import TEAM_VIEW_MAX
from memory_service.mcp_server.server import build_server, probe
from memory_service.mcp_server.tools import Toolbox
from tests.fakes.fake_llama_server import FakeLlamaServer

MCP_AGENT = "mcp-small-agent"
PYDANTIC = ("pydantic", "validation error", "errors.pydantic.dev", "Input should be", "Field required")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        svc = InProcessService(tmp_path_factory.mktemp("mcp-small") / "data", fake.url).start()
        yield svc
        svc.stop()


@pytest.fixture(scope="module")
def saved(service: InProcessService) -> None:
    """Team A: two agents' saves with their tags; team B: its own agent and tag, which A must never see."""
    texts = (
        ("key-a", "mailer-1", ["digest"], "Sent the weekly digest to 40 subscribers on Monday."),
        ("key-a", "triage-2", ["tickets"], "Ticket T-1042 about the broken login page was answered."),
        ("key-b", "secret-agent-b", ["secret-tag-b"], "Team B sent the weekly digest to its own list."),
    )
    for key, agent, tags, text in texts:
        with service.client(key) as http:
            answer = http.post("/v1/remember", json={"text": text, "agent_id": agent, "tags": tags})
            assert answer.status_code == 202, answer.text
            wait_status(http, answer.json()["id"])


@asynccontextmanager
async def serving(url: str, key: str = "key-a", profile: str = "core") -> AsyncIterator[Client]:
    async with AsyncMemoryClient(url, api_key=key) as memory:
        found = await probe(memory, url)
        toolbox = Toolbox(memory, url=url, agent_id=MCP_AGENT)
        async with Client(build_server(toolbox, found, profile=profile)) as client:  # type: ignore[arg-type]
            yield client


async def answer(client: Client, tool: str, arguments: dict[str, Any]) -> tuple[bool, str]:
    result = await client.call_tool(tool, arguments)
    return bool(result.is_error), "\n".join(getattr(part, "text", "") for part in result.content)


def test_instructions_hold_no_value_a_model_could_copy_and_core_shows_only_needed_arguments(
    service: InProcessService, saved: None
) -> None:
    async def scenario() -> tuple[str, dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        async with serving(service.url) as client:
            core = {t.name: t.input_schema for t in (await client.list_tools()).tools}
            instructions = client.instructions or ""
        async with serving(service.url, profile="full") as client:
            full = {t.name: t.input_schema for t in (await client.list_tools()).tools}
        return instructions, core, full

    instructions, core, full = anyio.run(scenario)
    assert "recall" in instructions and "remember" in instructions, instructions
    for value in (KEYS["key-a"], MCP_AGENT, "mailer-1", "digest"):
        assert value not in instructions, f"{value!r} could be copied into an argument: {instructions!r}"
    assert not any(ch.isdigit() for ch in instructions), instructions  # no count either
    shown = {tool: sorted(schema["properties"]) for tool, schema in core.items()}
    assert shown == {"recall": ["query"], "remember": ["text"], "consume_limit": ["name"], "mark_handled": ["key"]}
    assert {"agent_id", "tags", "max_tokens"} <= set(full["recall"]["properties"]), full["recall"]
    assert "tags" in full["remember"]["properties"], full["remember"]


@pytest.mark.parametrize("profile", ["core", "full"])
def test_a_guessed_agent_id_or_tag_still_returns_the_teams_answer_with_a_note(
    service: InProcessService, saved: None, profile: str
) -> None:
    """`agent_id="default"`, the team's name, or a tag the team never used: the filter is dropped with one line
    naming the team's own agents or tags (never another team's), and the team's answer comes back."""

    async def scenario() -> dict[str, tuple[bool, str]]:
        async with serving(service.url, profile=profile) as client:
            calls = {
                "default": {"query": "weekly digest sent", "agent_id": "default"},
                "team name": {"query": "weekly digest sent", "agent_id": KEYS["key-a"]},
                "tag": {"query": "weekly digest sent", "tags": ["newsletter"]},
                "both": {"query": "weekly digest sent", "agent_id": "default", "tags": ["newsletter", "digest"]},
                "known": {"query": "weekly digest sent", "agent_id": "triage-2", "tags": ["digest"]},
            }
            return {name: await answer(client, "recall", arguments) for name, arguments in calls.items()}

    said = anyio.run(scenario)
    assert not any(failed for failed, _ in said.values()), said
    for name in ("default", "team name", "both"):
        text = said[name][1]
        guessed = "default" if name != "team name" else KEYS["key-a"]
        first, *rest = text.splitlines()
        assert first.startswith(f"No agent {guessed!r} has saved anything") and "searched all agents" in first, text
        assert "mailer-1" in first and "triage-2" in first, text
        assert "weekly digest to 40 subscribers" in "\n".join(rest), text
    tag_note, *rest = said["tag"][1].splitlines()
    assert "tag 'newsletter'" in tag_note and "searched without it" in tag_note and "digest" in tag_note, tag_note
    assert "weekly digest to 40 subscribers" in "\n".join(rest), said["tag"]
    assert "'newsletter'" in said["both"][1] and "'digest'" not in said["both"][1].splitlines()[0]
    # known filters that match nothing together: today's empty answer, which says what to filter on
    known = said["known"][1]
    assert "No agent" not in known and "memory is working" in known and "without the filter" in known, known
    for _, text in said.values():  # team isolation: team B's agent, tag and text never show to team A
        assert "secret-agent-b" not in text and "secret-tag-b" not in text and "Team B" not in text, text


BAD_CALLS: list[tuple[str, dict[str, Any], str]] = [
    ("recall", {}, "query"),
    ("recall", {"query": None}, "query"),
    ("recall", {"query": 42}, "query"),
    ("recall", {"query": ["weekly", "digest"]}, "query"),
    ("recall", {"query": "digest", "tags": "digest"}, "tags"),
    ("recall", {"query": "digest", "tags": [7]}, "tags"),
    ("recall", {"query": "digest", "tags": [f"t{n}" for n in range(40)]}, "tags"),  # past the service's 32
    ("remember", {"text": "Sent the digest.", "tags": ["label " * 20]}, "tags"),  # past its 64 characters
    ("recall", {"query": "digest", "max_tokens": "ten"}, "max_tokens"),
    ("recall", {"query": "digest", "max_tokens": 5}, "max_tokens"),
    ("recall", {"query": "digest", "agent_id": "../limits/x"}, "agent_id"),
    ("recall", {"query": "weekly digest " * 400}, "query"),  # past the service's 4096 characters
    ("recall", {"query": ""}, "query"),
    ("recall", {"query": "   "}, "query"),
    ("remember", {}, "text"),
    ("remember", {"text": " "}, "text"),
    ("remember", {"text": "x" * 70_000}, "text"),  # past MEMORY_MAX_TEXT_BYTES: the service's 413
    ("remember", {"text": {"note": "sent"}}, "text"),
    ("consume_limit", {"name": 7}, "name"),
    ("consume_limit", {"name": "emails", "amount": "many"}, "amount"),
    ("mark_handled", {"key": ""}, "key"),
    ("mark_handled", {"key": "   "}, "key"),
    ("mark_handled", {"item": "msg-1"}, "key"),
]


@pytest.mark.parametrize("profile", ["core", "full"])
def test_a_bad_argument_answers_one_sentence_naming_it_not_pydantic_text(
    service: InProcessService, saved: None, profile: str
) -> None:
    async def scenario() -> tuple[list[tuple[str, dict[str, Any], str, bool, str]], list[tuple[bool, str]]]:
        async with serving(service.url, profile=profile) as client:
            bad = [(tool, args, arg, *await answer(client, tool, args)) for tool, args, arg in BAD_CALLS]
            extras = [  # what small models add besides: ignored, the call runs
                await answer(client, "recall", {"query": "weekly digest", "limit": 5, "k": 3, "scope": "team"}),
                await answer(client, "recall", {"query": "weekly digest", "agent_id": None, "max_tokens": None}),
                await answer(client, "recall", {"query": "weekly digest", "agent_id": "", "tags": []}),
                await answer(client, "recall", {"query": "weekly digest", "tags": [""]}),
                await answer(client, "mark_handled", {"key": "msg-77", "reason": "new"}),
            ]
            return bad, extras

    bad, extras = anyio.run(scenario)
    for tool, args, arg, failed, text in bad:
        assert failed, (tool, args, text)
        for word in PYDANTIC:
            assert word.lower() not in text.lower(), f"{tool}({args}) answered pydantic text: {text!r}"
        assert arg in text, f"{tool}({args}) does not name {arg!r}: {text!r}"
        assert any(w in text for w in ("e.g.", "send", "Copy", "leave", "split")), (
            f"{tool}({args}) says nothing to send: {text!r}"
        )
        sentences = re.findall(r"[.:;!?]\s+[A-Z]", text)  # ID_RULE's ". _" is not a sentence's end
        assert not sentences and len(text) <= 300, f"{tool}({args}): not one short sentence: {text!r}"
    for failed, text in extras:
        assert not failed, text
    assert "weekly digest to 40 subscribers" in extras[0][1], extras[0]


def test_session_brief_prompt_gives_what_the_teams_memory_holds_on_the_task(
    service: InProcessService, saved: None, tmp_path
) -> None:
    """`session_brief(task)`: a few dated lines of the caller's team's memory that bear on the task (never another
    team's), and a plain sentence when there is nothing yet."""

    async def scenario(url: str) -> tuple[list[str], str]:
        async with serving(url) as client:
            prompts = {p.name: p for p in (await client.list_prompts()).prompts}
            arguments = [(a.name, a.required) for a in prompts["session_brief"].arguments or []]
            assert arguments == [("task", True)], arguments
            result = await client.get_prompt("session_brief", {"task": "Send this week's digest to subscribers."})
            return list(prompts), "\n".join(getattr(m.content, "text", "") for m in result.messages)

    names, text = anyio.run(scenario, service.url)
    assert names == ["session_brief"], names
    head, *lines = text.splitlines()
    assert "bears on this task" in head and 1 <= len(lines) <= 5, text
    assert "weekly digest to 40 subscribers" in text and "mailer-1" in text, text
    assert "Team B" not in text and "secret-agent-b" not in text, text
    empty = InProcessService(tmp_path / "empty", service.env["MEMORY_LLM_URL"]).start()
    try:
        _, text = anyio.run(scenario, empty.url)
    finally:
        empty.stop()
    assert text == "Your team's memory holds nothing yet that bears on this task.", text


def test_an_agent_past_the_team_views_cap_is_still_a_known_filter(service: InProcessService, saved: None) -> None:
    """/v1/team names the 50 busiest agents: one past them is looked up, not dropped as a guess."""
    with service.client("key-b") as http:
        for n in range(TEAM_VIEW_MAX):
            for text in (f"Agent {n} filed report {n}.", f"Agent {n} closed report {n}."):
                answer_ = http.post("/v1/remember", json={"text": text, "agent_id": f"busy-{n}"})
                assert answer_.status_code == 202, answer_.text
        body = {"text": "The quiet agent archived the kiln logs.", "agent_id": "quiet-agent"}
        assert http.post("/v1/remember", json=body).status_code == 202
        view = http.get("/v1/team").json()
    assert "quiet-agent" not in [a["agent_id"] for a in view["agents"]], "the view must be past its cap"

    async def scenario() -> str:
        async with serving(service.url, "key-b") as client:
            failed, text = await answer(
                client, "recall", {"query": "kiln logs", "agent_id": "quiet-agent", "tags": ["x"]}
            )
            assert not failed, text
            return text

    text = anyio.run(scenario)
    assert "No agent" not in text and "tag 'x'" in text and "kiln logs" in text, text
