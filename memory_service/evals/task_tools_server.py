"""A task's own tools (`process_item`, `send_email`) as a real MCP server over stdio, for the eval's gate profiles.

Under `gate` and `gate+proxy` the eval reaches a task's tools the way an agent's harness reaches its own: through
`memory-service gate`, which fronts this server. So the tools must be a real upstream, not the loop's local
functions: the schemas it lists and the validation it runs are agent_tasks' (the same `LocalTool` objects, so
the two paths cannot drift), and every call it receives is appended as one JSON line to the file named by
MEMORY_EVAL_TOOLS_LOG before it answers. That file is the upstream's own record: the scoring reads a run's side
effects from it, so a call the gate refused, which never got here, has no effect.

    MEMORY_EVAL_TOOLS_LOG=tools.jsonl python -m memory_service.evals.task_tools_server --task feed_dedupe
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from .agent_tasks import LocalTool, RunState, pick

LOG_ENV = "MEMORY_EVAL_TOOLS_LOG"
NAME = "memory-service-eval-task-tools"


def record(path: Path, line: dict[str, Any]) -> None:
    """One short append per call (O_APPEND keeps lines whole), flushed before the answer leaves."""
    with path.open("a", encoding="utf-8") as log:
        log.write(json.dumps(line, ensure_ascii=False) + "\n")


def read_effects(path: Path) -> list[dict[str, Any]]:
    """The side effects of the calls that ran (one dict each, as the local tools record them), in order."""
    if not path.exists():
        return []
    lines = [json.loads(text) for text in path.read_text(encoding="utf-8").splitlines() if text.strip()]
    return [effect for line in lines if line.get("ok") for effect in line.get("effects") or []]


def _text(text: str, *, error: bool) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=error)


def build_server(tools: tuple[LocalTool, ...], log: Path) -> Server[Any]:
    """A low-level MCP server: it lists each tool's own JSON schema as the loop hands it to the model (an
    MCPServer would rebuild it from a Python signature), and runs the tool's own `run`."""
    by_name = {tool.name: tool for tool in tools}

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        listed = [types.Tool(name=t.name, description=t.description, input_schema=t.parameters) for t in tools]
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = dict(params.arguments or {})
        line: dict[str, Any] = {"tool": params.name, "arguments": arguments, "pid": os.getpid(), "t": time.time()}
        tool = by_name.get(params.name)
        if tool is None:
            line.update(ok=False, error="unknown tool")
            record(log, line)
            return _text(f"There is no tool named {params.name!r}.", error=True)
        state = RunState(nonce="upstream")
        try:
            answer = tool.run(state, arguments)
        except ValueError as exc:  # the tool's own validation: an error the model reads, as on the local path
            line.update(ok=False, error=str(exc))
            record(log, line)
            return _text(str(exc), error=True)
        line.update(ok=True, effects=state.effects, answer=answer)
        record(log, line)
        return _text(answer, error=False)

    return Server(NAME, on_list_tools=list_tools, on_call_tool=call_tool)


async def serve(task: str, log: Path) -> None:
    [chosen] = pick([task], None)
    server = build_server(chosen.tools, log)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memory_service.evals.task_tools_server", description=__doc__)
    parser.add_argument("--task", required=True, help="the eval task whose tools to serve")
    args = parser.parse_args(argv)
    log = os.environ.get(LOG_ENV)
    if not log:
        parser.error(f"{LOG_ENV} must name the file each call is recorded in")
    anyio.run(serve, args.task, Path(log))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
