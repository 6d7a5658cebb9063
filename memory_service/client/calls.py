"""A call of the API as the client builds it, and the small readers of its answers (core.py, gate_calls.py)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx
from pydantic import TypeAdapter

T = TypeVar("T")

REQUEST_ID = "X-Request-ID"


@dataclass
class Call(Generic[T]):
    """One request and how to read its answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    json: Any = None
    content: bytes | None = None
    extra_timeout_s: float = 0.0
    idempotent: bool = True  # safe to resend when the answer was lost
    accept: tuple[int, ...] = ()  # error statuses that are answers, not failures (a denied consume)
    headers: dict[str, str] = field(default_factory=lambda: {REQUEST_ID: uuid.uuid4().hex})


@functools.cache
def _adapter(kind: Any) -> TypeAdapter:
    return TypeAdapter(kind)


def read_as(kind: Any) -> Callable[[httpx.Response], Any]:
    """Read an answer as `kind`: a pydantic model or a dataclass (the ledger's record), one way for both."""
    adapter = _adapter(kind)
    return lambda response: adapter.validate_python(response.json())


def read_nothing(response: httpx.Response) -> None:
    return None


def drop_none(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}
