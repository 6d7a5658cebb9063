"""A real uvicorn server on loopback around the limit routes, with a settable clock.

The full service needs a model server; these tests only need the limit routes,
so they run the production app over a limit store alone.
"""

from __future__ import annotations

import sqlite3
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
from fastapi import FastAPI
from inprocess import LoopbackServer

from memory_service.app import create_app
from memory_service.client.service import service_client
from memory_service.config import Settings
from memory_service.services import LimitsAndKeys
from memory_service.storage.keys import KeyStore
from memory_service.storage.limits import LimitStore

KEYS = {"ka": "team-a", "kb": "team-b"}
# httpx builds an SSL context per client even for http://; the concurrency tests open
# dozens of clients, so they share one (building each costs ~20 ms of CPU).
_SSL = ssl.create_default_context()


class Clock:
    """Injected `now`: tests move time by hand, to the second, across DST changes."""

    def __init__(self, start: datetime) -> None:
        self.moment = start

    def __call__(self) -> datetime:
        return self.moment

    def set(self, moment: datetime | str) -> None:
        self.moment = datetime.fromisoformat(moment) if isinstance(moment, str) else moment
        assert self.moment.tzinfo is not None

    def advance(self, **delta: float) -> None:
        self.moment += timedelta(**delta)


def make_app(store: LimitStore, keys_path: Path) -> FastAPI:
    """The production app (handlers, error shapes, middleware) over just the stores these routes use."""
    settings = Settings(api_keys=KEYS)
    services = LimitsAndKeys(settings, store, KeyStore(keys_path))
    return create_app(settings, services=services)  # type: ignore[arg-type]  # the limit routes' part of Services only


class Server(LoopbackServer):
    """uvicorn in a background thread around the limit routes (no lifespan: the test owns the stores)."""

    def __init__(self, app: FastAPI) -> None:
        super().__init__(app, lifespan="off")

    def client(self, key: str | None = "ka") -> httpx.Client:
        return service_client(self.url, key, timeout=30, verify=_SSL)


def dump(db_path: Path) -> list[tuple[str, list[tuple[object, ...]]]]:
    """Every row of every table: equal before and after = nothing changed."""
    with sqlite3.connect(db_path) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return [(t, sorted(db.execute(f"SELECT * FROM {t}").fetchall(), key=repr)) for t in tables]


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def concurrently(calls: list[Callable[[], httpx.Response]]) -> list[httpx.Response]:
    """Run every call on its own thread, released together by a barrier."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], httpx.Response]) -> httpx.Response:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))
