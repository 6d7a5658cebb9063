"""How a LangGraph item sits in the service: one saved text per (namespace, key), found again by its tags.

Pure functions, no I/O and no LangGraph import, so the mapping is read (and tested) in one place:
- the text is a JSON envelope `{"namespace": [...], "key": ..., "value": {...}}`: the value comes back
  exactly as put (`json.loads` of what was saved), recall searches its words, and the listing that finds an
  item carries everything needed to rebuild it (no second request);
- tags, each a hash so any label or key fits the 64-character tag rule: one per namespace prefix (the empty
  one included, which marks every item of the store) so a prefix search is a tag filter; one for the item;
  one per top-level scalar field of the value, so an equality filter runs in the service. A value whose
  fields do not all fit the 32-tag limit carries `PARTIAL` instead, and is matched on this side;
- the idempotency key is derived from (agent, namespace, key, text) under `langgraph:`, so a resent put
  returns the first save, and a caller's key never meets the service's reserved prefixes.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_TAGS = 32  # the service's limit (contract/types.py MAX_TAGS)
MAX_DEPTH = 16  # namespace labels: their prefix tags plus the item's leave room for field tags
NS_TAG, ITEM_TAG, FIELD_TAG = "lg:ns:", "lg:item:", "lg:eq:"
PARTIAL = "lg:eq:partial"  # some scalar field of the value has no tag: equality is checked on this side
KEY_PREFIX = "langgraph:"
_DIGITS = 40  # hex digits of sha256 kept: 160 bits, and a tag stays within 64 characters


def _digest(*parts: Any) -> str:
    payload = json.dumps(parts, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:_DIGITS]


def check_namespace(namespace: tuple[str, ...], *, allow_empty: bool = True) -> None:
    """LangGraph's label rules (non-empty strings without `.`), and at most MAX_DEPTH labels."""
    if not namespace and not allow_empty:
        raise ValueError("a namespace needs at least one label")
    if len(namespace) > MAX_DEPTH:
        raise ValueError(f"namespace {namespace!r} has {len(namespace)} labels; this store takes at most {MAX_DEPTH}")
    for label in namespace:
        if not isinstance(label, str) or not label or "." in label:
            raise ValueError(f"namespace label {label!r} in {namespace!r}: labels are non-empty strings without '.'")


def prefix_tag(prefix: tuple[str, ...]) -> str:
    return NS_TAG + _digest("ns", *prefix)


def item_tag(namespace: tuple[str, ...], key: str) -> str:
    return ITEM_TAG + _digest("item", list(namespace), key)


def _scalar(value: Any) -> list[Any] | None:
    """The field value as the tag sees it: equal under Python's `==` (1, 1.0 and True alike) means one tag."""
    if value is None or isinstance(value, str):
        return [value]
    if isinstance(value, bool | int | float):
        try:
            number = float(value)
        except OverflowError:
            return None
        return [number] if math.isfinite(number) else None
    return None


def field_tag(field: str, value: Any) -> str | None:
    scalar = _scalar(value)
    return None if scalar is None else FIELD_TAG + _digest("eq", field, *scalar)


def tags_for(namespace: tuple[str, ...], key: str, value: Mapping[str, Any]) -> list[str]:
    """Every prefix's tag, the item's, then one per scalar field while they fit (else PARTIAL)."""
    tags = [prefix_tag(namespace[:depth]) for depth in range(len(namespace) + 1)]
    tags.append(item_tag(namespace, key))
    fields = [tag for name, field_value in value.items() if (tag := field_tag(name, field_value))]
    scalar_fields = sum(1 for v in value.values() if isinstance(v, str | int | float) or v is None)
    room = MAX_TAGS - len(tags) - 1  # one left for PARTIAL
    if len(fields) == scalar_fields and len(fields) <= room + 1:
        return tags + fields
    return tags + fields[:room] + [PARTIAL]


def idempotency_key(agent_id: str, text: str) -> str:
    """The same text (namespace, key and value) for the same agent: the same save."""
    return KEY_PREFIX + _digest("put", agent_id, text)


def envelope_text(namespace: tuple[str, ...], key: str, value: Mapping[str, Any]) -> str:
    return json.dumps({"namespace": list(namespace), "key": key, "value": dict(value)}, ensure_ascii=False)


@dataclass(frozen=True)
class Stored:
    """An item read back from a saved text."""

    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]


def read_envelope(text: str) -> Stored | None:
    """The item a saved text holds; None for a text this store did not write."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or set(data) != {"namespace", "key", "value"}:
        return None
    namespace, key, value = data["namespace"], data["key"], data["value"]
    if not isinstance(namespace, list) or not all(isinstance(label, str) for label in namespace):
        return None
    if not isinstance(key, str) or not isinstance(value, dict):
        return None
    return Stored(tuple(namespace), key, value)


# -- filters (as LangGraph's InMemoryStore applies them) and their part the service can run -------------------


def equality_tags(flt: Mapping[str, Any] | None) -> list[str]:
    """Tags for the filter's equality conditions on scalars: what the service filters before ranking. Not for
    None: a value without the field matches it too (`value.get(name) == None`), and carries no tag for it."""
    tags = []
    for name, condition in (flt or {}).items():
        if isinstance(condition, dict):
            if "$eq" not in condition:
                continue
            condition = condition["$eq"]
        tag = None if condition is None else field_tag(name, condition)
        if tag is not None:
            tags.append(tag)
    return tags


def _operator(value: Any, operator: str, operand: Any) -> bool:
    if operator == "$eq":
        return bool(value == operand)
    if operator == "$ne":
        return bool(value != operand)
    if operator not in ("$gt", "$gte", "$lt", "$lte"):
        raise ValueError(f"unsupported filter operator {operator!r}: $eq, $ne, $gt, $gte, $lt or $lte")
    try:
        left, right = float(value), float(operand)
    except (TypeError, ValueError):
        return False
    return {"$gt": left > right, "$gte": left >= right, "$lt": left < right, "$lte": left <= right}[operator]


def _matches_value(value: Any, condition: Any) -> bool:
    if isinstance(condition, dict):
        if any(name.startswith("$") for name in condition):
            return all(_operator(value, op, operand) for op, operand in condition.items())
        return isinstance(value, dict) and all(_matches_value(value.get(k), c) for k, c in condition.items())
    if isinstance(condition, list | tuple):
        return (
            isinstance(value, list | tuple)
            and len(value) == len(condition)
            and all(_matches_value(v, c) for v, c in zip(value, condition, strict=True))
        )
    return bool(value == condition)


def matches(value: Mapping[str, Any], flt: Mapping[str, Any] | None) -> bool:
    return all(_matches_value(value.get(name), condition) for name, condition in (flt or {}).items())


def namespace_matches(namespace: tuple[str, ...], kind: str, path: tuple[str, ...]) -> bool:
    """LangGraph's MatchCondition: `path` (with `*` for any label) at the start (prefix) or end (suffix)."""
    if len(namespace) < len(path):
        return False
    pairs = zip(namespace, path) if kind == "prefix" else zip(reversed(namespace), reversed(path))
    return all(want == "*" or have == want for have, want in pairs)


def fixed_prefix(path: tuple[str, ...]) -> tuple[str, ...]:
    """The labels before the first wildcard: the prefix whose tag narrows a listing."""
    for index, label in enumerate(path):
        if label == "*":
            return path[:index]
    return path
