"""Turn a raw model reply into validated facts, or a visible error. Never a silent empty result.

Handles what small local models actually send: closed and unclosed `<think>`
blocks, code fences, and tool-call markup where JSON was expected (llama.cpp
leaves it in `content` with `finish_reason: stop`; that is a parse failure to
show, not an empty answer).
"""

from __future__ import annotations

import json
import re

from pydantic import ValidationError

from .errors import BadReply
from .prompt import ExtractedFacts

_CLOSED_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_TOOL_MARKUP = re.compile(r"<tool_call>|<\s*function\s*=|<\|tool_call|\[TOOL_CALLS\]", re.IGNORECASE)
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$", re.IGNORECASE)


def strip_thinking(content: str) -> str:
    """Drop closed think blocks; for an unclosed one, keep only what follows its last JSON start."""
    text = _CLOSED_THINK.sub("", content)
    lowered = text.lower()
    if "</think>" in lowered:  # a close tag with no opening (the template opened it)
        text = text[lowered.rindex("</think>") + len("</think>"):]
        lowered = text.lower()
    if "<think>" in lowered:
        tail = text[lowered.index("<think>") + len("<think>"):]
        start = tail.rfind('{"facts"')
        if start < 0:
            start = tail.rfind("{")
        text = tail[start:] if start >= 0 else ""
    return text.strip()


def parse_facts(content: str, finish_reason: str) -> list[str]:
    if _TOOL_MARKUP.search(content):
        raise BadReply("the model replied with tool-call markup instead of facts JSON", raw_reply=content)
    text = _FENCE.sub("", strip_thinking(content)).strip()
    if not text:
        reason = "the output cap was reached while the model was still thinking" if finish_reason == "length" \
            else "the model's reply held no JSON"
        raise BadReply(f"empty reply: {reason}", raw_reply=content)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if finish_reason == "length":
            raise BadReply("reply cut at the output cap (finish_reason=length): JSON incomplete", raw_reply=content) from exc
        raise BadReply(f"reply is not JSON: {exc.msg} at char {exc.pos}", raw_reply=content) from exc
    try:
        parsed = ExtractedFacts.model_validate(data)
    except ValidationError as exc:
        raise BadReply(f"reply JSON does not match the facts schema: {exc.errors()[0]['msg']}", raw_reply=content) from exc
    return [fact.strip() for fact in parsed.facts if fact and fact.strip()]
