"""A fault-injecting stand-in for llama.cpp's `llama-server`, on real sockets.

The service talks to llama-server over HTTP, so its failure handling (timeouts,
retries, thinking models, broken JSON, context overflow) can only be tested
honestly against a real HTTP peer. This fake speaks the endpoints the service
uses with llama.cpp's JSON shapes (build b11434) and can be switched at runtime
into the misbehaviours seen in the field.

In-process::

    with FakeLlamaServer("thinking", tokens_per_s=5000) as fake:
        httpx.post(f"{fake.url}/v1/chat/completions", json=...)
        fake.set_mode("hang")
        assert fake.requests[0]["max_tokens"] == 384

As a process (prints ``FAKE_LLAMA_SERVER_URL=http://127.0.0.1:PORT`` once ready)::

    python -m tests.fakes.fake_llama_server --port 0 --mode ok

Runtime control over HTTP, for a service running in another process:
``POST /_fake/mode {"mode": ..., <options>}``, ``GET /_fake/mode``,
``GET /_fake/requests`` and ``DELETE /_fake/requests``.

Mode ``loop`` plays a model caught in a repetition loop: the first ``loop_head`` (2) facts complete, then one
span (``loop_span``) repeated until the output cap, for texts of more than ``loop_above`` tokens (smaller
pieces get a normal answer, and so does a request with DRY sampling on when ``dry_breaks_loop``). ``fake.streamed`` holds how many tokens each streamed reply actually sent.

Mode ``script`` plays a tool-calling agent model: ``set_mode("script", script=[turns])`` replays assistant
turns with ``tool_calls`` chosen by the conversation (see `scripted_reply`), for the agent eval's smoke test.

Option ``fault`` (any mode) plays a broken peer on the paths in ``fault_on``: ``silent`` (accepts, never
answers), ``trickle_headers`` / ``trickle_body`` (a byte every ``trickle_s``), ``endless`` (a body, or stream
events, of ``endless_bytes``): what the client's total deadlines and read caps are for (issue 53).

Tokens are approximated deterministically (runs of up to 4 word characters,
or one punctuation character; whitespace is free), the same way for
``/tokenize``, ``prompt_n`` (the ``/apply-template`` rendering of the
messages) and ``predicted_n`` (the reply content).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import select
import signal
import socket
import sys
import threading
import time
import uuid
import zlib
from dataclasses import asdict, dataclass, fields, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODES: frozenset[str] = frozenset(
    {
        "ok",
        "thinking",
        "unclosed_think",
        "think_then_json",
        "reasoning_content",
        "reasoning_only",
        "hang",
        "slow",
        "http_500",
        "http_503",
        "malformed",
        "truncated",
        "tool_call",
        "drop",
        "fail_then_ok",
        "ignore_kwarg",
        "loading",
        "script",
        "loop",
    }
)

FAULTS = ("silent", "trickle_headers", "trickle_body", "endless")

BUILD_INFO = "b11434-fake0000"
MODEL_ALIAS = "fake-qwen3-0.6b-q4_k_m.gguf"
_THINKING_MODES = frozenset({"thinking", "ignore_kwarg"})
_POLL_S = 0.02

_TOKEN_RE = re.compile(r"\w{1,4}|[^\w\s]")
_SENTENCE_SPLIT_RE = re.compile(r"(?<=[.!?])\s+|\n+")
_FILLER = "Okay, let me read the text carefully and decide which facts are worth keeping. "
_EMPTY_THINK = "<think>\n\n</think>\n\n"


# --------------------------------------------------------------------------- tokens


def tokenize(text: str) -> list[str]:
    """Token pieces of `text`: the one approximation every endpoint shares."""
    return _TOKEN_RE.findall(text)


def count_tokens(text: str) -> int:
    """Number of tokens in `text`, as /tokenize would report it."""
    return sum(1 for _ in _TOKEN_RE.finditer(text))


def token_id(piece: str) -> int:
    """Stable fake id for a piece, in a Qwen-sized vocabulary."""
    return 100 + zlib.crc32(piece.encode("utf-8")) % 151_000


def truncate_tokens(text: str, n: int) -> str:
    """The prefix of `text` holding exactly its first `n` tokens (all of it if shorter)."""
    if n <= 0:
        return ""
    for i, match in enumerate(_TOKEN_RE.finditer(text), start=1):
        if i == n:
            return text[: match.end()]
    return text


def _token_ends(text: str) -> list[int]:
    return [m.end() for m in _TOKEN_RE.finditer(text)]


def _filler(n_tokens: int) -> str:
    """Reasoning text of exactly `n_tokens` tokens (what a model mumbles while thinking)."""
    per = max(1, count_tokens(_FILLER))
    return truncate_tokens(_FILLER * (n_tokens // per + 1), n_tokens).strip()


# --------------------------------------------------------------------------- template


def _text_of(content: Any) -> str:
    """Message content as text; OpenAI content-part lists are joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type", "text") == "text"
        )
    return str(content)


def _thinking_disabled(body: dict[str, Any]) -> bool:
    kwargs = body.get("chat_template_kwargs")
    return isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False


def render_chatml(messages: list[dict[str, Any]], *, empty_think: bool) -> str:
    """ChatML rendering, plus Qwen3's empty think block when thinking is switched off."""
    parts = [f"<|im_start|>{m.get('role', 'user')}\n{_text_of(m.get('content'))}<|im_end|>\n" for m in messages]
    parts.append("<|im_start|>assistant\n")
    if empty_think:
        parts.append(_EMPTY_THINK)
    return "".join(parts)


_TEMPLATE_THINKS = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}{%- endif %}"
)
_TEMPLATE_IGNORES = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)


# --------------------------------------------------------------------------- settings


@dataclass
class Settings:
    """Everything a mode may read; `set_mode` options are these field names."""

    mode: str = "ok"
    n_ctx: int = 4096
    tokens_per_s: float = 200.0
    # reading the prompt: None reports 10x tokens_per_s and takes no time; a number is also waited for
    prompt_tokens_per_s: float | None = None
    think_tokens: int = 8000
    facts: list[str] | None = None
    template_thinks: bool = True
    # mode-specific knobs
    fail_count: int = 2  # fail_then_ok: how many requests fail with 500 first
    # slow: after this many chat requests it answers at tokens_per_s again (a machine busy for a while);
    # None: slow for good
    recover_after: int | None = None
    reasoning_tokens: int = 200  # unclosed_think / think_then_json / reasoning_*: reasoning length
    empty_think: bool = False  # thinking off: prefix the reply with "<think>\n\n</think>\n\n"
    tool_style: str = "hermes"  # tool_call: "hermes" (<tool_call>{json}) or "qwen_xml" (<function=...>)
    drop_style: str = "close"  # drop: "close" (no response) or "partial" (headers + half a body)
    content: str | None = None  # ok: reply with exactly this content instead of facts JSON
    # any mode: a chat request whose messages contain this text takes a slot and holds it until the client
    # leaves (a long request that only a disconnect ends, as llama-server cancels a task whose client left)
    hang_when: str | None = None
    # script: assistant turns replayed to a tool-calling agent (see `scripted_reply`)
    script: list[dict[str, Any]] | None = None
    # loop: the span repeated after the first two facts, for a last user message of more than loop_above tokens
    loop_span: str = "1,250,000 rows. Two alerts fired during the window: the queue depth on orders-worker peaked "
    loop_above: int = 0
    loop_head: int = 2  # complete facts before the loop
    dry_breaks_loop: bool = False  # a request with dry_multiplier > 0 gets a normal answer (DRY broke the loop)
    # any mode: a peer fault on the paths in `fault_on` (None: every path but the control ones), issue 53's:
    # "silent" accepts and never answers; "trickle_headers" sends the status line then a header byte every
    # `trickle_s`; "trickle_body" sends a 200 then a body byte every `trickle_s`; "endless" sends a 200 then
    # `endless_bytes` of body as fast as the client reads (stream events on a streamed chat), then closes
    fault: str | None = None
    fault_on: list[str] | None = None
    trickle_s: float = 0.5
    endless_bytes: int = 64 << 20

    def check(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; known: {sorted(MODES)}")
        if self.tokens_per_s <= 0:
            raise ValueError("tokens_per_s must be > 0")
        if self.n_ctx < 1:
            raise ValueError("n_ctx must be >= 1")
        if self.recover_after is not None and self.recover_after < 0:
            raise ValueError("recover_after must be >= 0")
        if self.tool_style not in ("hermes", "qwen_xml"):
            raise ValueError("tool_style must be 'hermes' or 'qwen_xml'")
        if self.drop_style not in ("close", "partial"):
            raise ValueError("drop_style must be 'close' or 'partial'")
        if self.fault not in (None, *FAULTS):
            raise ValueError(f"fault must be one of {FAULTS} or None")


_OPTION_NAMES = frozenset(f.name for f in fields(Settings)) - {"mode"}


# --------------------------------------------------------------------------- replies


@dataclass
class _Reply:
    content: str
    reasoning: str | None = None
    tool_calls_null: bool = False
    finish_reason: str = "stop"
    tool_calls: list[dict[str, Any]] | None = None  # script mode: OpenAI tool_calls of the reply


def _facts_for(settings: Settings, messages: list[dict[str, Any]]) -> list[str]:
    """Configured facts, else the last user message's sentences (at most 5, each <= 200 chars)."""
    if settings.facts is not None:
        return list(settings.facts)
    last = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    text = _text_of(last.get("content")) if last else ""
    sentences = [s.strip() for s in _SENTENCE_SPLIT_RE.split(text) if s and s.strip()]
    return [s[:200] for s in sentences[:5]]


def _facts_json(facts: list[str]) -> str:
    return json.dumps({"facts": facts}, ensure_ascii=False)


def _script_vars(turn: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, str]:
    """A turn's `vars` ({name: regex}): the first match (its group 1 if any) in the conversation, newest last."""
    text = "\n".join(_text_of(m.get("content")) for m in messages)
    found: dict[str, str] = {}
    for name, pattern in (turn.get("vars") or {}).items():
        match = re.search(pattern, text)
        if match:
            found[name] = match.group(1) if match.groups() else match.group(0)
    return found


def _fill(value: Any, found: dict[str, str]) -> Any:
    if isinstance(value, str):
        for name, got in found.items():
            value = value.replace("{" + name + "}", got)
        return value
    if isinstance(value, dict):
        return {k: _fill(v, found) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, found) for v in value]
    return value


def scripted_reply(script: list[dict[str, Any]], body: dict[str, Any]) -> _Reply:
    """script mode: the first turn that fits this conversation, as a tool-calling model would answer.

    A turn fits when its `when` is in the first user message, its `step` (default 0) is the number of
    assistant messages so far, and the offered tools include all of `tools_include` and none of
    `tools_exclude`. Its `tool_calls` ([{"name", "arguments"}]) are replied as OpenAI tool_calls, minus those
    naming a tool the request does not offer (a model calls only what it is shown; `"offered_only": false`
    keeps them, as a model that invents a tool name); `content` is the text, any text (a call written as
    JSON in it, as small models do). `finish_reason` replaces the one chosen ("tool_calls" with calls, else
    "stop"), e.g. "length" for a reply cut at the token cap. `{name}` in the calls or the content is replaced
    by the match of `vars[name]` (a regex) in the conversation. No turn fits: the answer "Done." without tool
    calls.
    """
    messages = body.get("messages") or []
    first_user = next((_text_of(m.get("content")) for m in messages if m.get("role") == "user"), "")
    step = sum(1 for m in messages if m.get("role") == "assistant")
    offered = {str((t.get("function") or {}).get("name")) for t in body.get("tools") or [] if isinstance(t, dict)}
    for turn in script:
        if (
            str(turn.get("when", "")) in first_user
            and int(turn.get("step", 0)) == step
            and set(turn.get("tools_include") or []) <= offered
            and not set(turn.get("tools_exclude") or []) & offered
        ):
            found = _script_vars(turn, messages)
            calls = [
                {
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": json.dumps(_fill(call.get("arguments") or {}, found)),
                    },
                }
                for call in turn.get("tool_calls") or []
                if call["name"] in offered or turn.get("offered_only", True) is False
            ]
            content = str(_fill(turn.get("content", ""), found))
            finish = str(turn.get("finish_reason") or ("tool_calls" if calls else "stop"))
            return _Reply(content, tool_calls=calls or None, finish_reason=finish)
    return _Reply("Done.")


def _build_reply(settings: Settings, body: dict[str, Any]) -> _Reply:
    """The full, untruncated reply the model "would" generate in this mode."""
    messages = body.get("messages") or []
    if settings.mode == "script":
        return scripted_reply(settings.script or [], body)
    facts = _facts_for(settings, messages)
    payload = _facts_json(facts)
    mode = settings.mode
    thinks_off = _thinking_disabled(body) and settings.template_thinks and mode != "ignore_kwarg"
    if mode in _THINKING_MODES and not thinks_off:
        return _Reply(f"<think>\n{_filler(settings.think_tokens)}\n</think>\n\n{payload}")
    if mode in _THINKING_MODES:
        return _Reply((_EMPTY_THINK if settings.empty_think else "") + payload)
    if mode == "unclosed_think":
        return _Reply(f"<think>\n{_filler(settings.reasoning_tokens)}\n{payload}")
    if mode == "think_then_json":
        return _Reply(f"<think>\n{_filler(settings.reasoning_tokens)}\n</think>\n\n{payload}")
    if mode == "reasoning_content":
        return _Reply(payload, reasoning=_filler(settings.reasoning_tokens))
    if mode == "reasoning_only":
        return _Reply("", reasoning=f"{_filler(settings.reasoning_tokens)}\n{payload}")
    if mode == "malformed":
        items = facts or ["the user said something"]
        return _Reply("Here are the facts:\n" + "\n".join(f"- {f}" for f in items))
    if mode == "loop":
        last = next((m for m in reversed(messages) if m.get("role") == "user"), None)
        dry = settings.dry_breaks_loop and float(body.get("dry_multiplier") or 0) > 0
        if count_tokens(_text_of(last.get("content")) if last else "") > settings.loop_above and not dry:
            first = [f for f in facts if f != "Text:"][: settings.loop_head]  # not the extraction prompt's label
            head = "".join(json.dumps(f, ensure_ascii=False) + ", " for f in first)
            return _Reply('{"facts": [' + head + '"' + settings.loop_span * 400, finish_reason="length")
        return _Reply(payload)
    if mode == "truncated":
        half = max(1, count_tokens(payload) // 2)
        return _Reply(truncate_tokens(payload, half), finish_reason="length")
    if mode == "tool_call":
        items = facts or ["the user said something"]
        if settings.tool_style == "hermes":
            calls = [
                "<tool_call>\n"
                + json.dumps({"name": "save_fact", "arguments": {"fact": f}}, ensure_ascii=False)
                + "\n</tool_call>"
                for f in items
            ]
        else:
            calls = [
                f"<tool_call>\n<function=save_fact>\n<parameter=fact>\n{f}\n</parameter>\n</function>\n</tool_call>"
                for f in items
            ]
        return _Reply("\n".join(calls), tool_calls_null=True)
    if settings.content is not None:
        return _Reply(settings.content)
    return _Reply(payload)


def _apply_budget(reply: _Reply, budget: int) -> tuple[_Reply, int]:
    """Cut reasoning + content to `budget` tokens, as generation would stop; returns predicted_n."""
    r_tokens = count_tokens(reply.reasoning or "")
    c_tokens = count_tokens(reply.content)
    if r_tokens + c_tokens <= budget:
        return reply, r_tokens + c_tokens
    if r_tokens >= budget:
        reasoning = truncate_tokens(reply.reasoning or "", budget)
        return replace(reply, reasoning=reasoning, content="", finish_reason="length"), budget
    content = truncate_tokens(reply.content, budget - r_tokens)
    return replace(reply, content=content, finish_reason="length"), budget


def fail_count_of(settings: Settings) -> int:
    """Failures still owed after a (re)start of fail_then_ok mode."""
    return settings.fail_count if settings.mode == "fail_then_ok" else 0


def _error_body(code: int, message: str, kind: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "type": kind, **extra}}


def _timings(
    prompt_n: int, predicted_n: int, tokens_per_s: float, prompt_tokens_per_s: float | None = None, cache_n: int = 0
) -> dict[str, Any]:
    """llama.cpp's per-request timings; prompt processing is nominally 10x generation speed unless set.

    As in llama.cpp, prompt_n counts the prompt tokens processed, cache_n those reused from the KV cache.
    """
    prompt_n -= cache_n
    prompt_ms = prompt_n / (prompt_tokens_per_s or tokens_per_s * 10) * 1000
    predicted_ms = predicted_n / tokens_per_s * 1000
    return {
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n / (prompt_ms / 1000) if prompt_ms else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
        "predicted_per_second": predicted_n / (predicted_ms / 1000) if predicted_ms else 0.0,
    }


# --------------------------------------------------------------------------- HTTP


class _Server(ThreadingHTTPServer):
    """Threading server that never joins its handler threads, so stop() cannot hang."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    fake: FakeLlamaServer

    def process_request(self, request: Any, client_address: Any) -> None:
        self.fake._track(request, True)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        self.fake._track(request, False)
        super().shutdown_request(request)


class _Handler(BaseHTTPRequestHandler):
    """One connection; HTTP/1.1 keep-alive like the real server."""

    protocol_version = "HTTP/1.1"
    server: _Server
    server_version = "llama.cpp"
    sys_version = ""

    def setup(self) -> None:
        """No Nagle: an answer's head and body are two writes, and a client that delays its ACK (40 ms on
        Linux) would otherwise hold the body back; llama-server's answers do not wait like that."""
        super().setup()
        try:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if self.server.fake.verbose:
            super().log_message(format, *args)

    # ---------------------------------------------------------------- plumbing

    @property
    def fake(self) -> FakeLlamaServer:
        return self.server.fake

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _read_json(self) -> tuple[dict[str, Any] | None, bytes]:
        raw = self._read_body()
        try:
            value = json.loads(raw or b"{}")
        except (ValueError, UnicodeDecodeError):
            return None, raw
        return (value if isinstance(value, dict) else None), raw

    def _send_json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj, ensure_ascii=False).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Access-Control-Allow-Origin", "*")
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def _error(self, status: int, message: str, kind: str, **extra: Any) -> None:
        self._send_json(status, _error_body(status, message, kind, **extra))

    def _client_gone(self) -> bool:
        """True once the peer closed its end (a client timeout), so waits can give up."""
        sock = self.connection
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                return False
            return sock.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _wait(self, seconds: float | None) -> bool:
        """Sleep `seconds` (None: forever); False early if the server stops or the client leaves."""
        deadline = None if seconds is None else time.monotonic() + seconds
        stop = self.fake._stop_event
        while True:
            if stop.is_set() or self._client_gone():
                return False
            if deadline is None:
                stop.wait(_POLL_S)
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            stop.wait(min(_POLL_S, left))

    def _acquire_slot(self) -> bool:
        """Queue for a slot like llama-server's task queue does; False if abandoned."""
        slots = self.fake._slots
        while not slots.acquire(timeout=_POLL_S):
            if self.fake._stop_event.is_set() or self._client_gone():
                return False
        return True

    def _drop(self, settings: Settings) -> None:
        self.close_connection = True
        if settings.drop_style == "partial":
            data = json.dumps({"choices": [{"message": {"content": "x" * 200}}]}).encode()
            try:
                self.send_response(200)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
            except OSError:
                return
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # ---------------------------------------------------------------- routing

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        self._route("POST")

    def do_DELETE(self) -> None:  # noqa: N802 - stdlib name
        self._route("DELETE")

    def do_OPTIONS(self) -> None:  # noqa: N802 - stdlib name
        self._send_json(200, {})

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        self.fake._note_call(f"{method} {path}")
        if path.startswith("/_fake/"):
            self._control(method, path)
            return
        settings = self.fake._snapshot()
        if settings.fault and (settings.fault_on is None or path in settings.fault_on):
            self._fault(settings, path)
            return
        if settings.mode == "loading":
            self._read_body()
            self._error(503, "Loading model", "unavailable_error")
            return
        routes = {
            ("GET", "/health"): self._health,
            ("GET", "/v1/health"): self._health,
            ("GET", "/props"): self._props,
            ("GET", "/v1/models"): self._models,
            ("GET", "/models"): self._models,
            ("POST", "/tokenize"): self._tokenize,
            ("POST", "/apply-template"): self._apply_template,
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/chat/completions"): self._chat,
        }
        handler = routes.get((method, path))
        if handler is None:
            self._read_body()
            self._error(404, "File Not Found", "not_found_error")
            return
        handler(settings)

    def _fault(self, settings: Settings, path: str) -> None:
        """A peer that never answers, answers a byte at a time, or never stops: what a total deadline and a
        bounded read are for (a per-read timeout outlives a trickle; a body read whole outgrows memory)."""
        body, _ = self._read_json()
        self.close_connection = True
        try:
            if settings.fault == "silent":
                self._wait(None)
                return
            if settings.fault == "trickle_headers":
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: ")
                self.wfile.flush()
                while self._wait(settings.trickle_s):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                return
            streamed = bool(body and body.get("stream"))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream" if streamed else "application/json")
            if settings.fault == "trickle_body":
                self.send_header("Content-Length", str(1 << 20))
            self.end_headers()
            self.wfile.flush()
            if settings.fault == "trickle_body":
                while self._wait(settings.trickle_s):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                return
            sent = 0
            while sent < settings.endless_bytes and not self.fake._stop_event.is_set():
                if streamed:  # text that never repeats: a repetition loop would be cut by the client's LoopGuard
                    delta = {"choices": [{"index": 0, "delta": {"content": os.urandom(32500).hex()}}]}
                    piece = f"data: {json.dumps(delta)}\n\n".encode()
                else:
                    piece = b" " * 65536
                self.wfile.write(piece)
                sent += len(piece)
            self.wfile.flush()
        except OSError:
            pass

    def _control(self, method: str, path: str) -> None:
        if path == "/_fake/mode" and method == "GET":
            self._send_json(200, self.fake.state())
        elif path == "/_fake/mode" and method == "POST":
            body, _ = self._read_json()
            if body is None or "mode" not in body:
                self._error(400, 'expected a JSON object with "mode"', "invalid_request_error")
                return
            options = {k: v for k, v in body.items() if k != "mode"}
            try:
                self.fake.set_mode(str(body["mode"]), **options)
            except (ValueError, TypeError) as exc:
                self._error(400, str(exc), "invalid_request_error")
                return
            self._send_json(200, self.fake.state())
        elif path == "/_fake/requests" and method == "GET":
            self._send_json(200, {"requests": self.fake.recorded()})
        elif path == "/_fake/requests" and method == "DELETE":
            self.fake.clear_requests()
            self._send_json(200, {"requests": []})
        else:
            self._read_body()
            self._error(404, "File Not Found", "not_found_error")

    # ---------------------------------------------------------------- endpoints

    def _health(self, settings: Settings) -> None:
        self._send_json(200, {"status": "ok"})

    def _props(self, settings: Settings) -> None:
        honours_kwarg = settings.template_thinks and settings.mode != "ignore_kwarg"
        template = _TEMPLATE_THINKS if honours_kwarg else _TEMPLATE_IGNORES
        self._send_json(
            200,
            {
                "default_generation_settings": {
                    "id": 0,
                    "id_task": -1,
                    "n_ctx": settings.n_ctx,
                    "speculative": False,
                    "is_processing": False,
                    "params": {"n_predict": -1, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": -1},
                },
                "total_slots": self.fake.slots,
                "model_alias": MODEL_ALIAS,
                "model_path": f"models/{MODEL_ALIAS}",
                "modalities": {"vision": False, "audio": False},
                "chat_template": template,
                "bos_token": "<|endoftext|>",
                "eos_token": "<|im_end|>",
                "build_info": BUILD_INFO,
                "webui": False,
            },
        )

    def _models(self, settings: Settings) -> None:
        meta = {"vocab_type": 2, "n_vocab": 151936, "n_ctx_train": 40960, "n_embd": 1024, "n_params": 596049920}
        created = int(time.time())
        self._send_json(
            200,
            {
                "models": [
                    {"name": MODEL_ALIAS, "model": MODEL_ALIAS, "type": "model", "capabilities": ["completion"]}
                ],
                "object": "list",
                "data": [
                    {"id": MODEL_ALIAS, "object": "model", "created": created, "owned_by": "llamacpp", "meta": meta}
                ],
            },
        )

    def _tokenize(self, settings: Settings) -> None:
        body, _ = self._read_json()
        if body is None or not isinstance(body.get("content", ""), str):
            self._error(400, '"content" must be a string', "invalid_request_error")
            return
        # add_special is accepted but adds nothing: Qwen models have no BOS token.
        pieces = tokenize(body.get("content", ""))
        if body.get("with_pieces"):
            self._send_json(200, {"tokens": [{"id": token_id(p), "piece": p} for p in pieces]})
        else:
            self._send_json(200, {"tokens": [token_id(p) for p in pieces]})

    def _render(self, settings: Settings, body: dict[str, Any]) -> str:
        empty_think = settings.template_thinks and settings.mode != "ignore_kwarg" and _thinking_disabled(body)
        return render_chatml(list(body.get("messages") or []), empty_think=empty_think)

    def _apply_template(self, settings: Settings) -> None:
        body, _ = self._read_json()
        if body is None or not isinstance(body.get("messages"), list):
            self._error(400, '"messages" must be an array', "invalid_request_error")
            return
        self._send_json(200, {"prompt": self._render(settings, body)})

    def _chat(self, settings: Settings) -> None:
        body, raw = self._read_json()
        self.fake._record(body if body is not None else {"_invalid_json": raw.decode("utf-8", "replace")})
        if body is None:
            self._error(400, "Failed to parse the request body as JSON", "invalid_request_error")
            return
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            self._error(400, "'messages' is required and must be a non-empty array", "invalid_request_error")
            return
        mode = settings.mode
        if mode == "http_500" or (mode == "fail_then_ok" and self.fake._take_failure()):
            self._error(500, "fake llama-server: injected internal error", "server_error")
            return
        if mode == "http_503":
            self._error(503, "Loading model", "unavailable_error")
            return
        if mode == "drop":
            self._drop(settings)
            return
        if mode == "hang":
            self._wait(None)
            self.close_connection = True
            return

        prompt_n = count_tokens(self._render(settings, body))
        if body.get("tools"):  # the template renders the offered tools into the prompt too
            prompt_n += count_tokens(json.dumps(body["tools"], ensure_ascii=False))
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens", body.get("n_predict")))
        if not isinstance(max_tokens, int) or max_tokens < 0:
            max_tokens = None
        asked = prompt_n + (max_tokens or 0)
        if prompt_n >= settings.n_ctx or asked > settings.n_ctx:
            self._error(
                400,
                f"request ({asked} tokens) exceeds the available context size ({settings.n_ctx} tokens), "
                "try increasing it",
                "exceed_context_size_error",
                n_prompt_tokens=prompt_n,
                n_ctx=settings.n_ctx,
            )
            return

        budget = settings.n_ctx - prompt_n if max_tokens is None else max_tokens
        reply, predicted_n = _apply_budget(_build_reply(settings, body), budget)
        tokens_per_s = 1.0 if mode == "slow" and self.fake._take_slow() else settings.tokens_per_s
        self._prompt_tps = settings.prompt_tokens_per_s
        self._cache_n = 0
        if settings.prompt_tokens_per_s:  # a paced prompt also gets a prompt cache: the prefix shared with the last
            rendered = self._render(settings, body)
            self._cache_n = count_tokens(os.path.commonprefix([rendered, self.fake._last_prompt]))
            self.fake._last_prompt = rendered
        if not self._acquire_slot():
            self.close_connection = True
            return
        try:
            if settings.hang_when and settings.hang_when in json.dumps(body.get("messages"), ensure_ascii=False):
                self.fake._held += 1
                self._wait(None)
                self.fake._held -= 1
                self.close_connection = True
                return
            reading = (prompt_n - self._cache_n) / settings.prompt_tokens_per_s if settings.prompt_tokens_per_s else 0.0
            if body.get("stream"):
                # the prompt is read before the first token, as llama-server does; a client gone meanwhile cancels
                if self._wait(reading):
                    self._stream(body, reply, prompt_n, predicted_n, tokens_per_s)
                self.close_connection = True
                return
            if not self._wait(reading + predicted_n / tokens_per_s):
                self.close_connection = True  # client gave up or server stopping: cancel the task
                return
        finally:
            self.fake._slots.release()
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.reasoning is not None:
            message["reasoning_content"] = reply.reasoning
        if reply.tool_calls_null:
            message["tool_calls"] = None
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        self._send_json(200, self._envelope(body, prompt_n, predicted_n, tokens_per_s, reply, message))

    def _envelope(
        self,
        body: dict[str, Any],
        prompt_n: int,
        predicted_n: int,
        tokens_per_s: float,
        reply: _Reply,
        message: dict[str, Any],
    ) -> dict[str, Any]:
        return {
            "choices": [{"finish_reason": reply.finish_reason, "index": 0, "message": message}],
            "created": int(time.time()),
            "model": body.get("model") or MODEL_ALIAS,
            "system_fingerprint": BUILD_INFO,
            "object": "chat.completion",
            "usage": {
                "completion_tokens": predicted_n,
                "prompt_tokens": prompt_n,
                "total_tokens": prompt_n + predicted_n,
            },
            "id": f"chatcmpl-{uuid.uuid4().hex[:32]}",
            "timings": _timings(
                prompt_n, predicted_n, tokens_per_s, getattr(self, "_prompt_tps", None), getattr(self, "_cache_n", 0)
            ),
        }

    def _stream(
        self, body: dict[str, Any], reply: _Reply, prompt_n: int, predicted_n: int, tokens_per_s: float
    ) -> None:
        """Server-sent events like llama.cpp's, paced at tokens_per_s; close-delimited body."""
        self.close_connection = True
        chat_id = f"chatcmpl-{uuid.uuid4().hex[:32]}"
        model = body.get("model") or MODEL_ALIAS

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            obj = {
                "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
                "created": int(time.time()),
                "id": chat_id,
                "model": model,
                "system_fingerprint": BUILD_INFO,
                "object": "chat.completion.chunk",
                **extra,
            }
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()

        pieces: list[tuple[str, str]] = []
        for key, text in (("reasoning_content", reply.reasoning or ""), ("content", reply.content)):
            start = 0
            ends = _token_ends(text)
            for i, end in enumerate(ends):
                stop_at = len(text) if i == len(ends) - 1 else end
                pieces.append((key, text[start:stop_at]))
                start = stop_at
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(chunk({"role": "assistant", "content": None}))
            began = time.monotonic()
            sent = 0
            streamed = self.fake._note_streamed(None, 0)
            while sent < len(pieces):
                due = min(len(pieces), int((time.monotonic() - began) * tokens_per_s) + 1)
                # noted before the writes: a client that reads a token may count it before a note made after
                # the write would (a busy machine's race: 135 read against 134 noted)
                self.fake._note_streamed(streamed, max(sent, due))
                for key, text in pieces[sent:due]:
                    self.wfile.write(chunk({key: text}))
                sent = max(sent, due)
                self.wfile.flush()
                if sent < len(pieces) and not self._wait(min(1.0, 1.0 / tokens_per_s)):
                    return
            usage = {
                "completion_tokens": predicted_n,
                "prompt_tokens": prompt_n,
                "total_tokens": prompt_n + predicted_n,
            }
            timings = _timings(
                prompt_n, predicted_n, tokens_per_s, getattr(self, "_prompt_tps", None), getattr(self, "_cache_n", 0)
            )
            self.wfile.write(chunk({}, reply.finish_reason, usage=usage, timings=timings))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except OSError:
            return


# --------------------------------------------------------------------------- public API


class FakeLlamaServer:
    """A llama-server look-alike on 127.0.0.1 whose behaviour tests switch with `set_mode`."""

    def __init__(
        self,
        mode: str = "ok",
        *,
        n_ctx: int = 4096,
        slots: int = 1,
        tokens_per_s: float = 200.0,
        prompt_tokens_per_s: float | None = None,
        think_tokens: int = 8000,
        facts: list[str] | None = None,
        template_thinks: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
        verbose: bool = False,
    ) -> None:
        if slots < 1:
            raise ValueError("slots must be >= 1")
        self._settings = Settings(
            mode=mode,
            n_ctx=n_ctx,
            tokens_per_s=tokens_per_s,
            prompt_tokens_per_s=prompt_tokens_per_s,
            think_tokens=think_tokens,
            facts=list(facts) if facts is not None else None,
            template_thinks=template_thinks,
        )
        self._settings.check()
        self.slots = slots
        self.host = host
        self.port = port
        self.verbose = verbose
        self.requests: list[dict[str, Any]] = []
        self.calls: list[str] = []  # "METHOD /path" of every request, control endpoints included
        self.streamed: list[int] = []  # tokens each streamed reply wrote before it ended or its client left
        self._lock = threading.Lock()
        self._failures_left = fail_count_of(self._settings)
        self._slow_left = self._settings.recover_after
        self._slots = threading.BoundedSemaphore(slots)
        self._held = 0  # requests held by `hang_when` right now
        self._last_prompt = ""
        self._stop_event = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    # ---------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        """Base URL, e.g. "http://127.0.0.1:54321" (only once started)."""
        if self._server is None:
            raise RuntimeError("FakeLlamaServer is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeLlamaServer:
        """Bind and serve in a daemon thread; returns self for chaining."""
        if self._server is not None:
            return self
        self._stop_event = threading.Event()
        server = _Server((self.host, self.port), _Handler)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-llama-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop promptly, even with hanging requests: pending waits end and sockets are closed."""
        server = self._server
        if server is None:
            return
        self._stop_event.set()
        server.shutdown()
        with self._lock:
            open_conns = list(self._connections)
            self._connections.clear()
        for conn in open_conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeLlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---------------------------------------------------------------- control

    def set_mode(self, mode: str, **options: Any) -> None:
        """Switch behaviour at runtime; options (Settings fields) persist until changed again."""
        unknown = set(options) - _OPTION_NAMES
        if unknown:
            raise ValueError(f"unknown option(s) {sorted(unknown)}; known: {sorted(_OPTION_NAMES)}")
        with self._lock:
            updated = replace(self._settings, mode=mode, **options)
            if updated.facts is not None:
                updated.facts = [str(f) for f in updated.facts]
            updated.check()
            self._settings = updated
            self._failures_left = fail_count_of(updated)
            self._slow_left = updated.recover_after

    def state(self) -> dict[str, Any]:
        """Current mode and options, as GET /_fake/mode returns them."""
        with self._lock:
            state = asdict(self._settings)
        state["slots"] = self.slots
        state["held"] = self._held
        return state

    def recorded(self) -> list[dict[str, Any]]:
        """A copy of the chat/completions bodies received so far."""
        with self._lock:
            return copy.deepcopy(self.requests)

    def clear_requests(self) -> None:
        """Forget recorded requests and calls (between test phases)."""
        with self._lock:
            self.requests.clear()
            self.calls.clear()
            self.streamed.clear()

    # ---------------------------------------------------------------- internals

    def _snapshot(self) -> Settings:
        with self._lock:
            return copy.deepcopy(self._settings)

    def _record(self, body: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(body)

    def _note_streamed(self, index: int | None, sent: int) -> int:
        """Streamed reply `index` has written `sent` tokens (None: a new one begins); returns its index."""
        with self._lock:
            if index is None:
                self.streamed.append(sent)
                return len(self.streamed) - 1
            if index < len(self.streamed):  # not cleared meanwhile
                self.streamed[index] = sent
            return index

    def _note_call(self, call: str) -> None:
        with self._lock:
            self.calls.append(call)

    def _take_failure(self) -> bool:
        """fail_then_ok bookkeeping: True for the first `fail_count` requests after set_mode."""
        with self._lock:
            if self._failures_left > 0:
                self._failures_left -= 1
                return True
            return False

    def _take_slow(self) -> bool:
        """slow mode bookkeeping: True while the machine is still busy (every request without recover_after)."""
        with self._lock:
            if self._slow_left is None:
                return True
            self._slow_left -= 1
            return self._slow_left >= 0

    def _track(self, conn: socket.socket, opened: bool) -> None:
        with self._lock:
            if opened:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """Run the fake as its own process until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (see the printed URL)")
    parser.add_argument("--mode", default="ok", choices=sorted(MODES))
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--tokens-per-s", type=float, default=200.0)
    parser.add_argument("--prompt-tokens-per-s", type=float, default=None)
    parser.add_argument("--think-tokens", type=int, default=8000)
    parser.add_argument("--fact", action="append", dest="facts", help="reply with this fact (repeatable)")
    parser.add_argument("--no-template-thinks", action="store_true", help="template ignores enable_thinking")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)

    fake = FakeLlamaServer(
        args.mode,
        n_ctx=args.n_ctx,
        slots=args.slots,
        tokens_per_s=args.tokens_per_s,
        prompt_tokens_per_s=args.prompt_tokens_per_s,
        think_tokens=args.think_tokens,
        facts=args.facts,
        template_thinks=not args.no_template_thinks,
        host=args.host,
        port=args.port,
        verbose=args.verbose,
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    fake.start()
    print(f"FAKE_LLAMA_SERVER_URL={fake.url}", flush=True)
    try:
        while not done.wait(0.2):
            pass
    finally:
        fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
