"""The one way this project opens an HTTP client to the service (base URL, bearer key, no proxy from the env)
and puts a caller's value into a URL path (`path_segment`).

The CLI, the benchmarks, the evals and the tests all talk to the service; one
factory keeps their headers and settings from drifting apart. Kept free of heavy
imports, so a command-line call stays quick.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote

import httpx

_DOT_SEGMENTS = frozenset({".", ".."})


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def path_segment(value: str, what: str = "id") -> str:
    """`value` percent-encoded as exactly one path segment (`/ . % ? #` included), for every id, limit name or
    key a caller puts into a URL path.

    Encoding alone is not enough: httpx resolves a literal `..`, and a proxy or server may decode `%2e%2e` or
    `%2F` before routing, so `forget("../limits/burst")` would delete a limit. A value that is empty or that,
    decoded any number of times, holds a `.` or `..` segment is refused before anything is sent.
    """
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, not {type(value).__name__}")
    decoded, previous = value, ""
    while decoded != previous:  # each decoding that changes the text shortens it: this ends
        previous, decoded = decoded, unquote(decoded)
    if not value or any(part in _DOT_SEGMENTS for part in re.split(r"[/\\]", decoded)):
        raise ValueError(
            f"{what} {value!r} is not sent: it is empty or holds a '.' or '..' path segment (percent-encoded or "
            "not), which would address another resource than the one named"
        )
    return quote(value, safe="")


def service_client(url: str, api_key: str | None, timeout: float = 60.0, **options: Any) -> httpx.Client:
    """A client for the service at `url`; `trust_env=False` so a proxy variable never reroutes loopback calls."""
    return httpx.Client(base_url=url, headers=auth_headers(api_key), timeout=timeout, trust_env=False, **options)


def async_service_client(url: str, api_key: str | None, timeout: float = 60.0, **options: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers=auth_headers(api_key), timeout=timeout, trust_env=False, **options)
