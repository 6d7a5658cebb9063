"""A minimal MCP tool server over stdio, for the gate's benchmark to front (bench/gate.py): the MCP SDK's own
server, three tools that do the same small job, so what differs between paths is the path, not the tool.

Every run of a tool appends one JSON line to the file named by GATE_UPSTREAM_LOG, when set (tool, arguments):
the upstream's own log is what shows how often a guarded tool ran, whatever the gate says.

    python -m memory_service.testbed.mcp_upstream
"""

from __future__ import annotations

import json
import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("bench-upstream", instructions="Tools of the benchmark's upstream: process items, send emails.")


def ran(tool: str, **arguments: str) -> None:
    path = os.environ.get("GATE_UPSTREAM_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:  # one short write: O_APPEND keeps lines whole
            log.write(json.dumps({"tool": tool, "arguments": arguments}) + "\n")


@server.tool(description="Process one item of the queue, by its id.")
def process_item(item_id: str) -> str:
    ran("process_item", item_id=item_id)
    return f"processed {item_id}"


@server.tool(description="Send one email.")
def send_email(to: str, subject: str) -> str:
    ran("send_email", to=to, subject=subject)
    return f"sent {subject!r} to {to}"


@server.tool(description="Look an item up (changes nothing).")
def lookup(item_id: str) -> str:
    ran("lookup", item_id=item_id)
    return f"item {item_id} is open"


if __name__ == "__main__":
    server.run("stdio")
