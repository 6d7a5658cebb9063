"""The web console's rules, over HTTP in-process: login cookie, CSRF, team scoping, escaping, retry.

No model and no browser here (tests/test_console_browser.py drives the real thing): these pin the
security edges, which a browser test would only cover by accident.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from inprocess import LoopbackServer

from memory_service.console.highlight import Segment, segments
from memory_service.console.session import COOKIE
from memory_service.storage.journal import FactPlan, NewFact
from tests.conftest import InProcessApp

CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')


def login(app: InProcessApp, key: str) -> TestClient:
    client = TestClient(app.app)
    token = CSRF.search(client.get("/ui/login").text).group(1)
    answer = client.post("/ui/login", data={"key": key, "csrf": token, "next": "/ui/jobs"}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/jobs"
    return client


def csrf_of(client: TestClient, path: str = "/ui/jobs") -> str:
    return CSRF.search(client.get(path).text).group(1)


@pytest.fixture(scope="module")
def saved(inprocess: InProcessApp) -> Iterator[str]:
    """A failed memory of team A whose text tries to inject markup."""
    api = inprocess.client("key-a")
    memory_id = api.post(
        "/v1/remember",
        json={
            "text": "<script>alert('x')</script> Ines approved the Plover plan.",
            "agent_id": "agent-1",
            "tags": ["<i>t</i>"],
        },
    ).json()["id"]
    inprocess.services.journal.fail_attempt(
        memory_id,
        error="BadReply: <img src=x onerror=alert(1)>",
        raw_reply="<b>prose</b>",
        timings=None,
        report=None,
        retry_at=None,
        budget_s=20,
    )
    yield memory_id


def test_pages_need_a_login_and_the_cookie_is_httponly_strict_and_scoped(inprocess: InProcessApp) -> None:
    anonymous = TestClient(inprocess.app)
    for path in ("/ui/memories", "/ui/jobs", "/ui/limits", "/ui/handled"):
        answer = anonymous.get(path, follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"].startswith("/ui/login?next=%2Fui%2F")
    token = CSRF.search(anonymous.get("/ui/login").text).group(1)
    wrong = anonymous.post("/ui/login", data={"key": "key-z", "csrf": token})
    assert wrong.status_code == 401 and "Unknown API key" in wrong.text and "set-cookie" not in wrong.headers
    answer = anonymous.post(
        "/ui/login", data={"key": "key-a", "csrf": token, "next": "https://evil.example/"}, follow_redirects=False
    )
    assert answer.headers["location"] == "/ui/memories"  # never off-site
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    # a bearer key does not open the console, and the console's cookie does not open the API
    assert anonymous.get("/v1/memories").status_code == 401


def test_every_post_needs_the_sessions_csrf_token_and_the_same_origin(inprocess: InProcessApp, saved: str) -> None:
    a = login(inprocess, "key-a")
    token = csrf_of(a)
    url = f"/ui/memories/{saved}/retry"
    assert a.post(url, data={}).status_code == 403
    assert a.post(url, data={"csrf": "0" * 64}).status_code == 403
    assert a.post(url, data={"csrf": csrf_of(login(inprocess, "key-b"))}).status_code == 403  # B's token
    assert a.post(url, data={"csrf": token}, headers={"Origin": "http://evil.example"}).status_code == 403
    assert a.post(url, data={"csrf": token}, headers={"Sec-Fetch-Site": "cross-site"}).status_code == 403
    assert inprocess.services.journal.get("team-a", saved).status == "failed"
    b_token = csrf_of(login(inprocess, "key-b"))
    for data, headers in (  # the logout form too: a cross-site page cannot log the operator out
        ({}, {}),
        ({"csrf": "0" * 64}, {}),
        ({"csrf": b_token}, {}),
        ({"csrf": token}, {"Origin": "http://evil.example"}),
        ({"csrf": token}, {"Origin": "null"}),
        ({"csrf": token}, {"Sec-Fetch-Site": "same-site"}),
    ):
        assert a.post("/ui/logout", data=data, headers=headers).status_code == 403, (data, headers)
    assert a.get("/ui/jobs", follow_redirects=False).status_code == 200  # still logged in
    login_token = CSRF.search(TestClient(inprocess.app).get("/ui/login").text).group(1)
    forged = TestClient(inprocess.app).post(
        "/ui/login", data={"key": "key-a", "csrf": login_token}, headers={"Origin": "http://evil.example"}
    )
    assert forged.status_code == 403


def test_everything_shown_is_escaped(inprocess: InProcessApp, saved: str) -> None:
    a = login(inprocess, "key-a")
    for path in (
        f"/ui/memories/{saved}",
        "/ui/memories",
        "/ui/jobs",
        "/ui/memories?q=%3Cscript%3E+Plover",
        "/ui/handled?key=%3Cscript%3Ealert(1)%3C/script%3E",
    ):
        page = a.get(path)
        assert page.status_code == 200, path
        assert "<script>alert" not in page.text and "<img src=x" not in page.text and "<b>prose" not in page.text
        assert "<i>t</i>" not in page.text
        assert page.headers["content-security-policy"].startswith("default-src 'self'")
    detail = a.get(f"/ui/memories/{saved}").text
    assert "&lt;script&gt;alert(" in detail and "&lt;b&gt;prose&lt;/b&gt;" in detail


def test_a_key_the_gate_finished_shows_who_with_which_tool_and_the_result(inprocess: InProcessApp) -> None:
    api = inprocess.client("key-a")
    held = api.post("/v1/gate/reserve", json={"tool": "process_item", "key": "ticket:77", "agent_id": "triage"})
    api.post("/v1/gate/finish", json={"reservation": held.json()["reservation"], "result": "<b>closed</b> as dup"})
    page = login(inprocess, "key-a").get("/ui/handled?key=ticket:77").text
    assert re.search(r'id="handled-by">triage with <code>process_item</code>', page)
    assert 'id="handled-result">&lt;b&gt;closed&lt;/b&gt; as dup' in page


def test_a_second_team_sees_nothing_and_cannot_retry(inprocess: InProcessApp, saved: str) -> None:
    b = login(inprocess, "key-b")
    assert b.get(f"/ui/memories/{saved}").status_code == 404
    assert saved not in b.get("/ui/memories").text and saved not in b.get("/ui/jobs").text
    search = b.get("/ui/memories?q=Ines+approved+Plover").text
    assert "Nothing recalled" in search and "approved the Plover" not in search
    assert b.post(f"/ui/memories/{saved}/retry", data={"csrf": csrf_of(b)}).status_code == 404
    assert inprocess.services.journal.get("team-a", saved).status == "failed"


def test_a_read_key_browses_but_cannot_retry(inprocess: InProcessApp, saved: str) -> None:
    reader = login(inprocess, inprocess.services.keys.create("team-a", "read").key)
    assert reader.get(f"/ui/memories/{saved}").status_code == 200
    refused = reader.post(f"/ui/memories/{saved}/retry", data={"csrf": csrf_of(reader)})
    assert refused.status_code == 403 and "needs role &#39;write&#39;" in refused.text
    assert inprocess.services.journal.get("team-a", saved).status == "failed"


def test_retry_queues_a_failed_job_now_and_logout_ends_the_session(inprocess: InProcessApp, saved: str) -> None:
    a = login(inprocess, "key-a")
    assert f'id="job-{saved}"' in a.get("/ui/jobs").text
    answer = a.post(
        f"/ui/memories/{saved}/retry", data={"csrf": csrf_of(a), "next": "/ui/jobs"}, follow_redirects=False
    )
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/jobs"
    memory = inprocess.services.journal.get("team-a", saved)
    assert memory.status == "queued" and memory.attempts == 1 and memory.last_error  # history kept
    assert a.post(f"/ui/memories/{saved}/retry", data={"csrf": csrf_of(a)}).status_code == 404  # not failed now
    assert a.post("/ui/logout", data={"csrf": csrf_of(a)}, follow_redirects=False).status_code == 303
    assert a.get("/ui/jobs", follow_redirects=False).status_code == 303


def test_bad_filters_are_explained_on_the_page(inprocess: InProcessApp) -> None:
    a = login(inprocess, "key-a")
    for query, message in (
        ("since=yesterday", "is not a date"),
        ("status=lost", "status: one of"),
        ("since=2024-05-02&until=2024-05-01", "since is after until"),
        ("cursor=%%%", "cursor"),
    ):
        page = a.get(f"/ui/memories?{query}")
        assert page.status_code == 422 and message in page.text, (query, page.text[-600:])


def test_overlapping_spans_cut_the_text_into_marked_segments() -> None:
    text = "Ines approved the plan on May 3."
    cut = segments(text, [[[0, 22]], [[14, 31], [0, 0]], [[40, 99]]])  # an empty and an out-of-range span
    assert "".join(s.text for s in cut) == text
    assert cut == [
        Segment("Ines approved ", (1,)),
        Segment("the plan", (1, 2)),
        Segment(" on May 3", (2,)),
        Segment(".", ()),
    ]


def test_a_memory_shows_its_spans_rejected_facts_and_superseded_history(inprocess: InProcessApp) -> None:
    journal, api = inprocess.services.journal, inprocess.client("key-a")
    first, second = (
        api.post("/v1/remember", json={"text": t, "agent_id": "fin"}).json()["id"]
        for t in ("The Wren budget is 400 dollars.", "The Wren budget is 500 dollars now.")
    )
    old, new = (
        NewFact(id=f"f:{n}", text=t, norm=t.lower(), shape="wren budget", spans=[(0, len(t))])
        for n, t in (("wren-old", "The Wren budget is 400 dollars"), ("wren-new", "The Wren budget is 500 dollars"))
    )
    rejected = {"rejected": [{"text": "Wren is <em>great</em>", "reason": "not in the text"}]}
    journal.complete(
        journal.get("team-a", first),
        FactPlan(new=[old]),
        raw_reply=None,
        timings={"prompt_n": 120, "cache_n": 80, "predicted_n": 21},
        report=rejected,
    )
    journal.complete(
        journal.get("team-a", second),
        FactPlan(new=[new], superseded=[(old.id, new.id)]),
        raw_reply=None,
        timings=None,
        report={},
    )
    page = login(inprocess, "key-a").get(f"/ui/memories/{first}").text
    assert '<mark data-facts="1" title="fact 1">The Wren budget is 400 dollars<sup>1</sup></mark>.' in page
    superseded = page.split('id="superseded"', 1)[1].split("</ol>", 1)[0]
    assert (
        "The Wren budget is 400 dollars" in superseded and "replaced by “The Wren budget is 500 dollars”" in superseded
    )
    assert "Wren is &lt;em&gt;great&lt;/em&gt;" in page and "not in the text" in page
    assert 'cached prompt tokens</th><td class="num">80' in page


def test_a_login_opens_a_fresh_server_side_session_and_logout_ends_it(inprocess: InProcessApp) -> None:
    """Session fixation and logout, over real HTTP (issue 53). Before, the cookie held the API key itself: the
    same value at every login, accepted when planted by someone else (a browser logged in to their team), and
    still good after logout. Now it holds a random session id, fresh at each login, that only the key store
    knows (its hash), ended at logout, by a new login in the same browser and by the key's revocation."""
    with LoopbackServer(inprocess.app, lifespan="off") as server:

        def browser(**cookies: str) -> httpx.Client:
            return httpx.Client(base_url=server.url, trust_env=False, follow_redirects=False, cookies=cookies)

        def logged_in(key: str, client: httpx.Client) -> str:
            with browser() as anonymous:  # a browser holding a live session is sent past the form
                token = CSRF.search(anonymous.get("/ui/login").text).group(1)
            answer = client.post("/ui/login", data={"key": key, "csrf": token, "next": "/ui/jobs"})
            assert answer.status_code == 303 and answer.headers["location"] == "/ui/jobs", answer.text
            return answer.cookies[COOKIE]

        def opens(session: str) -> bool:
            with browser(**{COOKIE: session}) as client:
                return client.get("/ui/jobs").status_code == 200

        with browser() as first, browser() as second:
            one, two = logged_in("key-a", first), logged_in("key-a", second)
        assert one != two and "key-a" not in (one, two) and opens(one) and opens(two)
        # a planted cookie opens nothing: neither a key (the old cookie's content) nor an id of one's choosing
        assert not opens("key-b") and not opens("mss_" + "A" * 43)
        # someone plants their own live session (team B) in a browser; logging in there ends it
        planted = logged_in("key-b", browser())
        with browser() as victim:
            victim.cookies.set(COOKIE, planted, domain="127.0.0.1", path="/ui")  # as the service would set it
            mine = logged_in("key-a", victim)
            assert mine != planted and not opens(planted)
            assert "team-a" in victim.get("/ui/jobs").text
            out = victim.post("/ui/logout", data={"csrf": CSRF.search(victim.get("/ui/jobs").text).group(1)})
            assert out.status_code == 303 and "max-age=0" in out.headers["set-cookie"].lower()
        assert not opens(mine)  # the value copied before the logout opens nothing after it
        # a revoked key's sessions end with it; the cookie's flags, and Secure behind an https proxy
        reader = inprocess.services.keys.create("team-a", "read")
        with browser() as client:
            session = logged_in(reader.key, client)
            assert opens(session)
            inprocess.services.keys.revoke(reader.info.id, team="team-a", keyless=True)  # MEMORY_API_KEYS stay
            assert not opens(session)
            token = CSRF.search(client.get("/ui/login").text).group(1)  # the revoked key's session: the form
            answer = client.post(
                "/ui/login", data={"key": "key-a", "csrf": token}, headers={"X-Forwarded-Proto": "https"}
            )
        flags = answer.headers["set-cookie"].lower()
        assert "httponly" in flags and "samesite=strict" in flags and "path=/ui" in flags and "secure" in flags
