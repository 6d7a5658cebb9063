"""The one rule every string and JSON value obeys when it enters the service, and the repair of values stored
before the rule held.

Text is kept as given (no Unicode normalisation: what was saved is what every read returns), but it must be
text that UTF-8 can carry and SQLite can hold whole: no lone surrogate (U+D800-U+DFFF, which a JSON `\\udc80`
escape can smuggle in but no UTF-8 encoder writes, so the export and every answer holding it broke) and no
NUL. Inside a JSON value (`metadata`, Hindsight's content blocks and metadata) every key and string at any
depth obeys the same rule, numbers are finite (NaN, Infinity and 1e400, which Python's JSON reader turns into
infinity, have no JSON form an importer accepts), and nesting is bounded. One check, used by every type in
`types.py` and `hindsight.py`, so a route cannot forget a field.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_JSON_DEPTH = 32
NUL_RULE = "must not contain NUL characters (\\u0000)"
SURROGATE_RULE = "must not contain a lone surrogate (\\ud800-\\udfff without its pair): send valid Unicode"
NUMBER_RULE = "numbers must be finite JSON numbers (NaN, Infinity and numbers past ±1.8e308 such as 1e400 are refused)"
REPLACEMENT = "\ufffd"  # what a stored lone surrogate or NUL is shown as (docs/api.md)
_BAD = re.compile("[\x00\ud800-\udfff]")


def text_problem(value: str) -> str | None:
    """The rule `value` breaks, or None."""
    found = _BAD.search(value)
    if found is None:
        return None
    return NUL_RULE if found.group() == "\x00" else SURROGATE_RULE


def check_text(value: Any) -> Any:
    """A string's rule (anything else passes on, for the type's own check to word)."""
    if isinstance(value, str) and (problem := text_problem(value)) is not None:
        raise ValueError(problem)
    return value


def _shown(part: Any) -> str:
    """A path step for a message: a bad character shown as its escape (the message itself must be valid text)."""
    return _BAD.sub(lambda m: f"\\u{ord(m.group()):04x}", str(part)[:40])


def _where(path: tuple[Any, ...]) -> str:
    return "at " + ".".join(_shown(p) for p in path) + ": " if path else ""


def _children(node: Any, path: tuple[Any, ...]) -> list[tuple[Any, tuple[Any, ...]]]:
    if isinstance(node, dict):
        out: list[tuple[Any, tuple[Any, ...]]] = []
        for key, child in node.items():
            if not isinstance(key, str):
                raise ValueError(f"{_where(path)}keys must be strings")
            if (problem := text_problem(key)) is not None:
                raise ValueError(f"{_where((*path, key))}keys and strings {problem}")
            out.append((child, (*path, key)))
        return out
    if isinstance(node, list | tuple):
        return [(child, (*path, i)) for i, child in enumerate(node)]
    return []


def check_json(value: Any, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Every key and string valid text, every number finite, at most `max_depth` levels: without recursion, so a
    10,000-deep value is a 422, not a RecursionError when it is serialized later."""
    stack: list[tuple[Any, tuple[Any, ...], int]] = [(value, (), 1)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, str):
            if (problem := text_problem(node)) is not None:
                raise ValueError(f"{_where(path)}keys and strings {problem}")
        elif isinstance(node, float):
            if not math.isfinite(node):
                raise ValueError(f"{_where(path)}{NUMBER_RULE}")
        elif isinstance(node, dict | list | tuple):
            if depth > max_depth:
                raise ValueError(f"nested more than {max_depth} levels deep; flatten it")
            stack.extend((child, where, depth + 1) for child, where in _children(node, path))
        elif node is not None and not isinstance(node, bool | int):
            raise ValueError(f"{_where(path)}not a JSON value ({type(node).__name__})")
    return value


# ---------------------------------------------------------------- values stored before the rule


def repaired(value: Any) -> Any:
    """A stored JSON value made writable as strict UTF-8 JSON: a lone surrogate or NUL in a key or string becomes
    U+FFFD, a non-finite number null (what the API already showed for one). Iterative, like `check_json`."""
    if isinstance(value, str):
        return _BAD.sub(REPLACEMENT, value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if not isinstance(value, dict | list):
        return value
    root: Any = {} if isinstance(value, dict) else []
    stack: list[tuple[Any, Any]] = [(value, root)]
    while stack:
        source, target = stack.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, child in items:
            if isinstance(child, dict | list):
                copy: Any = {} if isinstance(child, dict) else []
                stack.append((child, copy))
            else:
                copy = repaired(child)
            if isinstance(target, dict):
                target[_BAD.sub(REPLACEMENT, key) if isinstance(key, str) else key] = copy
            else:
                target.append(copy)
    return root


# what json.dumps (ensure_ascii, the journal's writer) writes for a value that needs `repaired`; a surrogate
# pair (an emoji) matches too and is then walked for nothing, which is only slower
_STORED_SUSPECT = re.compile(r"\\u0000|\\u[dD][89a-fA-F]|NaN|Infinity")


def loads_stored(raw: str) -> Any:
    """A JSON column as the journal holds it, repaired when it could hold what the rule now refuses."""
    value = json.loads(raw)
    return repaired(value) if _STORED_SUSPECT.search(raw) else value
