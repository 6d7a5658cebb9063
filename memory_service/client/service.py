"""The one way this project opens an HTTP client to the service: base URL, bearer key, no proxy from the env.

The CLI, the benchmarks, the evals and the tests all talk to the service; one
factory keeps their headers and settings from drifting apart. Kept free of heavy
imports, so a command-line call stays quick.
"""

from __future__ import annotations

from typing import Any

import httpx


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def service_client(url: str, api_key: str | None, timeout: float = 60.0, **options: Any) -> httpx.Client:
    """A client for the service at `url`; `trust_env=False` so a proxy variable never reroutes loopback calls."""
    return httpx.Client(base_url=url, headers=auth_headers(api_key), timeout=timeout, trust_env=False, **options)


def async_service_client(url: str, api_key: str | None, timeout: float = 60.0, **options: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers=auth_headers(api_key), timeout=timeout, trust_env=False, **options)
