"""Keys pinned to an agent: every route, with a pinned write key and a pinned admin key, against another
agent's data (which must come out unchanged and unseen); and a revoked key refused at the next request
whichever pooled connection serves it."""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import httpx
import pytest
from conftest import InProcessApp

from memory_service.console.session import COOKIE
from memory_service.storage.database import READERS
from memory_service.storage.keys import KeyStore

TEAM = "team-p"
CEO_TEXT = "The ceo approved invoice 7 for the board."


@pytest.fixture
def app(tmp_path) -> InProcessApp:
    made = InProcessApp(tmp_path / "data")
    yield made
    made.services.close()


def _seed(app: InProcessApp) -> dict[str, str]:
    """Another agent (ceo) with a memory, counters, handled marks and keys; mailer with one memory."""
    admin = app.services.keys.create(TEAM, "admin").key
    with app.client(admin) as http:
        ceo = http.post(
            "/v1/remember",
            json={"text": CEO_TEXT, "agent_id": "ceo", "run_id": "shared-run", "idempotency_key": "ceo-save"},
        ).json()["id"]
        mine = http.post(
            "/v1/remember",
            json={"text": "Mailer sent invoice reminders.", "agent_id": "mailer", "run_id": "shared-run"},
        ).json()["id"]
        assert http.put("/v1/limits/emails", json={"daily_limit": 9, "timezone": "UTC", "per": "agent"}).status_code
        assert http.put("/v1/limits/posts", json={"daily_limit": 9, "timezone": "UTC"}).status_code == 201
        assert http.post("/v1/limits/emails/consume", json={"agent_id": "ceo", "amount": 2}).status_code == 200
        assert http.post("/v1/handled", json={"key": "item-1"}).status_code == 200  # the team's ledger
        assert http.post("/v1/handled", json={"key": "item-2", "agent_id": "ceo"}).status_code == 200
        held = http.post("/v1/gate/reserve", json={"tool": "t", "key": "item-3", "agent_id": "ceo"}).json()
    keys = app.services.keys
    return {
        "ceo_memory": ceo,
        "my_memory": mine,
        "ceo_key": keys.create(TEAM, "write", agent_id="ceo").info.id,
        "team_key": keys.create(TEAM, "read").info.id,
        "ceo_reservation": held["reservation"],
    }


def _others(app: InProcessApp) -> dict[str, Any]:
    """Everything of the team that is not the mailer's own: what a mailer-pinned key must leave alone."""
    services = app.services
    with services.journal.reading() as conn:
        memories = conn.execute(
            "SELECT id, status FROM memories WHERE team = ? AND agent_id != 'mailer' ORDER BY id", (TEAM,)
        ).fetchall()
    with services.limits.db.reading() as conn:
        handled = conn.execute(
            "SELECT agent_id, key, seen_count FROM handled WHERE team = ? AND agent_id != 'mailer' ORDER BY 1, 2",
            (TEAM,),
        ).fetchall()
        reservations = conn.execute(
            "SELECT id, agent_id, key FROM gate_reservations WHERE team = ? AND agent_id != 'mailer' ORDER BY id",
            (TEAM,),
        ).fetchall()
    return {
        "memories": [tuple(r) for r in memories],
        "reservations": [tuple(r) for r in reservations],
        "handled": [tuple(r) for r in handled],
        "limits": [(v.name, v.daily_limit, v.per, v.timezone) for v in services.limits.list_limits(TEAM, None)],
        "ceo_used": [(v.name, v.used) for v in services.limits.list_limits(TEAM, "ceo") if v.per == "agent"],
        "keys": [
            (k.id, k.revoked_at) for k in services.keys.list(TEAM, include_revoked=True) if k.agent_id != "mailer"
        ],
    }


def _no_ceo(response: httpx.Response) -> bool:
    return "ceo" not in response.text and "board" not in response.text


def _emails_used(used: int) -> Callable[[httpx.Response], bool]:
    return lambda r: [v["used"] for v in r.json() if v["name"] == "emails"] == [used]


# (method, path, body, status for the pinned write key, status for the pinned admin key, a check of the answer)
Row = tuple[str, str, dict[str, Any] | None, int, int, Callable[[httpx.Response], bool] | None]
ROWS: list[Row] = [
    ("GET", "/v1/memories/{ceo_memory}", None, 404, 404, None),
    ("GET", "/v1/memories/{my_memory}", None, 200, 200, None),
    ("GET", "/v1/memories", None, 200, 200, _no_ceo),
    ("GET", "/v1/memories?agent_id=ceo", None, 403, 403, None),
    ("GET", "/v1/memories?run_id=shared-run", None, 200, 200, _no_ceo),
    ("POST", "/v1/recall", {"query": "invoice board"}, 200, 200, _no_ceo),
    ("POST", "/v1/recall", {"query": "invoice", "scope": "agent", "agent_id": "ceo"}, 403, 403, None),
    ("GET", "/v1/team", None, 200, 200, lambda r: _no_ceo(r) and r.json()["memories"] == 1),
    ("GET", "/v1/stats", None, 403, 403, None),  # the team's job counts: not for a key that sees one agent
    ("GET", "/v1/export", None, 200, 200, _no_ceo),
    ("POST", "/v1/import", None, 403, 403, None),
    ("GET", "/v1/limits", None, 200, 200, _emails_used(0)),
    ("GET", "/v1/limits/emails", None, 200, 200, lambda r: _no_ceo(r) and r.json()["used"] == 0),
    ("GET", "/v1/limits/emails?agent_id=ceo", None, 403, 403, None),
    ("GET", "/v1/handled?key=item-1", None, 404, 404, None),
    ("GET", "/v1/handled/item-2?agent_id=ceo", None, 403, 403, None),
    ("POST", "/v1/handled", {"key": "item-1"}, 200, 200, lambda r: r.json()["first_time"] is True),
    ("POST", "/v1/handled", {"key": "item-2", "agent_id": "ceo"}, 403, 403, None),
    ("POST", "/v1/remember", {"text": "I am the ceo.", "agent_id": "ceo"}, 403, 403, None),
    ("POST", "/v1/remember", {"text": "Mine.", "agent_id": "mailer", "idempotency_key": "ceo-save"}, 409, 409, None),
    ("POST", "/v1/limits/emails/consume", {"agent_id": "ceo"}, 403, 403, None),
    ("POST", "/v1/limits/emails/consume", {"agent_id": "mailer"}, 200, 200, None),
    ("POST", "/v1/limits/posts/consume", {"agent_id": "mailer"}, 200, 200, None),  # a team quota: usable
    ("PUT", "/v1/limits/emails", {"daily_limit": 1000, "timezone": "UTC", "per": "agent"}, 403, 403, None),
    ("PUT", "/v1/limits/new", {"daily_limit": 5, "timezone": "UTC"}, 403, 403, None),
    ("DELETE", "/v1/limits/posts", None, 403, 403, None),
    ("DELETE", "/v1/memories/{ceo_memory}", None, 403, 404, None),
    ("DELETE", "/v1/memories?agent_id=ceo&confirm=true", None, 403, 403, None),
    ("GET", "/v1/keys", None, 403, 200, lambda r: all(k["agent_id"] == "mailer" for k in r.json())),
    ("POST", "/v1/keys", {"role": "admin"}, 403, 403, None),
    ("POST", "/v1/keys", {"role": "read", "agent_id": "mailer"}, 403, 201, None),
    ("DELETE", "/v1/keys/{ceo_key}", None, 403, 404, None),
    ("DELETE", "/v1/keys/{team_key}", None, 403, 404, None),
    # webhooks are the team's: no pinned key sees or changes them (a public address literal: nothing is sent)
    ("GET", "/v1/webhooks", None, 403, 403, None),
    ("POST", "/v1/webhooks", {"url": "https://93.184.215.14/", "events": ["memory.extracted"]}, 403, 403, None),
    ("DELETE", "/v1/webhooks/wh_x", None, 403, 403, None),
    # the gate: a pinned key reserves in its own agent's ledger, as itself, and finishes only its own
    ("POST", "/v1/gate/reserve", {"tool": "t", "key": "item-3"}, 200, 200, lambda r: r.json()["allowed"] is True),
    ("POST", "/v1/gate/reserve", {"tool": "t", "key": "item-3", "scope": "agent", "agent_id": "ceo"}, 403, 403, None),
    ("POST", "/v1/gate/reserve", {"tool": "t", "limit": "emails", "agent_id": "ceo"}, 403, 403, None),
    ("POST", "/v1/gate/reserve", {"tool": "t", "limit": "emails"}, 200, 200, None),  # its own counter
    ("POST", "/v1/gate/finish", {"reservation": "{ceo_reservation}"}, 404, 404, None),
    ("POST", "/v1/gate/release", {"reservation": "{ceo_reservation}"}, 404, 404, None),
    ("DELETE", "/v1/memories?run_id=shared-run&confirm=true", None, 403, 200, lambda r: r.json()["deleted"] == 1),
    ("DELETE", "/v1/memories/{my_memory}", None, 403, 404, None),  # forgotten by the row above: gone
]


def test_the_table_covers_every_route(app: InProcessApp) -> None:
    ids = {"ceo_memory": "m1", "my_memory": "m2", "ceo_key": "k1", "team_key": "k2", "ceo_reservation": "r1"}
    urls = {(method, path.format(**ids).split("?")[0]) for method, path, *_ in ROWS}
    # from the OpenAPI document: FastAPI 0.165's `app.routes` holds included routers as opaque entries
    paths = [(p, re.compile(re.sub(r"\{[^}]+\}", "[^/]+", p) + "$")) for p in app.app.openapi()["paths"]]
    methods = {p: [m.upper() for m in ops] for p, ops in app.app.openapi()["paths"].items()}
    routes = [(m, p, rx) for p, rx in paths if p.startswith("/v1/") for m in methods[p]]
    assert len(routes) >= 20
    missing = [(m, p) for m, p, rx in routes if not any(m == method and rx.match(u) for method, u in urls)]
    assert not missing


@pytest.mark.parametrize("role", ["write", "admin"])
def test_a_pinned_key_neither_sees_nor_changes_another_agents_data(app: InProcessApp, role: str) -> None:
    ids = _seed(app)
    pinned = app.services.keys.create(TEAM, role, agent_id="mailer").key
    wrong = []  # every row is tried, so a failure names all the routes that misbehave
    for method, path, body, as_writer, as_admin, check in ROWS:
        url, expected = path.format(**ids), as_admin if role == "admin" else as_writer
        if body is not None:  # a reservation id in a body
            body = {k: v.format(**ids) if isinstance(v, str) else v for k, v in body.items()}
        before = _others(app)
        with app.client(pinned) as http:
            if path == "/v1/import":
                response = http.post(url, content=b'{"text": "x"}\n')
            else:
                response = http.request(method, url, json=body)
        answered = response.status_code == expected and (
            check is None or response.status_code >= 300 or check(response)
        )
        if not answered or _others(app) != before:
            wrong.append(
                (method, url, response.status_code, "answer" if not answered else "changed", response.text[:200])
            )
    assert not wrong, "\n".join(map(str, wrong))


def test_a_pinned_key_marks_and_checks_its_own_ledger(app: InProcessApp) -> None:
    """Without agent_id a pinned key uses its agent's ledger: the team's mark stays first-time for the team."""
    _seed(app)
    pinned = app.services.keys.create(TEAM, "write", agent_id="mailer").key
    with app.client(pinned) as http:
        assert http.post("/v1/handled", json={"key": "item-9"}).json()["first_time"] is True
        assert http.get("/v1/handled", params={"key": "item-9"}).json()["agent_id"] == "mailer"
        assert http.post("/v1/handled", json={"key": "item-9"}).json()["first_time"] is False
    assert app.services.limits.get_handled(TEAM, "item-9", None) is None
    assert app.services.limits.get_handled(TEAM, "item-9", "mailer") is not None


# -------------------------------------------------------------------- revocation on every pooled connection


def _through(app: InProcessApp, reader: int, key: str) -> int:
    """GET /v1/team with `key`, its key check served by pooled read connection number `reader`: the pool hands
    out its last idle connection, so holding `reader` of them picks the next one."""
    with ExitStack() as held:
        for _ in range(reader):
            held.enter_context(app.services.keys.db.reading())
        with app.client(key) as http:
            return http.get("/v1/team").status_code


def test_a_key_revoked_by_another_connection_is_refused_at_once_on_every_pooled_one(app: InProcessApp) -> None:
    """The CLI is another connection (another process in real life). `PRAGMA data_version` is per connection:
    a cache keyed on it let this exact sequence through (found by a seeded random search of such sequences)."""
    cli = KeyStore(app.settings.data_dir / "keys.sqlite3")
    try:
        with ExitStack() as held:  # open the whole pool
            for _ in range(READERS):
                held.enter_context(app.services.keys.db.reading())
        for trial in range(3):
            key = cli.create(TEAM, "read")
            for step in ("create", 3, "create", 3, "create", 2, 2):
                if step == "create":
                    cli.create(TEAM, "read", label=f"noise {trial}")
                else:
                    assert _through(app, int(step), key.key) == 200
            cli.revoke(key.info.id)
            for _ in range(2):
                assert [_through(app, reader, key.key) for reader in range(READERS)] == [401] * READERS, trial
    finally:
        cli.close()


def test_a_pinned_key_does_not_open_the_console(app: InProcessApp) -> None:
    """The console browses the whole team (the operator's tool): a key pinned to an agent neither logs in nor
    passes as a session cookie."""
    _seed(app)
    pinned = app.services.keys.create(TEAM, "admin", agent_id="mailer").key
    with app.client(None) as browser:
        token = re.search(r'name="csrf" value="([0-9a-f]+)"', browser.get("/ui/login").text)
        assert token is not None
        answer = browser.post("/ui/login", data={"key": pinned, "csrf": token.group(1)}, follow_redirects=False)
        assert answer.status_code == 401 and "set-cookie" not in answer.headers
    with app.client(None) as browser:
        browser.cookies.set(COOKIE, pinned)
        for page in ("/ui/memories", "/ui/limits", "/ui/handled"):
            shown = browser.get(page, follow_redirects=False)
            assert shown.status_code == 303 and CEO_TEXT not in shown.text, page
