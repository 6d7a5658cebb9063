"""The chat wire as the proxy reads it: a request within bounds, the texts of its messages, the brief's one
place, and the final answer of a reply (whole or streamed).

The brief goes at the end of the client's first system message (or in a system message of its own, first,
when there is none): the same place in every request of a session, so the prompt's prefix, and llama.cpp's
prompt cache, stay the same turn after turn. Not a second system message: several chat templates (Gemma,
Mistral's) refuse a system message anywhere but first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MAX_BODY_BYTES = 8 << 20  # a long agent conversation with tool schemas is well under; images inline may not be
MAX_MESSAGES = 4096


class BadRequest(ValueError):
    """A request the proxy refuses before anything is sent on: `status` and a sentence saying what to change."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param = message, status, param


def error_body(message: str, kind: str, param: str | None = None, code: int | str | None = None) -> dict[str, Any]:
    """OpenAI's error shape, so the client's own exceptions carry the message."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def parse_chat(raw: bytes) -> dict[str, Any]:
    """The request as JSON, checked only as far as the proxy reads it: the rest is the upstream's to judge."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the request body is not JSON: send a chat completion request as a JSON object") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object with `messages`")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("`messages` must be a non-empty array of {role, content} objects", param="messages")
    if len(messages) > MAX_MESSAGES:
        raise BadRequest(f"`messages` holds {len(messages)} messages, at most {MAX_MESSAGES}", param="messages")
    for n, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest(f"messages.{n} must be an object with a string `role`", param=f"messages.{n}")
    return body


def text_of(content: Any) -> str:
    """A message's text: the string, or its text parts joined (images and audio are not text to keep)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type", "text") == "text"]
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def first_text(messages: list[dict[str, Any]], role: str) -> str:
    return next((text_of(m.get("content")) for m in messages if m.get("role") == role), "")


def with_brief(messages: list[dict[str, Any]], brief: str) -> list[dict[str, Any]]:
    """The messages with the brief at its one place (a new list; the client's messages are not changed)."""
    out = list(messages)
    at = next((n for n, m in enumerate(out) if m.get("role") == "system"), None)
    if at is None:
        return [{"role": "system", "content": brief}, *out]
    system = dict(out[at])
    content = system.get("content")
    if isinstance(content, list):
        system["content"] = [*content, {"type": "text", "text": "\n\n" + brief}]
    else:
        system["content"] = f"{text_of(content)}\n\n{brief}" if text_of(content) else brief
    out[at] = system
    return out


def answer_of(body: Any) -> str | None:
    """The final answer of a whole reply: the first choice's text, unless it calls tools (a step, not an answer)."""
    try:
        choice = body["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(message, dict) or message.get("tool_calls") or choice.get("finish_reason") == "tool_calls":
        return None
    text = text_of(message.get("content"))
    return text if text.strip() else None


@dataclass
class StreamedAnswer:
    """The final answer of a streamed reply, read off its server-sent events as they pass (first choice only)."""

    pieces: list[str] = field(default_factory=list)
    tool_calls: bool = False
    finish: str | None = None
    _rest: bytes = b""

    def feed(self, chunk: bytes) -> None:
        lines = (self._rest + chunk).split(b"\n")
        self._rest = lines.pop()
        for line in lines:
            if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
                self._event(line[5:])

    def _event(self, data: bytes) -> None:
        try:
            choice = json.loads(data)["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            return  # a usage-only chunk, or not JSON: nothing of the answer
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            return
        delta = choice.get("delta") or {}
        if isinstance(delta, dict):
            if isinstance(delta.get("content"), str):
                self.pieces.append(delta["content"])
            if delta.get("tool_calls"):
                self.tool_calls = True
        if choice.get("finish_reason"):
            self.finish = str(choice["finish_reason"])

    def answer(self) -> str | None:
        """The text, once the reply finished without calling a tool; None for a step or a cut-off stream."""
        if self.finish is None or self.finish == "tool_calls" or self.tool_calls:
            return None
        text = "".join(self.pieces)
        return text if text.strip() else None
