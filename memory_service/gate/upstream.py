"""The fronted MCP server: started as the gate's child process and spoken to over stdio, with the MCP SDK's own
client (`stdio_client` + `ClientSession`), as any harness would start it.

The child inherits the gate's environment (the tool server may need its own variables) except the gate's own
secrets: the memory service's API key and the MCP token are the gate's, not the tool's.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

# what the fronted server does not get from the gate's environment
SECRETS = ("MEMORY_API_KEY", "MEMORY_MCP_TOKEN")
START_TIMEOUT_S = 60.0


class UpstreamFailed(Exception):
    """The fronted server could not be started or stopped answering; the message says which command."""


@dataclass
class Upstream:
    """A live session with the fronted server, and what it said at start."""

    session: ClientSession
    command: Sequence[str]
    instructions: str | None
    name: str

    async def list_tools(self) -> list[types.Tool]:
        """Every tool it lists, all pages."""
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await self.session.list_tools(params=params)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def call_tool(self, name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
        return await self.session.call_tool(name, arguments)


class NotMcpLine(logging.Filter):
    """The SDK logs a line of the upstream's stdout that is not MCP with a traceback; a person needs the line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            errors = getattr(exc, "errors", None)
            given = errors()[0].get("input") if callable(errors) and errors() else None
            record.msg, record.args = (
                "the upstream MCP server wrote a line that is not MCP on stdout: %r",
                (str(given if given is not None else exc)[:200],),
            )
            record.exc_info, record.exc_text = None, None
        return True


def quiet_sdk_tracebacks() -> None:
    logging.getLogger("mcp.client.stdio").addFilter(NotMcpLine())


def child_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name not in SECRETS}


def describe(command: Sequence[str]) -> str:
    return " ".join(command)


@asynccontextmanager
async def start_upstream(command: Sequence[str]) -> AsyncIterator[Upstream]:
    """Start `command`, do the MCP handshake, and yield the session; the child is stopped on exit.

    Its stderr is the gate's (a harness shows it as the server's log)."""
    if not command:
        raise UpstreamFailed("no upstream command: give it after `--`, e.g. -- python my_tools.py")
    params = StdioServerParameters(command=command[0], args=list(command[1:]), env=child_environment())
    quiet_sdk_tracebacks()
    async with AsyncExitStack() as stack:
        try:
            read, write = await stack.enter_async_context(stdio_client(params, errlog=sys.stderr))
        except OSError as exc:
            raise UpstreamFailed(f"cannot start the upstream MCP server ({describe(command)}): {exc}") from None
        session = await stack.enter_async_context(ClientSession(read, write))
        try:
            with anyio.fail_after(START_TIMEOUT_S):
                started = await session.initialize()
        except TimeoutError:
            raise UpstreamFailed(
                f"the upstream MCP server ({describe(command)}) did not answer the MCP handshake in "
                f"{START_TIMEOUT_S:.0f} s: is it an MCP server that speaks stdio?"
            ) from None
        except Exception as exc:  # it exited, or answered something that is not MCP
            raise UpstreamFailed(
                f"the upstream MCP server ({describe(command)}) failed the MCP handshake: {exc or type(exc).__name__}"
                " (its own messages, if any, are above)"
            ) from None
        yield Upstream(
            session=session, command=tuple(command), instructions=started.instructions, name=started.server_info.name
        )
