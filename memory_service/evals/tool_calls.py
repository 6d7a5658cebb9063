"""Tool calls a small model wrote as text in `content` instead of in the `tool_calls` field.

llama-server parses one call format per chat template; Qwen2.5-Coder-1.5B (and the field report's models)
often write the call as JSON in the text instead, with `finish_reason: stop`. A harness that does not read
those takes "the model asked for work" as "the model is done". So every balanced JSON object in the text is
looked at, wherever it sits (a ```json fence, a <tool_call> block, between prose), in the shapes small models
send: `{"name", "arguments"}`, `"parameters"` for `"arguments"`, arguments as a JSON string, the OpenAI
wrapper `{"type": "function", "function": {...}}`, the tool's name under `"function"` or `"tool"` instead of
`"name"` (and its arguments under `"args"` or `"input"`), a list of calls, and the Qwen2.5 GGUF template's doubled
braces `{{"name": ...}}` (with one brace too many or too few). The objects are found by a brace matcher rather
than a JSON repair library because the loop needs each call's span (to take it out of the history's text)
and must not turn prose into a call by guessing.

Never raises: the text is cut at MAX_TEXT characters and the scan at MAX_OBJECTS calls and MAX_STARTS
attempts, so a huge or hostile reply costs bounded time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .code_calls import call_marks, read_code_calls

MAX_TEXT = 20_000  # characters of content looked at (a 384-token reply is ~1,500)
MAX_OBJECTS = 32  # calls read from one reply at most
MAX_STARTS = 200  # `{` positions tried that did not give a JSON object

_SIGNIFICANT = re.compile(r'[{}"\\]')
# what remains of a fence or a <tool_call> block once the call inside it is taken out
_EMPTY_WRAPPERS = re.compile(r"```(?:[a-z]{1,12})?\s*```|`\s*`|<tool_call>\s*(?:</tool_call>)?|</tool_call>", re.I)
_ONLY_PUNCTUATION = re.compile(r"[\s\[\]{},:]*")  # a list's brackets, a stray brace
# text that looks like a call: the audit counts replies with such text but no call read (`looks_like_a_call`)
_CALL_MARK = re.compile(r'<tool_call>|<function=|"(?:name|function|tool|tool_name)"\s*:\s*"', re.I)
# where a call's name and arguments may be, besides "name" and "arguments" (seen: {"function": "recall", ...})
_NAME_KEYS = ("name", "function", "tool", "tool_name")
_ARGUMENT_KEYS = ("arguments", "parameters", "args", "input")


_Found = tuple[str, dict[str, Any] | None, str | None, bool]  # name, arguments, problem, offered


@dataclass(frozen=True)
class TextCall:
    """One call read from text. `arguments` is None when they were not a JSON object (`problem` says why);
    `offered` is False for a tool the model was not given (the loop answers it with a tool error)."""

    name: str
    arguments: dict[str, Any] | None
    problem: str | None
    offered: bool
    start: int  # the call's span in the content
    end: int


def read_calls(
    content: Any, offered: set[str] | frozenset[str], positional: Mapping[str, str] | None = None
) -> list[TextCall]:
    """Every call written in `content`, in order: JSON objects, then calls written as code
    (`Mark_handled({"key": "T-1"})`, `code_calls.py`) outside them. Objects that are not calls are skipped.
    `positional`: tool → the parameter one unnamed value goes to (`code_calls.positional_parameters`)."""
    if not isinstance(content, str):
        return []
    text = content[:MAX_TEXT]
    found = _json_calls(text, offered)
    taken = [(c.start, c.end) for c in found]
    for code in read_code_calls(text, offered, _object_at, positional):
        inside = [n for n, (start, end) in enumerate(taken) if code.start < end and start < code.end]
        if not inside and len(found) < MAX_OBJECTS:
            found.append(TextCall(code.name, code.arguments, code.problem, True, code.start, code.end))
        elif len(inside) == 1 and code.start <= taken[inside[0]][0] and taken[inside[0]][1] <= code.end:
            # `mark_handled: {"name": "mark_handled", ...}`: the JSON call, its span widened to the name before it
            found[inside[0]] = replace(found[inside[0]], start=code.start, end=code.end)
    return sorted(found, key=lambda c: c.start)


def _json_calls(text: str, offered: set[str] | frozenset[str]) -> list[TextCall]:
    found: list[TextCall] = []
    at, starts = 0, 0
    while len(found) < MAX_OBJECTS and starts < MAX_STARTS:
        begin = text.find("{", at)
        if begin < 0:
            break
        value, end = _object_at(text, begin)
        if value is None:
            starts += 1
            at = begin + 1
            continue
        calls = _calls_in(value, offered, 0)
        if not calls:  # an object, but not a call: look inside it (a wrapper this reader does not know)
            starts += 1
            at = begin + 1
            continue
        found.extend(TextCall(name, arguments, problem, known, begin, end) for name, arguments, problem, known in calls)
        at = end
    return found[:MAX_OBJECTS]


def without_calls(content: str, calls: list[TextCall]) -> str:
    """The content with the calls' text (and the fences or tags left empty around them) taken out."""
    kept, at = [], 0
    for call in sorted(calls, key=lambda c: c.start):
        if call.start >= at:
            kept.append(content[at : call.start])
            at = call.end
    kept.append(content[at:])
    rest = _EMPTY_WRAPPERS.sub("", "".join(kept)).strip()
    return "" if _ONLY_PUNCTUATION.fullmatch(rest) else rest


def looks_like_a_call(content: Any, offered: set[str] | frozenset[str] | tuple[str, ...] = ()) -> bool:
    """Text that has the marks of a call (a <tool_call> tag, `<function=`, a `"name": "` key, an offered
    tool's name in any case before `(` or `: {`). Prose that names a tool counts too: the audit over-reports."""
    if not isinstance(content, str):
        return False
    text = content[:MAX_TEXT]
    names = call_marks(offered)
    return bool(_CALL_MARK.search(text) or (names is not None and names.search(text)))


def _object_at(text: str, begin: int) -> tuple[Any, int]:
    """The JSON object starting at `begin` and where it ends, or (None, begin). Tolerates doubled braces and
    a missing or extra closing brace around an otherwise complete object."""
    end, closes = _match(text, begin)
    candidates: list[tuple[str, int]] = []
    if end is not None:
        piece = text[begin:end]
        candidates.append((piece, end))
        if piece.startswith("{{") and piece.endswith("}}"):
            candidates.append((piece[1:-1], end))
        candidates.append((_undouble(piece), end))
    # never closed: the object up to a `}` (the first that leaves it one deep, else the last), closed as deep
    # as it was there
    for close, depth in closes:
        piece = text[begin : close + 1]
        candidates.append((piece + "}" * depth, close + 1))
        candidates.append((_undouble(piece) + "}" * depth, close + 1))
    for candidate, stop in candidates:
        try:
            value = json.loads(candidate)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            return value, stop
    return None, begin


def _match(text: str, begin: int) -> tuple[int | None, list[tuple[int, int]]]:
    """Brace matching from `begin`, JSON strings respected: where the object ends, or (None, the `}` where it
    could end with the braces it lacks there: (position, depth after it))."""
    depth, in_string, skip = 0, False, -1
    first_one: tuple[int, int] | None = None
    last: tuple[int, int] | None = None
    for match in _SIGNIFICANT.finditer(text, begin):
        char, pos = match.group(), match.start()
        if pos == skip:  # the character after a backslash in a string
            continue
        if in_string:
            if char == "\\":
                skip = pos + 1
            elif char == '"':
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return pos + 1, []
            last = (pos, depth)
            if depth == 1 and first_one is None:
                first_one = last
    closes = [c for c in (first_one, last) if c is not None]
    return None, list(dict.fromkeys(closes))


def _undouble(piece: str) -> str:
    """`{{`→`{` and `}}`→`}` outside strings: the template's escaped braces, copied throughout an object."""
    out, in_string, at = [], False, 0
    while at < len(piece):
        char = piece[at]
        if in_string:
            out.append(char)
            if char == "\\" and at + 1 < len(piece):
                out.append(piece[at + 1])
                at += 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
            out.append(char)
        elif char in "{}" and piece[at + 1 : at + 2] == char:
            out.append(char)
            at += 1
        else:
            out.append(char)
        at += 1
    return "".join(out)


def _calls_in(value: Any, offered: set[str] | frozenset[str], depth: int) -> list[_Found]:
    """(name, arguments, problem, offered) of each call this JSON value holds (a list or a tool_calls wrapper
    may hold several)."""
    if depth > 3:
        return []
    if isinstance(value, list):
        return [call for item in value[:MAX_OBJECTS] for call in _calls_in(item, offered, depth + 1)]
    if not isinstance(value, dict):
        return []
    if isinstance(value.get("tool_calls"), list):
        return _calls_in(value["tool_calls"], offered, depth + 1)
    if isinstance(value.get("function"), dict) and "name" not in value:
        return _calls_in(value["function"], offered, depth + 1)
    raw_name = next((value[k] for k in _NAME_KEYS if k in value), None)
    name = raw_name.strip() if isinstance(raw_name, str) else ""
    argument_key = next((k for k in _ARGUMENT_KEYS if k in value), None)
    if not name or not (argument_key or raw_name in offered):
        return []  # a JSON answer with a "name" field (a person, a record) is not a call
    if argument_key == "parameters" and _is_schema(value["parameters"]):
        return [(name, None, _DEFINITION.format(name=name), name in offered)]
    arguments, problem = _arguments(value[argument_key] if argument_key else {})
    return [(name, arguments, problem, name in offered)]


_DEFINITION = (
    'That is the definition of the tool {name!r}, not a call. To call it, write {{"name": "{name}", '
    '"arguments": {{...}}}} with the values it needs.'
)


def _is_schema(parameters: Any) -> bool:
    """A JSON schema (an echoed tool definition's `parameters`), not arguments."""
    return (
        isinstance(parameters, dict)
        and parameters.get("type") == "object"
        and isinstance(parameters.get("properties"), dict)
    )


def _arguments(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    if raw is None:
        return {}, None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError):
            return None, "The arguments must be a JSON object; they were a string that is not JSON."
    if isinstance(raw, dict):
        return raw, None
    kind = type(raw).__name__.replace("str", "string").replace("NoneType", "null")
    return None, f'The arguments must be a JSON object like {{"key": "value"}}; they were a {kind}.'
