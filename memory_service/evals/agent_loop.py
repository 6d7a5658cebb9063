"""One agent session: a fresh context, the model behind an OpenAI-compatible /v1/chat/completions with tool
calling, the MCP server's tools (through the MCP SDK's client, over stdio) and the task's local tools.

Nothing is simulated: the model's tool calls go to the real MCP server process, which calls the real service.
What the session measured (tool calls, errors and whether each was recovered, prompt tokens as the model
server counted them, wall time) is returned with the final answer; the scoring does not read it.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from .agent_tasks import LocalTool, RunState

SYSTEM = (
    "You are an assistant agent that works through tools. This is a new session: you remember nothing from "
    "earlier sessions except what your tools can tell you. Call tools to do the work; when the work is done, "
    "answer the user briefly."
)
MAX_TURNS = 14
MAX_REPLY_TOKENS = 384
STUCK_REPEATS = 3  # the same calls this many turns running, or one call this many times in one reply: stuck


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    error: str | None = None  # the tool's error text, when it failed
    # for an error: did a later call succeed in this session (the model went on, maybe by another tool, as a
    # stale id is recovered by recall), rather than stopping at the error?
    recovered: bool | None = None

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tool": self.name, "arguments": self.arguments}
        if self.error is not None:
            out.update(error=self.error[:300], recovered=self.recovered)
        return out


@dataclass
class SessionResult:
    final_answer: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)  # usage.prompt_tokens of each request
    completion_tokens: int = 0
    calls_from_text: int = 0  # tool calls the model wrote as text, read by `calls_in_content`
    turns: int = 0
    stopped: str = "answered"  # answered | max_turns | stuck | timeout | model_error
    problem: str | None = None
    wall_s: float = 0.0

    def report(self) -> dict[str, Any]:
        errors = [c for c in self.calls if c.error is not None]
        return {
            "final_answer": self.final_answer[:500],
            "stopped": self.stopped,
            "problem": self.problem,
            "turns": self.turns,
            "tool_calls": len(self.calls),
            "tool_calls_from_text": self.calls_from_text,
            "tool_errors": len(errors),
            "tool_errors_recovered": sum(1 for c in errors if c.recovered),
            "calls": [c.report() for c in self.calls],
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "wall_time_s": round(self.wall_s, 1),
        }


def mcp_tool_schemas(tools: list[Any]) -> list[dict[str, Any]]:
    """The MCP tool list as OpenAI function tools, as a harness hands them to the model."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description or "", "parameters": t.input_schema},
        }
        for t in tools
    ]


_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)|```(?:json)?\s*(.*?)```", re.S)


def calls_in_content(content: str, offered: set[str]) -> list[dict[str, Any]]:
    """Tool calls a small model wrote as text (a ```json block or a bare <tool_call>) instead of in the
    tool-call format: Qwen2.5-Coder-1.5B does, so a harness for small models reads them, as this one does
    (counted apart). Only objects naming an offered tool, with object arguments, count."""
    blocks = [a or b for a, b in _CALL_BLOCK.findall(content)] or [content]
    # Qwen2.5's chat template shows the call as `{{"name": ...}}` (its own escaped braces), and the model copies it
    blocks = [b.strip()[1:-1] if b.strip().startswith("{{") and b.strip().endswith("}}") else b for b in blocks]
    found: list[dict[str, Any]] = []
    for block in blocks:
        for obj in _json_values(block):
            if isinstance(obj, dict) and obj.get("name") in offered and isinstance(obj.get("arguments", {}), dict):
                arguments = json.dumps(obj.get("arguments") or {})
                call_id = f"call_text_{len(found)}"
                found.append(
                    {"id": call_id, "type": "function", "function": {"name": obj["name"], "arguments": arguments}}
                )
    return found


def _json_values(text: str) -> list[Any]:
    """The JSON values written one after another in `text` (lists flattened); stops at the first non-JSON."""
    decoder, at = json.JSONDecoder(), 0
    values: list[Any] = []
    while True:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return values
        values.extend(value if isinstance(value, list) else [value])


def _mark_recoveries(calls: list[ToolCall]) -> None:
    for n, call in enumerate(calls):
        if call.error is not None:
            call.recovered = any(c.error is None for c in calls[n + 1 :])


async def _chat(http: httpx.AsyncClient, url: str, model: str | None, messages: list[Any], tools: list[Any]) -> Any:
    body: dict[str, Any] = {"messages": messages, "temperature": 0, "max_tokens": MAX_REPLY_TOKENS}
    if model:
        body["model"] = model
    if tools:
        body["tools"] = tools
        body["parallel_tool_calls"] = True  # as agent harnesses allow; llama-server otherwise keeps only the first
    response = await http.post(url.rstrip("/") + "/v1/chat/completions", json=body)
    if response.status_code != 200:
        raise RuntimeError(f"the agent model answered {response.status_code}: {response.text[:300]}")
    return response.json()


async def _run_tool(name: str, args: dict[str, Any], local: dict[str, LocalTool], mcp: Any, state: RunState) -> str:
    """The tool's text; raises ToolError with the text the model reads when the call failed."""
    if name in local:
        try:
            return local[name].run(state, args)
        except ValueError as exc:
            raise ToolError(str(exc)) from None
    if mcp is not None and name in mcp.names:
        result = await mcp.client.call_tool(name, args)
        text = "\n".join(part.text for part in result.content if getattr(part, "text", None))
        if result.is_error:
            raise ToolError(text or "the tool failed")
        return text
    raise ToolError(f"There is no tool named {name!r}.")


class ToolError(Exception):
    """A tool call that failed; its text goes back to the model as the tool's answer."""


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    parsed = json.loads(raw or "{}")
    if not isinstance(parsed, dict):
        raise ValueError("tool arguments must be a JSON object")
    return parsed


async def run_session(
    http: httpx.AsyncClient,
    agent_url: str,
    model: str | None,
    prompt: str,
    *,
    state: RunState,
    local_tools: tuple[LocalTool, ...],
    mcp: Any,
    deadline: float,
) -> SessionResult:
    """One session from a fresh context until the model answers without a tool call (or a bound is hit)."""
    started = time.monotonic()
    out = SessionResult()
    local = {t.name: t for t in local_tools}
    tools = [t.schema() for t in local_tools] + (mcp.schemas if mcp is not None else [])
    offered = {t["function"]["name"] for t in tools}
    system = SYSTEM + (f"\n\n{mcp.instructions}" if mcp is not None and mcp.instructions else "")
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
    turn_calls: list[list[str]] = []
    try:
        while True:
            if out.turns >= MAX_TURNS:
                out.stopped = "max_turns"
                break
            if time.monotonic() > deadline:
                out.stopped = "timeout"
                break
            reply = await _chat(http, agent_url, model, messages, tools)
            out.turns += 1
            usage = reply.get("usage") or {}
            out.prompt_tokens.append(int(usage.get("prompt_tokens") or 0))
            out.completion_tokens += int(usage.get("completion_tokens") or 0)
            message = reply["choices"][0]["message"]
            tool_calls = message.get("tool_calls") or []
            if not tool_calls and tools:
                tool_calls = calls_in_content(message.get("content") or "", offered)
                out.calls_from_text += len(tool_calls)
            if not tool_calls:
                out.final_answer = message.get("content") or ""
                break
            turn_calls.append([_signature(raw) for raw in tool_calls])
            if _stuck(turn_calls):
                out.stopped = "stuck"
                break
            messages.append({"role": "assistant", "content": message.get("content") or "", "tool_calls": tool_calls})
            for n, raw in enumerate(tool_calls):
                messages.append(await _one_call(raw, n, out, local, mcp, state))
    except (httpx.HTTPError, RuntimeError, KeyError, IndexError, TypeError) as exc:
        out.stopped, out.problem = "model_error", f"{type(exc).__name__}: {exc}"[:300]
    _mark_recoveries(out.calls)
    out.wall_s = time.monotonic() - started
    return out


def _signature(raw: dict[str, Any]) -> str:
    function = raw.get("function") or {}
    return f"{function.get('name')}:{function.get('arguments')}"


def _stuck(turn_calls: list[list[str]]) -> bool:
    """A model repeating itself, as agent harnesses detect it (OpenHands stops on a repeated action): the same
    calls in STUCK_REPEATS turns running, or one call STUCK_REPEATS times in the last reply (a reply that
    loops). The repeated turn is not run, and the session stops as `stuck` instead of burning its turns."""
    last = turn_calls[-1]
    if any(last.count(call) >= STUCK_REPEATS for call in last):
        return True
    recent = turn_calls[-STUCK_REPEATS:]
    return len(recent) == STUCK_REPEATS and all(calls == last for calls in recent)


async def _one_call(
    raw: dict[str, Any], n: int, out: SessionResult, local: dict[str, LocalTool], mcp: Any, state: RunState
) -> dict[str, Any]:
    """Run one tool call and record it; the tool message that answers it."""
    function = raw.get("function") or {}
    name = str(function.get("name") or "")
    call = ToolCall(name, {})
    try:
        call.arguments = _arguments(function.get("arguments"))
        text = await _run_tool(name, call.arguments, local, mcp, state)
    except (ToolError, ValueError) as exc:
        text = call.error = str(exc) or type(exc).__name__
    out.calls.append(call)
    return {"role": "tool", "tool_call_id": raw.get("id") or f"call_{out.turns}_{n}", "content": text}
