"""`memory-service mcp` started by the agent frameworks' own MCP hosts, as their users would start it.

The OpenAI Agents SDK (`openai-agents`, `agents.mcp.MCPServerStdio`) and pydantic-ai (`pydantic-ai-slim[mcp]`,
`pydantic_ai.mcp.MCPToolset` over FastMCP's stdio transport; pydantic-ai 2 removed its own `MCPServerStdio`) each
spawn the MCP server as a stdio subprocess, list the core tools and call remember then recall through the host's
own call API. No LLM: the pydantic-ai agent runs on its `FunctionModel`, a deterministic stand-in for the model.
The service is the real one in this process (app, workers, stores, embedder) with the fake llama-server.
docs/mcp-hosts.md's two Python snippets run here as written, in a fresh interpreter each.

Nothing leaves the box: the Agents SDK's tracing (which exports to OpenAI) is switched off by its documented
variable and call, and pydantic-ai instruments nothing unless logfire is configured (checked below).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import ROOT
from inprocess import InProcessService

from tests.fakes.fake_llama_server import FakeLlamaServer

pytestmark = pytest.mark.process  # every test spawns `python -m memory_service mcp`, as a host does

os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"  # read once, at the SDK's first trace: before any import of it

CORE = ["remember", "recall", "consume_limit", "mark_handled"]
ARGS = ["-m", "memory_service", "mcp"]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        svc = InProcessService(tmp_path_factory.mktemp("mcp-hosts") / "data", fake.url).start()
        yield svc
        svc.stop()


def server_env(url: str, agent: str) -> dict[str, str]:
    """What a user puts in the host's config: the service URL, a key, an agent id."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}
    env.update({"MEMORY_URL": url, "MEMORY_API_KEY": "key-a", "MEMORY_AGENT_ID": agent, "MEMORY_LOG_LEVEL": "WARNING"})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return env


def text_of(result: Any) -> str:
    return "\n".join(part.text for part in result.content if getattr(part, "text", None))


def test_openai_agents_sdk_lists_and_calls_the_core_tools(service: InProcessService) -> None:
    from agents import Agent, set_tracing_disabled
    from agents.mcp import MCPServerStdio
    from agents.run_context import RunContextWrapper
    from agents.tracing import get_trace_provider

    set_tracing_disabled(True)

    async def scenario() -> None:
        params = {"command": sys.executable, "args": ARGS, "env": server_env(service.url, "agents-sdk")}
        async with MCPServerStdio(
            params={**params, "cwd": str(ROOT)}, name="memory", client_session_timeout_seconds=60
        ) as server:
            assert [t.name for t in await server.list_tools()] == CORE
            # what an Agent hands its model: the same four tools, as the SDK's function tools
            agent = Agent(name="assistant", mcp_servers=[server])
            assert [t.name for t in await agent.get_mcp_tools(RunContextWrapper(context=None))] == CORE
            saved = await server.call_tool("remember", {"text": "The Agents SDK test saved invoice INV-5120 for Acme."})
            assert not saved.is_error and re.search(r"mem_[0-9a-f]+", text_of(saved)), text_of(saved)
            found = await server.call_tool("recall", {"query": "invoice INV-5120"})
            assert not found.is_error and "INV-5120" in text_of(found), text_of(found)

    anyio.run(scenario)
    assert get_trace_provider()._disabled  # the exporter to OpenAI never starts


def test_a_pydantic_ai_agent_remembers_then_recalls_through_the_tools(service: InProcessService) -> None:
    """The agent loop itself, with a deterministic model: it calls remember, then recall, then answers with
    what recall returned. The tool schemas, the calls and the results all pass through pydantic-ai."""
    from fastmcp.client.transports import StdioTransport
    from opentelemetry import trace
    from pydantic_ai import Agent
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    seen: dict[str, Any] = {}

    def model(messages: list[Any], info: AgentInfo) -> ModelResponse:
        seen.setdefault("tools", [t.name for t in info.function_tools])
        returned = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
        if not returned:
            return ModelResponse(
                parts=[ToolCallPart("remember", {"text": "The pump in hall 7 was replaced on May 2."})]
            )
        if len(returned) == 1:
            return ModelResponse(parts=[ToolCallPart("recall", {"query": "pump hall 7"})])
        return ModelResponse(parts=[TextPart(str(returned[-1].content))])

    async def scenario() -> str:
        transport = StdioTransport(sys.executable, ARGS, env=server_env(service.url, "pydantic-agent"), cwd=str(ROOT))
        agent = Agent(FunctionModel(model), toolsets=[MCPToolset(transport, init_timeout=60, read_timeout=60)])
        async with agent:
            return str((await agent.run("Note the pump repair, then tell me what you know about hall 7.")).output)

    answer = anyio.run(scenario)
    assert seen["tools"] == CORE
    assert "hall 7" in answer and "May 2" in answer, answer
    # pydantic-ai exports only through logfire or an OpenTelemetry SDK someone configured: neither is here
    assert importlib.util.find_spec("logfire") is None and Agent._instrument_default is False
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # OpenTelemetry's no-op default


DOC = ROOT / "docs" / "mcp-hosts.md"


def doc_snippets() -> list[str]:
    """The page's ```python blocks (the LangGraph one is ```text: not tested, and the page says so)."""
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_doc_page_names_what_it_runs() -> None:
    snippets = doc_snippets()
    assert len(snippets) == 2 and "agents.mcp" in snippets[0] and "pydantic_ai.mcp" in snippets[1]


@pytest.mark.parametrize("index", [0, 1], ids=["agents-sdk", "pydantic-ai"])
def test_the_doc_snippets_run_as_written(service: InProcessService, index: int, tmp_path: Path) -> None:
    """In a fresh interpreter, as a user runs them; only the URL and the key are put in, and `memory-service`
    is the venv's console script, found on PATH."""
    code = doc_snippets()[index].replace("http://127.0.0.1:8700", service.url).replace('"KEY"', '"key-a"')
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_")}
    env["PATH"] = os.pathsep.join((os.path.dirname(sys.executable), env.get("PATH", "")))
    ran = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "['remember', 'recall', 'consume_limit', 'mark_handled']" in ran.stdout, ran.stdout
    assert ("INV-5120" if index == 0 else "TK-88") in ran.stdout.split("\n", 1)[1], ran.stdout
