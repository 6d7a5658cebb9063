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

from .errors import BadReply, LoopedReply, TruncatedReply
from .prompt import ExtractedFacts

_CLOSED_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_TOOL_MARKUP = re.compile(r"<tool_call>|<\s*function\s*=|<\|tool_call|\[TOOL_CALLS\]", re.IGNORECASE)
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$", re.IGNORECASE)
_CLOSE_TAG = re.compile(r"</think>", re.IGNORECASE)
_OPEN_TAG = re.compile(r"\s*<think>", re.IGNORECASE)


def strip_thinking(content: str) -> str:
    """Drop closed think blocks; for an unclosed one, keep only what follows its last JSON start."""
    text = _CLOSED_THINK.sub("", content)
    # tags found in `text` itself, never by an index into text.lower(): "İ".lower() is two characters
    closes = list(_CLOSE_TAG.finditer(text))
    if closes:  # a close tag with no opening (the template opened it)
        text = text[closes[-1].end() :]
    opened = _OPEN_TAG.match(text)
    if opened:  # unclosed: the answer, if any, is its last JSON object
        tail = text[opened.end() :]
        start = tail.rfind('{"facts"')
        if start < 0:
            start = tail.rfind("{")
        text = tail[start:] if start >= 0 else ""
    return text.strip()


def parse_facts(content: str, finish_reason: str, reasoning: str = "") -> list[str]:
    """Facts from `content` only; `reasoning` (the server's reasoning_content) is used to explain, never as output.

    finish_reason "loop" (the client stopped a reply that repeated itself) is a cut like "length": the complete
    items before it are kept, on a `LoopedReply`."""
    if finish_reason == "loop":
        complete = salvage_facts(_FENCE.sub("", strip_thinking(content)).strip())
        raise LoopedReply(
            f"reply stopped in a repetition loop: {len(complete)} complete fact(s) before it",
            facts=complete,
            raw_reply=content,
        )
    direct = _as_facts(_FENCE.sub("", content.strip()).strip())
    if direct is not None:  # plain schema JSON: markup inside a fact's text is just text
        return direct
    if _TOOL_MARKUP.search(content):
        raise BadReply("the model replied with tool-call markup instead of facts JSON", raw_reply=content)
    text = _FENCE.sub("", strip_thinking(content)).strip()
    if not text:
        if reasoning.strip():
            raise BadReply(
                f"empty reply: the model answered only in reasoning_content ({len(reasoning)} chars), so thinking "
                "is on despite enable_thinking=false; run `memory-service doctor` and use a template or model "
                "that honours it",
                raw_reply=(content + "\n" if content else "") + "[reasoning_content]\n" + reasoning[:4000],
            )
        reason = (
            "the output cap was reached while the model was still thinking"
            if finish_reason == "length"
            else "the model's reply held no JSON"
        )
        raise BadReply(f"empty reply: {reason}", raw_reply=content)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if finish_reason == "length":
            complete = salvage_facts(text)
            raise TruncatedReply(
                f"reply cut at the output cap (finish_reason=length): JSON incomplete, "
                f"{len(complete)} complete fact(s) before the cut",
                facts=complete,
                raw_reply=content,
            ) from exc
        raise BadReply(f"reply is not JSON: {exc.msg} at char {exc.pos}", raw_reply=content) from exc
    try:
        parsed = ExtractedFacts.model_validate(data)
    except ValidationError as exc:
        raise BadReply(
            f"reply JSON does not match the facts schema: {exc.errors()[0]['msg']}", raw_reply=content
        ) from exc
    return [fact.strip() for fact in parsed.facts if fact and fact.strip()]


_FACTS_ARRAY = re.compile(r'^\{\s*"facts"\s*:\s*\[\s*')
_ITEM_SEP = re.compile(r"\s*,\s*")  # between items


def salvage_facts(text: str) -> list[str]:
    """The complete string items of a `{"facts": [...` reply cut mid-way (the schema grammar made them final)."""
    match = _FACTS_ARRAY.match(text)
    if not match:
        return []
    decoder = json.JSONDecoder()
    pos, facts = match.end(), []
    while pos < len(text) and text[pos] == '"':
        try:
            item, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break  # the item the cap cut off
        if not isinstance(item, str):
            break
        facts.append(item.strip())  # a closing quote is final: the item is complete
        sep = _ITEM_SEP.match(text, end)
        if not sep:
            break
        pos = sep.end()
    return [f for f in facts if f]


def _as_facts(text: str) -> list[str] | None:
    """The facts if `text` is exactly a valid facts object, else None (the caller explains why)."""
    if not text.startswith("{"):
        return None
    try:
        parsed = ExtractedFacts.model_validate(json.loads(text))
    except (json.JSONDecodeError, ValidationError):
        return None
    return [fact.strip() for fact in parsed.facts if fact and fact.strip()]
