"""Daily limits and the handled ledger: real HTTP, real SQLite and real PostgreSQL, an injected clock.

Every test of the `env` fixture runs on both backends: the same contract.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from limits_helpers import Clock, Server, concurrently, dump, make_app, utc

from memory_service.cli import limits as limits_cli
from memory_service.storage.database import PostgresDatabase
from memory_service.storage.limits import LimitStore

START = "2026-06-15T10:00:00+00:00"


class Env:
    def __init__(self, tmp_path: Path, database_url: str | None = None) -> None:
        self.db_path = tmp_path / "limits.sqlite3"
        self.database_url = database_url
        self.clock = Clock(datetime.fromisoformat(START))
        self.store = self._open()
        self.server = Server(make_app(self.store, self.db_path.with_name("keys.sqlite3"))).__enter__()
        self.a = self.server.client("ka")
        self.b = self.server.client("kb")

    def restart(self) -> None:
        """Stop the server, close the store, reopen both on the same file."""
        self.close()
        self.store = self._open()
        self.server = Server(make_app(self.store, self.db_path.with_name("keys.sqlite3"))).__enter__()
        self.a = self.server.client("ka")
        self.b = self.server.client("kb")

    def _open(self) -> LimitStore:
        if self.database_url is None:
            return LimitStore(self.db_path, now=self.clock)
        self._db = PostgresDatabase(self.database_url)
        return LimitStore(self._db, now=self.clock)

    def close(self) -> None:
        self.a.close()
        self.b.close()
        self.server.__exit__()
        self.store.close()
        if self.database_url is not None:
            self._db.close()

    def put(self, name: str, daily_limit: int, tz: str = "UTC", per: str = "team", client: httpx.Client | None = None):
        r = (client or self.a).put(f"/v1/limits/{name}", json={"daily_limit": daily_limit, "timezone": tz, "per": per})
        assert r.status_code in (200, 201), r.text
        return r.json()

    def consume(self, name: str, agent: str = "ag", client: httpx.Client | None = None, **extra: Any):
        return (client or self.a).post(f"/v1/limits/{name}/consume", json={"agent_id": agent, **extra})


@pytest.fixture(params=["sqlite", "postgresql"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    url = request.getfixturevalue("pg_cluster").create_database() if request.param == "postgresql" else None
    e = Env(tmp_path, url)
    yield e
    e.close()


# ---------------------------------------------------------------- atomicity


def test_64_concurrent_consumers_get_exactly_the_limit(env: Env) -> None:
    env.put("api-calls", 50)
    clients = [env.server.client("ka") for _ in range(64)]
    try:
        responses = concurrently(
            [lambda c=c, n=n: env.consume("api-calls", f"agent-{n}", c) for n, c in enumerate(clients)]
        )
    finally:
        for c in clients:
            c.close()
    ok = [r for r in responses if r.status_code == 200]
    denied = [r for r in responses if r.status_code == 429]
    assert (len(ok), len(denied)) == (50, 14)
    assert sorted(r.json()["used"] for r in ok) == list(range(1, 51))  # every increment distinct
    assert all(r.json()["allowed"] is False and r.json()["used"] == 50 and r.json()["remaining"] == 0 for r in denied)
    assert all(int(r.headers["Retry-After"]) > 0 for r in denied)
    assert env.a.get("/v1/limits/api-calls").json()["used"] == 50


def test_per_agent_counters_are_separate_under_concurrency(env: Env) -> None:
    env.put("posts", 10, per="agent")
    clients = [env.server.client("ka") for _ in range(30)]
    try:
        responses = concurrently(
            [lambda c=c, n=n: env.consume("posts", f"agent-{n % 2}", c) for n, c in enumerate(clients)]
        )
    finally:
        for c in clients:
            c.close()
    assert sum(r.status_code == 200 for r in responses) == 20
    assert sum(r.status_code == 429 for r in responses) == 10
    for agent in ("agent-0", "agent-1"):
        view = env.a.get("/v1/limits/posts", params={"agent_id": agent}).json()
        assert (view["agent_id"], view["used"], view["remaining"]) == (agent, 10, 0)
    total = env.a.get("/v1/limits/posts").json()
    assert total["used"] == 20 and total["remaining"] is None
    assert {a["agent_id"]: a["used"] for a in total["agents"]} == {"agent-0": 10, "agent-1": 10}


@pytest.mark.parametrize("daily_limit, allowed_keys", [(100, 30), (20, 20)])
def test_idempotency_keys_retried_concurrently_count_once(env: Env, daily_limit: int, allowed_keys: int) -> None:
    env.put("emails", daily_limit)
    clients = [env.server.client("ka") for _ in range(90)]
    calls = [
        lambda c=c, n=n: env.consume("emails", "mailer", c, idempotency_key=f"msg-{n // 3}")
        for n, c in enumerate(clients)
    ]
    try:
        responses = concurrently(calls)
    finally:
        for c in clients:
            c.close()
    by_key: dict[int, list[httpx.Response]] = {}
    for n, r in enumerate(responses):
        by_key.setdefault(n // 3, []).append(r)
    allowed = [k for k, rs in by_key.items() if all(r.status_code == 200 for r in rs)]
    denied = [k for k, rs in by_key.items() if all(r.status_code == 429 for r in rs)]
    assert (len(allowed), len(denied)) == (allowed_keys, 30 - allowed_keys)
    for k in allowed:  # the first answer, replayed byte for byte
        assert len({r.text for r in by_key[k]}) == 1
        assert sum(r.headers.get("Idempotent-Replayed") == "true" for r in by_key[k]) == 2
    assert sorted(by_key[k][0].json()["used"] for k in allowed) == list(range(1, allowed_keys + 1))
    assert env.a.get("/v1/limits/emails").json()["used"] == allowed_keys
    # a later retry still replays; a reused key with another amount is refused, and counts nothing
    again = env.consume("emails", "mailer", idempotency_key=f"msg-{allowed[0]}")
    assert again.status_code == 200 and again.text == by_key[allowed[0]][0].text
    clash = env.consume("emails", "mailer", idempotency_key=f"msg-{allowed[0]}", amount=2)
    assert clash.status_code == 409 and "idempotency_key" in clash.text
    assert env.a.get("/v1/limits/emails").json()["used"] == allowed_keys


def test_denial_changes_nothing_and_key_of_a_denied_request_can_be_retried(env: Env) -> None:
    env.put("quota", 3)
    assert env.consume("quota", amount=2).json()["used"] == 2
    before = dump(env.db_path)
    denied = env.consume("quota", amount=2, idempotency_key="k1")
    assert denied.status_code == 429
    assert denied.json() == {
        "allowed": False,
        "used": 2,
        "limit": 3,
        "remaining": 1,
        "resets_at": "2026-06-16T00:00:00+00:00",
    }
    assert int(denied.headers["Retry-After"]) == 14 * 3600
    assert dump(env.db_path) == before
    env.put("quota", 4)  # raised: the same key now goes through
    assert env.consume("quota", amount=2, idempotency_key="k1").json()["used"] == 4


def test_lowering_the_limit_keeps_todays_usage(env: Env) -> None:
    env.put("q", 5)
    for _ in range(3):
        env.consume("q")
    view = env.put("q", 2)
    assert (view["used"], view["remaining"]) == (3, 0)
    assert env.consume("q").status_code == 429
    assert env.a.get("/v1/limits/q").json()["used"] == 3


# ---------------------------------------------------------------- day boundaries


def _assert_answer(r: httpx.Response, status: int, used: int, resets_at: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["used"] == used
    assert body["resets_at"] == resets_at  # the exact instant and its offset
    return body


def test_new_york_midnights_across_both_2026_dst_changes(env: Env) -> None:
    env.put("ny", 2, tz="America/New_York")
    # Saturday 7 March, 23:59:59 EST: the last second of a normal day
    env.clock.set("2026-03-08T04:59:59+00:00")
    _assert_answer(env.consume("ny"), 200, 1, "2026-03-08T00:00:00-05:00")
    _assert_answer(env.consume("ny"), 200, 2, "2026-03-08T00:00:00-05:00")
    denied = env.consume("ny")
    _assert_answer(denied, 429, 2, "2026-03-08T00:00:00-05:00")
    assert denied.headers["Retry-After"] == "1"
    # Sunday 8 March, 00:00 EST: a new day of 23 hours, reset at 00:00 EDT
    env.clock.set("2026-03-08T05:00:00+00:00")
    r = _assert_answer(env.consume("ny"), 200, 1, "2026-03-09T00:00:00-04:00")
    assert utc(r["resets_at"]) == utc("2026-03-09T04:00:00+00:00")
    env.clock.set("2026-03-08T07:00:00+00:00")  # 03:00 EDT, one second after 01:59:59 EST
    _assert_answer(env.consume("ny"), 200, 2, "2026-03-09T00:00:00-04:00")
    assert env.consume("ny").headers["Retry-After"] == str(21 * 3600)
    # Sunday 1 November: 25 hours, 01:30 happens twice, both on the same day
    env.clock.set("2026-11-01T04:00:00+00:00")  # 00:00 EDT
    r = _assert_answer(env.consume("ny"), 200, 1, "2026-11-02T00:00:00-05:00")
    env.clock.set("2026-11-01T05:30:00+00:00")  # 01:30 EDT
    _assert_answer(env.consume("ny"), 200, 2, "2026-11-02T00:00:00-05:00")
    env.clock.set("2026-11-01T06:30:00+00:00")  # 01:30 EST, an hour later on the wall clock's repeat
    denied = env.consume("ny")
    _assert_answer(denied, 429, 2, "2026-11-02T00:00:00-05:00")
    assert denied.headers["Retry-After"] == str(22 * 3600 + 1800)
    env.clock.set("2026-11-02T04:59:59+00:00")  # 23:59:59 EST, still 1 November
    assert env.consume("ny").status_code == 429
    env.clock.set("2026-11-02T05:00:00+00:00")
    _assert_answer(env.consume("ny"), 200, 1, "2026-11-03T00:00:00-05:00")
    history = env.a.get("/v1/limits/ny", params={"days": 3}).json()["history"]
    assert history == [
        {"day": "2026-10-31", "used": 0},
        {"day": "2026-11-01", "used": 2},
        {"day": "2026-11-02", "used": 1},
    ]


def test_madrid_midnights_across_both_2026_dst_changes(env: Env) -> None:
    env.put("mad", 1, tz="Europe/Madrid")
    env.clock.set("2026-03-28T22:59:59+00:00")  # Saturday 28 March 23:59:59 CET
    _assert_answer(env.consume("mad"), 200, 1, "2026-03-29T00:00:00+01:00")
    assert env.consume("mad").headers["Retry-After"] == "1"
    env.clock.set("2026-03-28T23:00:00+00:00")  # Sunday 29 March 00:00 CET, 23-hour day
    _assert_answer(env.consume("mad"), 200, 1, "2026-03-30T00:00:00+02:00")
    denied = env.consume("mad")
    assert denied.headers["Retry-After"] == str(23 * 3600)
    assert utc(denied.json()["resets_at"]) == utc("2026-03-29T22:00:00+00:00")
    env.clock.set("2026-03-29T01:00:00+00:00")  # 03:00 CEST, right after the jump
    assert env.consume("mad").status_code == 429
    env.clock.set("2026-10-24T22:00:00+00:00")  # Sunday 25 October 00:00 CEST, 25-hour day
    _assert_answer(env.consume("mad"), 200, 1, "2026-10-26T00:00:00+01:00")
    env.clock.set("2026-10-25T00:30:00+00:00")  # 02:30 CEST
    assert env.consume("mad").headers["Retry-After"] == str(22 * 3600 + 1800)
    env.clock.set("2026-10-25T01:30:00+00:00")  # 02:30 CET, the repeated hour: same day
    view = env.a.get("/v1/limits/mad").json()
    assert (view["day"], view["used"], view["resets_at"]) == ("2026-10-25", 1, "2026-10-26T00:00:00+01:00")
    env.clock.set("2026-10-25T22:59:59+00:00")  # 23:59:59 CET
    assert env.consume("mad").status_code == 429
    env.clock.set("2026-10-25T23:00:00+00:00")
    _assert_answer(env.consume("mad"), 200, 1, "2026-10-27T00:00:00+01:00")


def test_idempotency_key_is_per_local_day(env: Env) -> None:
    env.put("daily-report", 5, tz="Europe/Madrid")
    env.clock.set("2026-06-15T21:59:59+00:00")  # 23:59:59 CEST
    first = env.consume("daily-report", idempotency_key="report")
    assert env.consume("daily-report", idempotency_key="report").text == first.text
    env.clock.advance(seconds=1)  # next local day: the same key counts again
    second = env.consume("daily-report", idempotency_key="report")
    assert second.json()["used"] == 1 and second.json()["resets_at"] == "2026-06-17T00:00:00+02:00"
    assert "Idempotent-Replayed" not in second.headers


# ---------------------------------------------------------------- isolation and restart


def test_team_b_cannot_read_count_or_change_team_a(env: Env) -> None:
    env.put("shared-name", 5, per="agent")
    env.consume("shared-name", "same-agent")
    assert env.a.post("/v1/handled", json={"key": "https://example.com/x", "agent_id": "same-agent"}).json()[
        "first_time"
    ]
    before = dump(env.db_path)
    assert env.b.get("/v1/limits/shared-name").status_code == 404
    assert env.b.get("/v1/limits").json() == []
    assert env.consume("shared-name", "same-agent", client=env.b).status_code == 404
    assert env.b.delete("/v1/limits/shared-name").status_code == 404
    assert env.b.get("/v1/handled/https://example.com/x", params={"agent_id": "same-agent"}).status_code == 404
    assert env.b.get("/v1/handled", params={"key": "https://example.com/x"}).status_code == 404
    assert dump(env.db_path) == before
    # team B's own limit and key of the same names are separate
    env.put("shared-name", 1, per="agent", client=env.b)
    assert env.consume("shared-name", "same-agent", client=env.b).json()["used"] == 1
    assert env.consume("shared-name", "same-agent", client=env.b).status_code == 429
    mark = env.b.post("/v1/handled", json={"key": "https://example.com/x", "agent_id": "same-agent"}).json()
    assert mark["first_time"] is True and mark["seen_count"] == 1
    a_view = env.a.get("/v1/limits/shared-name", params={"agent_id": "same-agent"}).json()
    assert (a_view["daily_limit"], a_view["used"]) == (5, 1)
    assert env.a.get("/v1/handled/https://example.com/x", params={"agent_id": "same-agent"}).json()["seen_count"] == 1
    assert env.server.client(None).get("/v1/limits").status_code == 401
    assert env.server.client("nope").post("/v1/handled", json={"key": "k"}).status_code == 401


def test_restart_keeps_todays_counts_and_keys(env: Env) -> None:
    env.put("persist", 5, tz="America/New_York", per="agent")
    for _ in range(3):
        env.consume("persist", "a1", idempotency_key=None)
    first = env.consume("persist", "a1", idempotency_key="once")
    env.a.post("/v1/handled", json={"key": "msg-1", "ttl_days": 3})
    env.restart()
    view = env.a.get("/v1/limits/persist", params={"agent_id": "a1"}).json()
    assert (view["used"], view["daily_limit"], view["timezone"], view["per"]) == (4, 5, "America/New_York", "agent")
    assert env.consume("persist", "a1", idempotency_key="once").text == first.text
    assert env.consume("persist", "a1").json()["used"] == 5
    assert env.consume("persist", "a1").status_code == 429
    again = env.a.post("/v1/handled", json={"key": "msg-1"}).json()
    assert (again["first_time"], again["seen_count"]) == (False, 2)


# ---------------------------------------------------------------- bad input

LONG = "x" * 129
BAD_REQUESTS: list[tuple[str, str, str, dict[str, Any] | None, Any]] = [
    # (case, method, path, query, json body), every one must be a 4xx naming the problem
    ("daily_limit", "PUT", "/v1/limits/ok", None, {"daily_limit": -1, "timezone": "UTC"}),
    ("daily_limit", "PUT", "/v1/limits/ok", None, {"daily_limit": 10**9 + 1, "timezone": "UTC"}),
    ("daily_limit", "PUT", "/v1/limits/ok", None, {"daily_limit": "5", "timezone": "UTC"}),
    ("daily_limit", "PUT", "/v1/limits/ok", None, {"daily_limit": 1.5, "timezone": "UTC"}),
    ("daily_limit", "PUT", "/v1/limits/ok", None, {"daily_limit": True, "timezone": "UTC"}),
    ("daily_limit", "PUT", "/v1/limits/ok", None, {"timezone": "UTC"}),
    ("timezone", "PUT", "/v1/limits/ok", None, {"daily_limit": 5, "timezone": "Mars/Olympus"}),
    ("timezone", "PUT", "/v1/limits/ok", None, {"daily_limit": 5, "timezone": ""}),
    ("timezone", "PUT", "/v1/limits/ok", None, {"daily_limit": 5, "timezone": "../../etc/passwd"}),
    ("timezone", "PUT", "/v1/limits/ok", None, {"daily_limit": 5, "timezone": "/usr/share/zoneinfo/UTC"}),
    ("timezone", "PUT", "/v1/limits/ok", None, {"daily_limit": 5, "timezone": "localtime"}),
    ("timezone", "PUT", "/v1/limits/ok", None, {"daily_limit": 5, "timezone": "right/Europe/Madrid"}),
    ("per", "PUT", "/v1/limits/ok", None, {"daily_limit": 5, "timezone": "UTC", "per": "everyone"}),
    ("surprise", "PUT", "/v1/limits/ok", None, {"daily_limit": 5, "timezone": "UTC", "surprise": 1}),
    ("name", "PUT", "/v1/limits/" + LONG, None, {"daily_limit": 5, "timezone": "UTC"}),
    ("name", "PUT", "/v1/limits/%2E%2E", None, {"daily_limit": 5, "timezone": "UTC"}),
    ("name", "PUT", "/v1/limits/.hidden", None, {"daily_limit": 5, "timezone": "UTC"}),
    ("name", "PUT", "/v1/limits/a..b", None, {"daily_limit": 5, "timezone": "UTC"}),
    ("name", "PUT", "/v1/limits/a%20b", None, {"daily_limit": 5, "timezone": "UTC"}),
    ("name", "PUT", "/v1/limits/caf%C3%A9", None, {"daily_limit": 5, "timezone": "UTC"}),
    ("body", "PUT", "/v1/limits/ok", None, [5, "UTC"]),
    ("amount", "POST", "/v1/limits/known/consume", None, {"agent_id": "a", "amount": 0}),
    ("amount", "POST", "/v1/limits/known/consume", None, {"agent_id": "a", "amount": -3}),
    ("amount", "POST", "/v1/limits/known/consume", None, {"agent_id": "a", "amount": 10**9 + 1}),
    ("amount", "POST", "/v1/limits/known/consume", None, {"agent_id": "a", "amount": 2.5}),
    ("amount", "POST", "/v1/limits/known/consume", None, {"agent_id": "a", "amount": "1"}),
    ("agent_id", "POST", "/v1/limits/known/consume", None, {"agent_id": ""}),
    ("agent_id", "POST", "/v1/limits/known/consume", None, {"agent_id": LONG}),
    ("agent_id", "POST", "/v1/limits/known/consume", None, {"agent_id": "line\nbreak"}),
    ("agent_id", "POST", "/v1/limits/known/consume", None, {}),
    ("idempotency_key", "POST", "/v1/limits/known/consume", None, {"agent_id": "a", "idempotency_key": ""}),
    ("idempotency_key", "POST", "/v1/limits/known/consume", None, {"agent_id": "a", "idempotency_key": "k" * 257}),
    ("limit", "POST", "/v1/limits/known/consume", None, {"agent_id": "a", "limit": 10**6}),
    ("no limit named", "POST", "/v1/limits/undefined/consume", None, {"agent_id": "a"}),
    ("days", "GET", "/v1/limits/known", {"days": 0}, None),
    ("days", "GET", "/v1/limits/known", {"days": 367}, None),
    ("agent_id", "GET", "/v1/limits/known", {"agent_id": ""}, None),
    ("agent_id", "GET", "/v1/limits", {"agent_id": LONG}, None),
    ("key", "POST", "/v1/handled", None, {"key": ""}),
    ("key", "POST", "/v1/handled", None, {"key": "k" * 2049}),
    ("key", "POST", "/v1/handled", None, {"key": "nul\x00byte"}),
    ("key", "POST", "/v1/handled", None, {"agent_id": "a"}),
    ("ttl_days", "POST", "/v1/handled", None, {"key": "k", "ttl_days": 0}),
    ("ttl_days", "POST", "/v1/handled", None, {"key": "k", "ttl_days": 3651}),
    ("ttl_days", "POST", "/v1/handled", None, {"key": "k", "ttl_days": 1.5}),
    ("agent_id", "POST", "/v1/handled", None, {"key": "k", "agent_id": ""}),
    ("first_time", "POST", "/v1/handled", None, {"key": "k", "first_time": True}),
    ("key", "GET", "/v1/handled", {"key": "k" * 2049}, None),
    ("key", "GET", "/v1/handled", None, None),
]


def test_bad_input_is_a_clear_4xx_and_changes_nothing(env: Env) -> None:
    env.put("known", 5)
    env.consume("known")
    env.a.post("/v1/handled", json={"key": "k"})
    before = dump(env.db_path)
    for case, method, path, query, body in BAD_REQUESTS:
        r = env.a.request(method, path, params=query, json=body)
        assert 400 <= r.status_code < 500, (case, path, body, r.status_code, r.text)
        assert case in r.text, (case, r.text)  # the message names what was wrong
        assert dump(env.db_path) == before, (case, body)
    # not JSON at all
    r = env.a.post("/v1/limits/known/consume", content=b"{not json", headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500
    assert dump(env.db_path) == before


def test_error_messages_say_what_is_allowed(env: Env) -> None:
    r = env.a.put("/v1/limits/ok", json={"daily_limit": 5, "timezone": "Mars/Olympus"})
    assert "IANA" in r.text and "Europe/Madrid" in r.text
    r = env.a.put("/v1/limits/a..b", json={"daily_limit": 5, "timezone": "UTC"})
    assert "1-128 characters of A-Z a-z 0-9 . _ -" in r.text
    r = env.consume("missing")
    assert r.status_code == 404 and "no limit named 'missing'" in r.text and "PUT /v1/limits/missing" in r.text
    r = env.a.post("/v1/handled", json={"key": "k", "ttl_days": 0})
    assert "greater than or equal to 1" in r.text


# ---------------------------------------------------------------- handled ledger


def test_handled_first_time_then_seen_counts(env: Env) -> None:
    key = "https://example.com/inbox/42?thread=7#top"
    first = env.a.post("/v1/handled", json={"key": key}).json()
    assert (first["first_time"], first["seen_count"], first["expires_at"]) == (True, 1, None)
    assert first["first_seen_at"] == "2026-06-15T10:00:00+00:00"
    env.clock.advance(minutes=5)
    second = env.a.post("/v1/handled", json={"key": key}).json()
    assert (second["first_time"], second["seen_count"]) == (False, 2)
    assert second["first_seen_at"] == first["first_seen_at"] and second["last_seen_at"] == "2026-06-15T10:05:00+00:00"
    by_query = env.a.get("/v1/handled", params={"key": key}).json()
    assert by_query["seen_count"] == 2 and by_query["key"] == key
    by_path = env.a.get("/v1/handled/" + httpx.URL("https://example.com/inbox/42").raw_path.decode().lstrip("/"))
    assert by_path.status_code == 404  # a different key: the query and fragment are part of the key
    env.a.post("/v1/handled", json={"key": "https://example.com/inbox/42"})
    assert env.a.get("/v1/handled/https://example.com/inbox/42").json()["key"] == "https://example.com/inbox/42"
    # per-agent ledgers are separate from the team's and from each other
    assert env.a.post("/v1/handled", json={"key": key, "agent_id": "bot-1"}).json()["first_time"] is True
    assert env.a.post("/v1/handled", json={"key": key, "agent_id": "bot-2"}).json()["first_time"] is True
    assert env.a.get("/v1/handled", params={"key": key, "agent_id": "bot-3"}).status_code == 404
    assert env.a.get("/v1/handled/never-seen").status_code == 404


def test_20_concurrent_posts_of_one_key_have_one_first_time(env: Env) -> None:
    clients = [env.server.client("ka") for _ in range(20)]
    try:
        responses = concurrently([lambda c=c: c.post("/v1/handled", json={"key": "msg-123"}) for c in clients])
    finally:
        for c in clients:
            c.close()
    bodies = [r.json() for r in responses]
    assert sum(b["first_time"] for b in bodies) == 1
    assert sorted(b["seen_count"] for b in bodies) == list(range(1, 21))
    assert env.a.get("/v1/handled/msg-123").json()["seen_count"] == 20


def test_handled_ttl_expiry_makes_the_key_new_again(env: Env) -> None:
    first = env.a.post("/v1/handled", json={"key": "job-9", "ttl_days": 2}).json()
    assert first["expires_at"] == "2026-06-17T10:00:00+00:00"
    env.clock.set("2026-06-17T09:59:59+00:00")
    seen = env.a.post("/v1/handled", json={"key": "job-9", "ttl_days": 30}).json()
    assert (seen["first_time"], seen["seen_count"], seen["expires_at"]) == (False, 2, first["expires_at"])
    env.clock.set("2026-06-17T10:00:00+00:00")
    assert env.a.get("/v1/handled/job-9").status_code == 404
    again = env.a.post("/v1/handled", json={"key": "job-9"}).json()
    assert (again["first_time"], again["seen_count"], again["expires_at"]) == (True, 1, None)
    assert again["first_seen_at"] == "2026-06-17T10:00:00+00:00"


# ---------------------------------------------------------------- listing, deleting, CLI


def test_list_history_and_delete(env: Env) -> None:
    env.put("b-limit", 3, tz="Europe/Madrid")
    env.put("a-limit", 7, per="agent")
    env.consume("a-limit", "x")
    listed = env.a.get("/v1/limits").json()
    assert [v["name"] for v in listed] == ["a-limit", "b-limit"]
    assert listed[0]["used"] == 1 and "agents" not in listed[0]
    env.clock.advance(days=1)
    view = env.a.get("/v1/limits/a-limit", params={"days": 2, "agent_id": "x"}).json()
    assert view["history"] == [{"day": "2026-06-15", "used": 1}, {"day": "2026-06-16", "used": 0}]
    assert env.a.delete("/v1/limits/a-limit").status_code == 204
    assert env.a.get("/v1/limits/a-limit").status_code == 404
    assert [v["name"] for v in env.a.get("/v1/limits").json()] == ["b-limit"]
    assert env.a.put("/v1/limits/b-limit", json={"daily_limit": 4, "timezone": "UTC"}).status_code == 200


def test_cli_commands(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    def cli(*argv: str) -> int:
        return limits_cli.main(["limits", *argv, "--url", env.server.url, "--api-key", "ka"])

    assert cli("set", "deploys", "--daily-limit", "1", "--timezone", "Europe/Madrid", "--per", "agent") == 0
    assert cli("consume", "deploys", "--agent-id", "ci", "--idempotency-key", "build-1") == 0
    assert cli("consume", "deploys", "--agent-id", "ci", "--idempotency-key", "build-1") == 0  # replay
    assert cli("consume", "deploys", "--agent-id", "ci") == 1  # denied
    capsys.readouterr()
    assert cli("show", "deploys", "--agent-id", "ci", "--days", "2") == 0
    assert '"used": 1' in capsys.readouterr().out
    assert cli("show") == 0
    assert cli("handled", "https://example.com/a?b=1") == 0
    assert cli("handled", "https://example.com/a?b=1") == 1
    assert cli("handled", "https://example.com/a?b=1", "--check") == 0
    assert cli("handled", "never", "--check") == 1
    assert cli("set", "bad", "--daily-limit", "1", "--timezone", "Nowhere/Land") == 2
    assert "timezone" in capsys.readouterr().err
    assert cli("consume", "undefined", "--agent-id", "ci") == 2
    assert limits_cli.main(["limits", "show", "--url", "http://127.0.0.1:9"]) == 2


def test_store_rejects_naive_clock_and_bad_values(tmp_path: Path) -> None:
    store = LimitStore(tmp_path / "x.sqlite3", now=lambda: datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="aware"):
        store.set_limit("t", "n", 1, "UTC", "team")
    store.close()
    store = LimitStore(tmp_path / "y.sqlite3", now=lambda: datetime.fromisoformat(START))
    with pytest.raises(ValueError, match="amount"):
        store.consume("t", "n", "a", amount=0)
    with pytest.raises(ValueError, match="timezone"):
        store.set_limit("t", "n", 1, "Not/AZone", "team")
    assert store.get_handled("t", "k") is None
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.consume("t", "n", "a")
