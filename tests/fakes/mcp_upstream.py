"""A tiny MCP tool server over stdio, for `memory-service gate` to front in tests (the MCP SDK's own server).

Every tool RUN appends one JSON line to the file named by GATE_UPSTREAM_LOG (tool, arguments, its pid and its
parent's: the gate), before it does anything else: the upstream's own log is what proves how often a guarded
tool ran, whatever the gate says. `slow_item` then sleeps GATE_UPSTREAM_SLOW_S seconds (default 30), so a test
can kill the gate while the tool runs; `crash_item` kills the upstream itself mid-run. With GATE_UPSTREAM_RECALL
set it also lists a tool named `recall`, like a memory tool.

    python tests/fakes/mcp_upstream.py
"""

from __future__ import annotations

import json
import os
import time

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError

server = MCPServer("test-upstream", instructions="Tools of the test upstream: process items, send emails.")


def ran(tool: str, **arguments: object) -> None:
    line = json.dumps(
        {"tool": tool, "arguments": arguments, "pid": os.getpid(), "ppid": os.getppid(), "t": time.time()}
    )
    with open(
        os.environ["GATE_UPSTREAM_LOG"], "a", encoding="utf-8"
    ) as log:  # one short write: O_APPEND keeps lines whole
        log.write(line + "\n")


@server.tool(description="Process one item of the queue, by its id.")
def process_item(item_id: str) -> str:
    ran("process_item", item_id=item_id)
    return f"processed {item_id}: closed as duplicate"


@server.tool(description="Send one email.")
def send_email(to: str, subject: str) -> str:
    ran("send_email", to=to, subject=subject)
    return f"sent {subject!r} to {to}"


@server.tool(description="Process an item; this one always fails.")
def fail_item(item_id: str) -> str:
    ran("fail_item", item_id=item_id)
    raise ToolError(f"could not process {item_id}: the queue rejected it")


@server.tool(description="Process an item; this one answers a protocol error.")
def broken_item(item_id: str) -> str:
    ran("broken_item", item_id=item_id)
    raise MCPError(-32000, f"broken_item exploded on {item_id}")


@server.tool(description="Process an item slowly.")
async def slow_item(item_id: str) -> str:
    ran("slow_item", item_id=item_id)
    await anyio.sleep(float(os.environ.get("GATE_UPSTREAM_SLOW_S", "30")))
    return f"slowly processed {item_id}"


@server.tool(description="Process an item; the server dies while it runs.")
def crash_item(item_id: str) -> str:
    ran("crash_item", item_id=item_id)
    os._exit(3)


@server.tool(description="Look an item up (changes nothing).")
def lookup(item_id: str) -> dict[str, str]:
    ran("lookup", item_id=item_id)
    return {"item_id": item_id, "state": "open"}


if os.environ.get("GATE_UPSTREAM_RECALL"):  # a tool named like a memory tool, for the clash at start

    @server.tool(name="recall", description="Recall an item from the queue's archive.")
    def recall(item_id: str) -> str:
        return f"archived {item_id}"


if __name__ == "__main__":
    server.run("stdio")
