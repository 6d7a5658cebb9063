"""The web-facing boundary attacked the way a hostile page or tenant would (issue 31): a memory with
thousands of spans, DNS rebinding against keyless mode, cross-site writes, a non-ASCII CSRF token, another
team's activity in /metrics and /v1/stats, credentials in /ready's database URL and in config errors.

In process, no model: the real app and stores, through TestClient or uvicorn on a loopback thread.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from inprocess import LoopbackServer

from memory_service.app import create_app
from memory_service.config import ConfigError, Settings
from memory_service.console.highlight import Segment, highlight
from memory_service.console.session import COOKIE
from memory_service.llm.runtime.server import free_port
from memory_service.services import Services
from memory_service.storage.database import describe
from memory_service.storage.records import FactPlan, NewFact
from tests.conftest import InProcessApp

CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')
LOCAL = "http://127.0.0.1:8700"


def _services(data_dir: Path, **settings: object) -> Services:
    fields: dict = {"data_dir": data_dir, "llm_url": f"http://127.0.0.1:{free_port()}", "chroma_process": False}
    return Services.open(Settings(**{**fields, **settings}))


@pytest.fixture(scope="module")
def keyless(tmp_path_factory) -> Iterator[TestClient]:
    """No key anywhere, loopback bind: every request is the local admin. A browser-like client of the
    service's own address; a test forges Host or Origin per request."""
    services = _services(tmp_path_factory.mktemp("keyless") / "data", trusted_hosts="proxy.example")
    yield TestClient(create_app(services.settings, services=services), base_url=LOCAL)
    services.close()


def _login(app: InProcessApp, key: str) -> TestClient:
    client = TestClient(app.app)
    token = CSRF.search(client.get("/ui/login").text).group(1)
    client.post("/ui/login", data={"key": key, "csrf": token}, follow_redirects=False)
    return client


# ------------------------------------------------------------------ span highlighting


def test_highlight_marks_overlapping_nested_adjacent_and_repeated_spans() -> None:
    text = "0123456789abcdef"
    cut = highlight(text, [[[0, 4], [2, 6], [6, 8]], [[3, 5], [3, 5]], [[5, 12]], [[12, 16], [-4, 0], [20, 30]]])
    assert "".join(s.text for s in cut.segments) == text
    assert [(s.text, s.facts) for s in cut.segments] == [
        ("012", (1,)),  # fact 1's overlapping and adjacent spans are one mark
        ("34", (1, 2)),  # fact 2 nested in fact 1, listed once though given twice
        ("567", (1, 3)),  # fact 1's touching span at 6 joins its mark: no cut there
        ("89ab", (3,)),
        ("cdef", (4,)),  # adjacent to fact 3, not merged with it
    ]
    assert cut.omitted == 0
    capped = highlight(text, [[[i, i + 1]] for i in range(16)], limit=5)
    assert capped.omitted == 11 and [s.facts for s in capped.segments][:6] == [(1,), (2,), (3,), (4,), (5,), ()]
    assert highlight("", [[[0, 3]]]).segments == [] and highlight("ab", []).segments == [Segment("ab", ())]


def test_a_memory_with_20000_spans_renders_quickly_and_health_answers_meanwhile(tmp_path: Path) -> None:
    app = InProcessApp(tmp_path / "data")
    try:
        text = "The Heron release ships on Friday. " * 1800  # 63,000 characters
        memory_id = app.client("key-a").post("/v1/remember", json={"text": text, "agent_id": "a"}).json()["id"]
        facts = [  # 200 facts of 100 overlapping spans each, spread over the whole text
            NewFact(
                f"f:{n}",
                f"fact {n}",
                f"fact {n}",
                f"s{n}",
                [(j * 620 + n * 3, j * 620 + n * 3 + 40) for j in range(100)],
            )
            for n in range(200)
        ]
        journal = app.services.journal
        journal.complete(journal.get("team-a", memory_id), FactPlan(new=facts), raw_reply=None, timings=None, report={})
        with LoopbackServer(app.app, lifespan="off") as server:
            cookie = _login(app, "key-a").cookies.get(COOKIE)

            def render_while_probing() -> tuple[httpx.Response, float, float]:
                """The page fetched in a thread while /health is asked every 20 ms: (page, its seconds, the
                slowest /health)."""
                page: dict = {}

                def fetch() -> None:
                    started = time.monotonic()
                    with httpx.Client(base_url=server.url, cookies={COOKIE: cookie}, timeout=120) as c:
                        page["response"] = c.get(f"/ui/memories/{memory_id}")
                    page["seconds"] = time.monotonic() - started

                opener = threading.Thread(target=fetch)
                opener.start()
                slowest = 0.0
                with httpx.Client(base_url=server.url, timeout=30) as probe:
                    while opener.is_alive():
                        started = time.monotonic()
                        assert probe.get("/health").status_code == 200
                        slowest = max(slowest, time.monotonic() - started)
                        time.sleep(0.02)
                opener.join()
                return page["response"], page["seconds"], slowest

            # /health must not wait for the page: at most 1 s or half the page's time (a busy CI box made it wait
            # 1.03 s once). Usually it waits ~10 ms. A box loaded far past its cores once stalled one /health
            # 1.12 s of a 1.31 s page, so a stall is measured again, up to three times; a server that makes
            # /health wait for the page fails all three. (With the marks built in the loop rather than in a
            # thread, /health waited 0.06 s of a 0.49 s page here: the marks are fast, the page is mostly I/O.)
            waits = []
            for _ in range(3):
                response, seconds, slowest = render_while_probing()
                assert response.status_code == 200, response.text[:300]
                assert seconds < 30, f"the page took {seconds:.1f} s"
                waits.append((round(slowest, 2), round(seconds, 2)))
                if slowest < max(1.0, seconds / 2):
                    break
            else:
                raise AssertionError(f"/health waited about as long as the page each time: (wait, page) {waits}")
        assert response.text.count("<mark ") <= 400 and "19800 more are not" in response.text
        assert "and 80 more" in response.text  # each fact lists 20 of its 100 spans
    finally:
        app.services.close()


# ------------------------------------------------------------------ keyless mode: Host and Origin


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:8700",
        "localhost.",  # a trailing dot is another name, resolved by DNS
        "127.0.0.1.",
        "localhost.evil.example",
        "127.0.0.1.evil.example",
        "127.0.0.1@evil.example",
        "evil.example#127.0.0.1",
        "::1",  # unbracketed: not a Host
        "[::ffff:127.0.0.1]",
        "0.0.0.0:8700",
        "127.0.0.1:8700, evil.example",
        "",
        "proxy.example.evil",
    ],
)
def test_keyless_mode_refuses_a_forged_host(keyless: TestClient, host: str) -> None:
    for path in ("/v1/team", "/ui/memories", "/metrics"):
        answer = keyless.get(path, headers={"Host": host}, follow_redirects=False)
        assert answer.status_code == 421, (host, path, answer.status_code)
        assert answer.json()["error"] == "untrusted_host" and "MEMORY_TRUSTED_HOSTS" in answer.json()["detail"]


@pytest.mark.parametrize(
    "host", ["127.0.0.1:8700", "127.0.0.1", "localhost:8700", "LocalHost", "[::1]:8700", "[::1]", "proxy.example"]
)
def test_keyless_mode_answers_its_own_names_and_the_configured_ones(keyless: TestClient, host: str) -> None:
    assert keyless.get("/v1/team", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},  # a sandboxed frame or a file: page
        {"Origin": "http://localhost:3000"},  # another local site, not this service
        {"Origin": "http://127.0.0.1:8700.evil.example"},
        {"Origin": "http://127.0.0.1:8700@evil.example"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:8700"},
    ],
)
def test_keyless_mode_refuses_a_write_from_another_site(keyless: TestClient, headers: dict) -> None:
    for path in ("/v1/remember", "/ui/logout"):
        answer = keyless.post(path, json={}, headers=headers, follow_redirects=False)
        assert answer.status_code == 403 and answer.json()["error"] == "cross_site", (path, answer.text)


def test_keyless_mode_takes_writes_from_its_own_origin_and_from_clients_without_one(keyless: TestClient) -> None:
    for headers in ({}, {"Origin": LOCAL}, {"Origin": "http://proxy.example"}, {"Sec-Fetch-Site": "same-origin"}):
        # past the guard, to the route's own validation (nothing is saved)
        assert keyless.post("/v1/remember", json={}, headers=headers).status_code == 422, headers
    assert keyless.get("/v1/team", headers={"Origin": "http://evil.example"}).status_code == 200  # reads: Host


def test_with_keys_a_host_is_not_checked_but_a_console_form_from_another_site_is_refused(
    inprocess: InProcessApp,
) -> None:
    assert inprocess.client("key-a").get("/v1/team", headers={"Host": "memory.internal"}).status_code == 200
    console = _login(inprocess, "key-a")
    token = CSRF.search(console.get("/ui/jobs").text).group(1)
    for origin in ("http://evil.example", "null"):
        answer = console.post("/ui/logout", data={"csrf": token}, headers={"Origin": origin}, follow_redirects=False)
        assert answer.status_code == 403, origin
    assert console.get("/ui/jobs", follow_redirects=False).status_code == 200  # still logged in


def test_a_non_ascii_csrf_token_is_refused_not_a_crash(inprocess: InProcessApp) -> None:
    console = _login(inprocess, "key-a")
    for path in ("/ui/logout", "/ui/login"):
        answer = console.post(path, data={"csrf": "é" * 64}, follow_redirects=False)
        assert answer.status_code == 403, (path, answer.status_code)


# ------------------------------------------------------------------ what is visible without a key


def test_with_keys_metrics_need_an_admin_key_or_the_metrics_token(tmp_path: Path) -> None:
    services = _services(tmp_path / "data", api_keys={"key-a": "team-a"}, metrics_token="scrape-secret")
    try:
        reader = services.create_key("team-a", "read", agent_id=None, label=None).key
        client = TestClient(create_app(services.settings, services=services))

        def scrape(token: str | None) -> int:
            return client.get("/metrics", headers={"Authorization": f"Bearer {token}"} if token else {}).status_code

        assert [scrape(t) for t in (None, "wrong", reader, "key-a", "scrape-secret")] == [401, 401, 403, 200, 200]
    finally:
        services.close()


def test_a_teams_admin_scrapes_only_its_own_teams_series(inprocess: InProcessApp) -> None:
    """Any team's admin key reads /metrics, but never another team's counters (the scrape token reads all)."""
    limit = f"scrape-{uuid.uuid4().hex[:6]}"
    for key in ("key-a", "key-b"):
        client = inprocess.client(key)
        assert client.put(f"/v1/limits/{limit}", json={"daily_limit": 5, "timezone": "UTC"}).status_code == 201
        assert client.post(f"/v1/limits/{limit}/consume", json={"agent_id": "x"}).status_code == 200
    seen = inprocess.client("key-b").get("/metrics")
    assert seen.status_code == 200
    assert 'team="team-b"' in seen.text and "team-a" not in seen.text
    samples = [line for line in seen.text.splitlines() if line and not line.startswith("#")]
    assert samples and all('team="team-b"' in line for line in samples), samples  # no team-less aggregate either


def test_with_keys_stats_need_a_key_and_count_the_callers_team_only(inprocess: InProcessApp) -> None:
    for n in range(2):
        inprocess.client("key-a").post("/v1/remember", json={"text": f"Team A note {n}.", "agent_id": "a"})
    assert inprocess.client(None).get("/v1/stats").status_code == 401
    assert inprocess.client(None).get("/metrics").status_code == 401
    own, other = (inprocess.client(k).get("/v1/stats").json()["jobs"] for k in ("key-a", "key-b"))
    assert sum(own.values()) >= 2 and sum(other.values()) == 0


def test_with_keys_the_operator_token_reads_every_teams_stats(tmp_path: Path) -> None:
    """The MEMORY_METRICS_TOKEN bearer is the operator's view of /v1/stats (every team, consolidation runs);
    a team's key sees its own numbers, and an unknown bearer is a 401."""
    services = _services(tmp_path / "data", api_keys={"key-a": "team-a", "key-b": "team-b"}, metrics_token="op")
    try:
        client = TestClient(create_app(services.settings, services=services), base_url="http://127.0.0.1")
        client.post(
            "/v1/remember", json={"text": "A note.", "agent_id": "a"}, headers={"Authorization": "Bearer key-a"}
        )

        def jobs(token: str) -> dict:
            response = client.get("/v1/stats", headers={"Authorization": f"Bearer {token}"})
            assert response.status_code == 200, response.text
            return response.json()["jobs"]

        assert sum(v for k, v in jobs("op").items() if k != "deferred" and v) >= 1
        assert sum(v for k, v in jobs("key-b").items() if k != "deferred" and v) == 0
        assert client.get("/v1/stats", headers={"Authorization": "Bearer nope"}).status_code == 401
    finally:
        services.close()


def test_keyless_metrics_and_stats_stay_open(keyless: TestClient) -> None:
    assert keyless.get("/metrics").status_code == 200 and keyless.get("/v1/stats").status_code == 200


# ------------------------------------------------------------------ credentials in what the service shows


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://memory:s3cret@db.internal:5432/memory",
        "postgresql://memory:s3/cr@et@db.internal/memory",
        "postgresql://s3cret@db.internal/memory",
        "postgresql://db.internal/memory?user=memory&password=s3cret",
        "postgresql://db.internal/memory?sslmode=require&PASSWORD=s3cret",
        "postgresql://db.internal/memory?sslpassword=s3cret",
        "host=db.internal user=memory password=s3cret dbname=memory",
        "host=db.internal password = 's3 cret' dbname=memory",
    ],
)
def test_a_database_url_is_shown_without_any_credential(url: str) -> None:
    shown = describe(url)
    leaked = [part for part in ("s3", "cret", "et@") if part in shown]  # pieces of the password
    assert not leaked, shown
    assert "db.internal" in shown, shown


def test_a_malformed_api_keys_variable_never_echoes_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for raw, why in (
        ("good-secret:team-a,bad-secret", "entry 2 has no ':'"),
        ("good-secret:team-a,bad-secret:", "entry 2 has an empty team"),
        ("good-secret:team-a,good-secret:team-b", "entry 2 repeats the key"),
    ):
        monkeypatch.setenv("MEMORY_API_KEYS", raw)
        with pytest.raises(ConfigError) as caught:
            Settings.from_env()
        assert why in str(caught.value) and "secret" not in str(caught.value), str(caught.value)
