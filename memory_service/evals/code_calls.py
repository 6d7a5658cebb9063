"""Tool calls a small model wrote as code: `Mark_handled({"key": "T-1"})`, `mark_handled: {"key": "T-1"}`,
`recall(query="wifi password", k=3)`, `Mark_handled({key: 'T-1'})`, `Mark handled {"key": "T-1"}`,
`Mark_handled("T-1")` (one value, for the tool's one parameter), `Mark_handled` + a line break +
`{"key": "T-1"}`, `<function name="recall" arguments={"query": "wifi"}>`.

Qwen2.5-Coder-1.5B writes about one call in three this way in the agent eval (47 in one run), almost always
with the tool's name capitalised. A harness that does not read them scores "the model asked for work" as "the
model is done", the field report's failure #1 again.

Only an offered tool's name starts a call (any case, not inside a longer word), and only when an argument
list that parses follows it: `(` + an object + `)`, `(` + keyword arguments + `)`, `(` + one quoted string or
number + `)`, `()`, an object after `:`, `,`, a space or a line break, or `<function name=… arguments=` + an
object. An object is JSON or written as code (bare keys, single quotes). One positional value is the tool's
argument only when the tool has one parameter to give it to (`positional`); otherwise the call is answered
with how to name it. `_` in a name may be a space. Prose that merely names a tool ("then call
mark_handled(key) for each") reads as nothing.

Every step is linear in the text: the names are one alternation of literals, keyword arguments are read by a
hand-written tokenizer (a regex with nested quantifiers hung on a hostile 20k-character reply), and JSON
values by the standard decoder. Never raises; at most MAX_CALLS calls and MAX_PAIRS arguments per call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_CALLS = 32
MAX_PAIRS = 32  # keyword arguments in one call
MAX_MISSES = 64  # names followed by `(`/`:` that did not parse (each costs up to one pass over the text)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_WORD_CHAR = re.compile(r"[\w.\-]")
_NUMBER_START = re.compile(r"-?[0-9]")
_BARE = {"true": True, "false": False, "null": None, "none": None}
_DECODER = json.JSONDecoder()

ObjectAt = Callable[[str, int], tuple[Any, int]]  # tool_calls._object_at: a JSON object and where it ends


@dataclass(frozen=True)
class CodeCall:
    name: str  # the offered tool's own spelling
    arguments: dict[str, Any] | None  # None when `problem` says why they cannot be used
    start: int
    end: int
    problem: str | None = None


@dataclass(frozen=True)
class _Positional:
    """`name("T-1")`: one value given without its parameter's name."""

    value: Any


_UNNAMED = (
    '{name} takes its arguments by name. Write {{"name": "{name}", "arguments": {{...}}}} with each '
    "value under its parameter's name."
)


def positional_parameters(tools: Iterable[dict[str, Any]]) -> dict[str, str]:
    """Tool name → the parameter one unnamed value goes to: its only required parameter, else its only one.
    Tools in the OpenAI function form; a tool with no such parameter is left out."""
    out: dict[str, str] = {}
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        schema = function.get("parameters")
        schema = schema if isinstance(schema, dict) else {}
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        listed = schema.get("required")
        required = [r for r in listed if isinstance(r, str) and r in properties] if isinstance(listed, list) else []
        names = required if len(required) == 1 else list(properties) if len(properties) == 1 else []
        if len(names) == 1:
            out[function["name"]] = names[0]
    return out


def _names_pattern(offered: Iterable[str]) -> re.Pattern[str] | None:
    """One pattern for every offered name followed by `(`, `:`, `,` or `{`, longest name first, any case."""
    alternatives = _alternatives(offered)
    if alternatives is None:
        return None
    # `name(`, `name:`, `name,` or `name` before `{` (on the same line or the next), or the XML-ish
    # `<function name="name" arguments=` (then a JSON object, read as after `:`)
    return re.compile(
        r"(?:<function[ \t]+name=[\"']?(" + alternatives + r")[\"']?[ \t]+(?:arguments|parameters)(=)"
        r"|(" + alternatives + r")[ \t]{0,8}(?:\r?\n[ \t]{0,8})?([(:,]|(?=\{)))",
        re.I,
    )


def call_marks(offered: Iterable[str]) -> re.Pattern[str] | None:
    """An offered name (not inside a longer word) before `(` or `: {`: what the audit counts as call text."""
    alternatives = _alternatives(offered)
    if alternatives is None:
        return None
    return re.compile(r"(?<![\w.\-])(?:" + alternatives + r")[ \t]{0,8}(?:\(|[:,]?[ \t\r\n]{0,8}\{)", re.I)


def _alternatives(offered: Iterable[str]) -> str | None:
    """The names as one alternation, longest first; `_` may be written as a space (`Mark handled {…}`, seen)."""
    names = sorted({n for n in offered if n}, key=len, reverse=True)
    return "|".join(re.escape(n).replace("_", "[ _]") for n in names) if names else None


def read_code_calls(
    text: str, offered: Iterable[str], object_at: ObjectAt, positional: Mapping[str, str] | None = None
) -> list[CodeCall]:
    """Every call written as code in `text`, in order. `positional`: tool → the parameter one unnamed value
    goes to (`positional_parameters`)."""
    pattern = _names_pattern(offered)
    if pattern is None:
        return []
    spelling = {n.casefold(): n for n in offered}
    found: list[CodeCall] = []
    misses = 0
    for match in pattern.finditer(text):
        if len(found) >= MAX_CALLS or misses >= MAX_MISSES:
            break
        if found and match.start() < found[-1].end:
            continue
        if match.start() > 0 and _WORD_CHAR.match(text, match.start() - 1):
            continue  # part of a longer word or a dotted name
        name, opener = (match.group(1), ":") if match.group(1) else (match.group(3), match.group(4) or ":")
        parsed = _arguments_after(text, match.end(), opener, object_at)
        if parsed is None:
            misses += 1
        else:
            arguments, end = parsed
            known = spelling.get(name.casefold().replace(" ", "_"), name)
            end = _tag_end(text, end) if match.group(1) else end
            if isinstance(arguments, _Positional):
                parameter = (positional or {}).get(known)
                if parameter is None:
                    found.append(CodeCall(known, None, match.start(), end, _UNNAMED.format(name=known)))
                    continue
                arguments = {parameter: arguments.value}
            found.append(CodeCall(known, arguments, match.start(), end))
    return found


def _tag_end(text: str, at: int) -> int:
    """Past the `>` or `/>` that closes a `<function …>` tag right after its arguments, if there is one."""
    for close in ("/>", ">"):
        if text.startswith(close, _skip_space(text, at)):
            return _skip_space(text, at) + len(close)
    return at


def _arguments_after(
    text: str, at: int, opener: str, object_at: ObjectAt
) -> tuple[dict[str, Any] | _Positional, int] | None:
    at = _skip_space(text, at)
    if opener in ":,":
        return _object(text, at, object_at) if text.startswith("{", at) else None
    if text.startswith(")", at):
        return {}, at + 1
    if text.startswith("{", at):
        parsed = _object(text, at, object_at)
        if parsed is None:
            return None
        end = _skip_space(text, parsed[1])
        return (parsed[0], end + 1) if text.startswith(")", end) else None
    if text.startswith(("'", '"'), at) or _NUMBER_START.match(text, at):
        return _one_value(text, at)
    return _keyword_arguments(text, at)


def _one_value(text: str, at: int) -> tuple[_Positional, int] | None:
    """`"T-1")` → (the value, after the `)`): one quoted string or number, not a list of them."""
    parsed = _value_at(text, at)
    if parsed is None or not isinstance(parsed[0], (str, int, float)):
        return None
    end = _skip_space(text, parsed[1])
    return (_Positional(parsed[0]), end + 1) if text.startswith(")", end) else None


def _object(text: str, at: int, object_at: ObjectAt) -> tuple[dict[str, Any], int] | None:
    """A JSON object at `at`, or one written as code (`{key: 'T-1'}`: bare keys, single quotes), and where it
    ends."""
    value, end = object_at(text, at)
    if isinstance(value, dict):
        return value, end
    return _keyword_arguments(text, _skip_space(text, at + 1), close="}")


def _keyword_arguments(text: str, at: int, close: str = ")") -> tuple[dict[str, Any], int] | None:
    """`key="T-1", k=3)` → ({"key": "T-1", "k": 3}, after the `)`), or None when it is not that shape.
    `close`: the character that ends the list (`}` for an object written as code)."""
    arguments: dict[str, Any] = {}
    for _ in range(MAX_PAIRS):
        name = _IDENTIFIER.match(text, at)
        if name is None:
            return None
        at = _skip_space(text, name.end())
        if not text.startswith(("=", ":"), at):
            return None
        parsed = _value_at(text, _skip_space(text, at + 1))
        if parsed is None:
            return None
        arguments[name.group()], at = parsed
        at = _skip_space(text, at)
        if text.startswith(close, at):
            return arguments, at + 1
        if not text.startswith(",", at):
            return None
        at = _skip_space(text, at + 1)
        if text.startswith(close, at):  # a trailing comma
            return arguments, at + 1
    return None


def _value_at(text: str, at: int) -> tuple[Any, int] | None:
    """A JSON value, a single-quoted string or a bare true/false/null/None at `at`, and where it ends."""
    if text.startswith("'", at):
        close = _closing_quote(text, at + 1)
        return None if close < 0 else (text[at + 1 : close].replace("\\'", "'"), close + 1)
    bare = _IDENTIFIER.match(text, at)
    if bare is not None and bare.group().casefold() in _BARE:
        return _BARE[bare.group().casefold()], bare.end()
    try:
        return _DECODER.raw_decode(text, at)
    except (ValueError, RecursionError):
        return None


def _closing_quote(text: str, at: int) -> int:
    while True:
        close = text.find("'", at)
        if close < 0 or text[close - 1] != "\\":
            return close
        at = close + 1


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    return at
