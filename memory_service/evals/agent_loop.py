"""One agent session: a fresh context, the model behind an OpenAI-compatible /v1/chat/completions with tool
calling, the MCP server's tools (through the MCP SDK's client, over stdio) and the task's local tools.

Nothing is simulated: the model's tool calls go to the real MCP server process, which calls the real service.
What the session measured (tool calls, errors and whether each was recovered, prompt tokens as the model
server counted them, wall time) is returned with the final answer; the scoring does not read it. Every raw
reply is kept, and an audit counts from them the calls the harness did not run: the field report's rule is to
look at the raw reply before blaming the model, and a harness that drops calls looks exactly like a weak one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from .agent_tasks import LocalTool, RunState
from .code_calls import positional_parameters
from .tool_calls import TextCall, looks_like_a_call, read_calls, without_calls

SYSTEM = (
    "You are an assistant agent that works through tools. This is a new session: you remember nothing from "
    "earlier sessions except what your tools can tell you. Call tools to do the work; when the work is done, "
    "answer the user briefly."
)
MAX_TURNS = 14
MAX_REPLY_TOKENS = 384
STUCK_REPEATS = 3  # the same calls this many turns running, or one call this many times in one reply: stuck
GATE_META = "memory-service/gate"  # the `_meta` key of `memory-service gate`'s refusals: {"refused": why}
# greedy and reproducible: llama-server's prompt cache otherwise makes two identical requests differ
DEFAULT_SAMPLING: dict[str, Any] = {"temperature": 0, "cache_prompt": False}


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    error: str | None = None  # the tool's error text, when it failed
    # for an error: did a later call succeed in this session (the model went on, maybe by another tool, as a
    # stale id is recovered by recall), rather than stopping at the error?
    recovered: bool | None = None
    from_text: bool = False  # written as text in the reply's content, not in its tool_calls
    refused: str | None = None  # the gate refused it (its `_meta` reason: handled, in_progress, limit...)

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tool": self.name, "arguments": self.arguments}
        if self.from_text:
            out["from_text"] = True
        if self.refused is not None:
            out["refused"] = self.refused
        if self.error is not None:
            out.update(error=self.error[:300], recovered=self.recovered)
        return out


@dataclass
class SessionResult:
    """What one session did.

    `raw` holds every reply of the model, one dict per turn, with stable keys (the report reads them):
    `turn` (1-based), `content` and `tool_calls` exactly as sent, `reasoning_content` (only when sent),
    `finish_reason`, `usage`, `timings` (llama-server's, else None), `calls_in_text` (calls read from the
    content), `ran` ([{"id", "tool", "from": "tool_calls" | "text", "error": bool}] for each call the harness
    ran from this reply, in order) and `not_run` (None, "stuck": the repeat the stuck stop did not run, or
    "cut": a reply cut at the token cap, whose calls are not run).
    """

    final_answer: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)  # usage.prompt_tokens of each request
    completion_tokens: int = 0
    calls_from_text: int = 0  # tool calls the model wrote as text, read by `tool_calls.read_calls`
    turns: int = 0
    stopped: str = "answered"  # answered | cut | max_turns | stuck | timeout | model_error
    problem: str | None = None
    wall_s: float = 0.0
    raw: list[dict[str, Any]] = field(default_factory=list)
    offered: tuple[str, ...] = ()  # the tools the model was given (the audit reads calls as the loop did)
    positional: dict[str, str] = field(default_factory=dict)  # tool → the parameter of `name("value")`

    def audit(self) -> dict[str, int]:
        """Calls in the raw replies against calls run. `calls_lost` (present, not run, not explained by a
        stuck stop or a cut reply) must be 0; `replies_with_unread_call_text`: replies whose text, once the calls
        read are taken out, still looks like a call (a <tool_call> tag, `<function=`, a "name" key, a tool's
        name before `(` or `:`), for a reader to look at; a reply cut at the token cap is counted by `calls_cut`
        instead (its last call is cut off). `calls_repeated_in_a_row`: a text call that was the one before it again
        (a model writing each call twice, as code and as JSON), run once."""
        present = run = stuck = cut = unread = repeated = 0
        for reply in self.raw:
            calls, rest, text = _calls_of(reply, self.offered, self.positional)
            present += len(calls)
            repeated += len(text) - sum(1 for c in calls if c.from_text)
            run += len(reply.get("ran") or [])
            if reply.get("not_run") == "stuck":
                stuck += len(calls)
            elif reply.get("not_run") == "cut":
                cut += len(calls)
            if self.offered and reply.get("not_run") != "cut" and looks_like_a_call(rest, self.offered):
                unread += 1
        return {
            "calls_in_replies": present,
            "calls_run": run,
            "calls_lost": present - run - stuck - cut,
            "calls_not_run_stuck": stuck,
            "calls_cut": cut,
            "replies_with_unread_call_text": unread,
            "calls_repeated_in_a_row": repeated,
        }

    def report(self) -> dict[str, Any]:
        errors = [c for c in self.calls if c.error is not None]
        audit = self.audit()
        return {
            "final_answer": self.final_answer[:500],
            "stopped": self.stopped,
            "problem": self.problem,
            "turns": self.turns,
            "tool_calls": len(self.calls),
            "tool_calls_from_text": self.calls_from_text,
            "tool_errors": len(errors),
            "tool_errors_recovered": sum(1 for c in errors if c.recovered),
            "gate_refusals": sum(1 for c in errors if c.refused is not None),
            "calls_lost": audit["calls_lost"],
            "audit": audit,
            "calls": [c.report() for c in self.calls],
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "wall_time_s": round(self.wall_s, 1),
            "raw_replies": self.raw,
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


def calls_in_content(content: str, offered: set[str]) -> list[dict[str, Any]]:
    """The calls written as text in `content`, in the OpenAI tool_calls form (those with bad arguments or an
    unoffered tool included: the loop answers them with a tool error)."""
    return [_canonical(f"call_text_{n}", c.name, c.arguments or {}) for n, c in enumerate(read_calls(content, offered))]


@dataclass
class _Call:
    """One call of a reply, as the loop runs it."""

    id: str
    name: str
    arguments: Any  # as sent: a JSON string or an object (checked when run)
    from_text: bool
    problem: str | None = None  # text calls: why the arguments are unusable


def _canonical(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def _calls_of(
    reply: Mapping[str, Any], offered: tuple[str, ...], positional: Mapping[str, str] | None = None
) -> tuple[list[_Call], str, list[TextCall]]:
    """The calls of one reply (its tool_calls, then those written in its text that are not the same call
    again: not one of the tool_calls, not the text call just before it), the content the history keeps (without
    the calls' text), and every text call read."""
    content: str = reply["content"] if isinstance(reply.get("content"), str) else ""
    calls: list[_Call] = []
    for n, raw in enumerate(reply.get("tool_calls") or []):
        function = raw.get("function") if isinstance(raw, dict) else None
        function = function if isinstance(function, dict) else {}
        call_id = str(raw.get("id") or "") if isinstance(raw, dict) else ""
        calls.append(_Call(call_id or f"call_{n}", str(function.get("name") or ""), function.get("arguments"), False))
    if not offered:
        return calls, content, []
    native = {(c.name, _normal(c.arguments)) for c in calls}
    text_calls = [
        c for c in read_calls(content, set(offered), positional) if (c.name, _normal(c.arguments)) not in native
    ]
    previous: tuple[str, str] | None = None
    for n, found in enumerate(text_calls):
        same = (found.name, _normal(found.arguments))
        if same != previous:  # the same call twice in a row (seen: as code, then as JSON) runs once
            calls.append(_Call(f"call_text_{n}", found.name, found.arguments or {}, True, found.problem))
        previous = same
    return calls, without_calls(content, text_calls) if text_calls else content, text_calls


def _normal(arguments: Any) -> str:
    """Arguments compared across the two fields: parsed when they are a JSON string."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True)


def _mark_recoveries(calls: list[ToolCall]) -> None:
    for n, call in enumerate(calls):
        if call.error is not None:
            call.recovered = any(c.error is None for c in calls[n + 1 :])


async def _chat(
    http: httpx.AsyncClient,
    url: str,
    model: str | None,
    messages: list[Any],
    tools: list[Any],
    sampling: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
) -> Any:
    body: dict[str, Any] = {"messages": messages, "max_tokens": MAX_REPLY_TOKENS, **sampling}
    if model:
        body["model"] = model
    if tools:
        body["tools"] = tools
        body["parallel_tool_calls"] = True  # as agent harnesses allow; llama-server otherwise keeps only the first
    response = await http.post(url.rstrip("/") + "/v1/chat/completions", json=body, headers=dict(headers or {}))
    if response.status_code != 200:
        raise RuntimeError(f"the agent model answered {response.status_code}: {response.text[:300]}")
    return response.json()


class ToolError(Exception):
    """A tool call that failed; its text goes back to the model as the tool's answer. `refused`: the gate's
    reason, when the gate refused it (the tool never ran)."""

    def __init__(self, text: str, refused: str | None = None) -> None:
        super().__init__(text)
        self.refused = refused


async def _run_tool(
    name: str, args: dict[str, Any], local: dict[str, LocalTool], mcp: Any, state: RunState, offered: tuple[str, ...]
) -> str:
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
            said = (result.meta or {}).get(GATE_META)
            refused = str(said.get("refused")) if isinstance(said, dict) and said.get("refused") else None
            raise ToolError(text or "the tool failed", refused)
        return text
    # passed through, never dropped and never the end of the run (the field report's lesson)
    raise ToolError(f"There is no tool named {name!r}. The tools you have are: {', '.join(offered)}.")


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw or "{}")
    except (TypeError, ValueError):
        raise ValueError('The arguments must be a JSON object like {"key": "value"}; they were not JSON.') from None
    if not isinstance(parsed, dict):
        raise ValueError(f'The arguments must be a JSON object like {{"key": "value"}}; they were {parsed!r}.')
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
    sampling: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> SessionResult:
    """One session from a fresh context until the model answers without a tool call (or a bound is hit).

    `sampling`: fields merged into every request body (seed, temperature, top_p...); DEFAULT_SAMPLING when
    None. `headers`: sent with every model request (the proxy's X-Memory-Agent and X-Memory-Session)."""
    started = time.monotonic()
    tools = [t.schema() for t in local_tools] + (mcp.schemas if mcp is not None else [])
    out = SessionResult(offered=tuple(t["function"]["name"] for t in tools), positional=positional_parameters(tools))
    local = {t.name: t for t in local_tools}
    system = SYSTEM + (f"\n\n{mcp.instructions}" if mcp is not None and mcp.instructions else "")
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
    turn_calls: list[list[str]] = []
    sampling = DEFAULT_SAMPLING if sampling is None else sampling
    try:
        while True:
            if out.turns >= MAX_TURNS:
                out.stopped = "max_turns"
                break
            if time.monotonic() > deadline:
                out.stopped = "timeout"
                break
            reply = await _chat(http, agent_url, model, messages, tools, sampling, headers)
            message, record = _record(reply, out)
            calls, content, text_calls = _calls_of(message, out.offered, out.positional)
            record["calls_in_text"] = len(text_calls)
            if record["finish_reason"] == "length":  # cut at the token cap: neither an answer nor a sure call
                out.stopped, record["not_run"] = "cut", "cut"
                break
            if not calls:
                out.final_answer = content
                break
            turn_calls.append([f"{c.name}:{_normal(c.arguments)}" for c in calls])
            if _stuck(turn_calls):
                out.stopped, record["not_run"] = "stuck", "stuck"
                break
            history = [_canonical(c.id, c.name, _history_arguments(c)) for c in calls]
            messages.append({"role": "assistant", "content": content, "tool_calls": history})
            for call in calls:
                messages.append(await _one_call(call, out, local, mcp, state))
                record["ran"].append(
                    {"id": call.id, "tool": call.name, "from": "text" if call.from_text else "tool_calls",
                     "error": out.calls[-1].error is not None}
                )  # fmt: skip
    except (httpx.HTTPError, RuntimeError, KeyError, IndexError, TypeError, AttributeError) as exc:
        out.stopped, out.problem = "model_error", f"{type(exc).__name__}: {exc}"[:300]
    _mark_recoveries(out.calls)
    out.wall_s = time.monotonic() - started
    return out


def _history_arguments(call: _Call) -> Any:
    """The arguments as the history shows them: a JSON object always (a chat template re-reads them)."""
    try:
        return {} if call.problem else _arguments(call.arguments)
    except ValueError:
        return {}


def _record(reply: Any, out: SessionResult) -> tuple[dict[str, Any], dict[str, Any]]:
    """Count the reply's tokens and keep it raw; its message and its raw record."""
    out.turns += 1
    usage = reply.get("usage") or {}
    out.prompt_tokens.append(int(usage.get("prompt_tokens") or 0))
    out.completion_tokens += int(usage.get("completion_tokens") or 0)
    choice = reply["choices"][0]
    message = choice["message"]
    record: dict[str, Any] = {
        "turn": out.turns,
        "content": message.get("content"),
        "tool_calls": message.get("tool_calls"),
        "finish_reason": choice.get("finish_reason"),
        "usage": reply.get("usage"),
        "timings": reply.get("timings"),
        "calls_in_text": 0,
        "ran": [],
        "not_run": None,
    }
    if message.get("reasoning_content"):
        record["reasoning_content"] = message["reasoning_content"]
    out.raw.append(record)
    return message, record


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
    call: _Call, out: SessionResult, local: dict[str, LocalTool], mcp: Any, state: RunState
) -> dict[str, Any]:
    """Run one tool call and record it; the tool message that answers it."""
    record = ToolCall(call.name, {}, from_text=call.from_text)
    try:
        if call.problem:
            raise ValueError(call.problem)
        record.arguments = _arguments(call.arguments)
        text = await _run_tool(call.name, record.arguments, local, mcp, state, out.offered)
    except (ToolError, ValueError) as exc:
        text = record.error = str(exc) or type(exc).__name__
        record.refused = exc.refused if isinstance(exc, ToolError) else None
    out.calls.append(record)
    if call.from_text:
        out.calls_from_text += 1
    return {"role": "tool", "tool_call_id": call.id, "content": text}
