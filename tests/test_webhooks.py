"""Webhooks: a team's subscriptions get its events, signed, at least once; no other team's; and only at the
URLs the service may call. The service runs in this process against the fake llama-server; the receivers are
real HTTP servers on real loopback ports (docs/webhooks.md)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import eventually, wait_status
from fakes import FakeLlamaServer
from inprocess import InProcessService
from webhook_receiver import Receiver, verify

CSRF = re.compile(r'name="csrf" value="([0-9a-f]+)"')
# receivers on loopback need the operator's allowance; quick retries so a test waits seconds, not minutes
FAST = {
    "MEMORY_WEBHOOK_ALLOW_PRIVATE": "1",
    "MEMORY_WEBHOOK_RETRY_BASE_S": "0.05",
    "MEMORY_WEBHOOK_RETRY_MAX_S": "0.3",
    "MEMORY_MAX_ATTEMPTS": "1",  # a model error fails the job at once: memory.failed
}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLlamaServer]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as server:
        yield server


@pytest.fixture(scope="module")
def service(fake: FakeLlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    with InProcessService(tmp_path_factory.mktemp("webhooks") / "data", fake.url, env=FAST) as svc:
        yield svc


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    hook = Receiver()
    yield hook
    hook.close()


def _subscribe(svc: InProcessService, url: str, events: list[str], key: str = "key-a") -> dict:
    with svc.client(key) as client:
        answer = client.post("/v1/webhooks", json={"url": url, "events": events})
    assert answer.status_code == 201, answer.text
    return answer.json()


def _unsubscribe_all(svc: InProcessService, key: str = "key-a") -> None:
    with svc.client(key) as client:
        for sub in client.get("/v1/webhooks").json():
            assert client.delete(f"/v1/webhooks/{sub['id']}").status_code == 204


def test_every_memory_gets_a_signed_extracted_event_and_a_forgery_is_detected(service, receiver):
    sub = _subscribe(service, receiver.url, ["memory.extracted"])
    receiver.secret = sub["secret"]
    assert sub["secret"].startswith("whsec_") and sub["events"] == ["memory.extracted"]
    try:
        with service.client() as client:
            ids = [
                client.post(
                    "/v1/remember", json={"text": f"Ticket {n} was moved to the ops queue.", "agent_id": "a"}
                ).json()["id"]
                for n in range(5)
            ]
            memories = {mid: wait_status(client, mid) for mid in ids}
            got = eventually(
                "an event per memory",
                lambda: (
                    (by := {e["data"]["memory_id"]: e for e in receiver.of("memory.extracted")}).keys() >= set(ids)
                    and by
                ),
            )
            # counted once the receiver's 2xx is back (it may lag the receiver's own record of the POST)
            listed = eventually(
                "the deliveries counted",
                lambda: (subs := client.get("/v1/webhooks").json())[0]["delivered"] >= len(ids) and subs,
            )
        for mid in ids:
            event = got[mid]
            assert event["team"] == "team-a" and event["id"].startswith("evt_")
            assert event["_headers"]["x-memory-event-id"] == event["id"]
            assert event["_headers"]["x-memory-event"] == "memory.extracted"
            facts = [f["id"] for f in memories[mid]["facts"]]
            assert memories[mid]["status"] == "done" and sorted(event["data"]["fact_ids"]) == sorted(facts)
            assert event["data"]["facts"] == len(facts)
        assert len({e["id"] for e in got.values()}) == len(ids)
        assert receiver.forged == 0
        # what a receiver must refuse: a body changed in transit, a signature made with another secret
        headers, body = receiver.raw[0]
        assert verify(sub["secret"], headers, body)
        assert not verify(sub["secret"], headers, body.replace(b"team-a", b"team-b"))
        assert not verify("whsec_" + "0" * 64, headers, body)
        assert not verify(sub["secret"], headers | {"x-memory-timestamp": "1000"}, body)
        # the listing shows what was delivered, and never the secret
        assert "secret" not in listed[0]
    finally:
        _unsubscribe_all(service)


def test_team_b_never_receives_team_a_events(service):
    a_hook, b_hook = Receiver(), Receiver()
    try:
        a_hook.secret = _subscribe(service, a_hook.url, ["memory.extracted"], key="key-a")["secret"]
        b_hook.secret = _subscribe(service, b_hook.url, ["memory.extracted"], key="key-b")["secret"]
        with service.client("key-a") as a, service.client("key-b") as b:
            a_ids = [
                a.post("/v1/remember", json={"text": f"A's secret plan {n}.", "agent_id": "x"}).json()["id"]
                for n in range(3)
            ]
            b_id = b.post("/v1/remember", json={"text": "B's own note.", "agent_id": "x"}).json()["id"]
            eventually("team A's events", lambda: {e["data"]["memory_id"] for e in a_hook.events} >= set(a_ids))
            eventually("team B's event", lambda: b_id in {e["data"]["memory_id"] for e in b_hook.events})
            # B's list shows B's subscription only; A's id is a 404 to B
            b_subs = b.get("/v1/webhooks").json()
            a_subs = a.get("/v1/webhooks").json()
            assert [s["url"] for s in b_subs] == [b_hook.url]
            assert b.delete(f"/v1/webhooks/{a_subs[0]['id']}").status_code == 404
        assert {e["team"] for e in b_hook.events} == {"team-b"}
        assert not set(a_ids) & {e["data"]["memory_id"] for e in b_hook.events}
        assert {e["team"] for e in a_hook.events} == {"team-a"}
    finally:
        a_hook.close()
        b_hook.close()
        _unsubscribe_all(service, "key-a")
        _unsubscribe_all(service, "key-b")


def test_a_failed_extraction_sends_memory_failed(service, fake, receiver):
    receiver.secret = _subscribe(service, receiver.url, ["memory.failed"])["secret"]
    try:
        fake.set_mode("http_500")
        with service.client() as client:
            mid = client.post("/v1/remember", json={"text": "The backup job failed twice.", "agent_id": "a"}).json()[
                "id"
            ]
            assert wait_status(client, mid)["status"] == "failed"
        event = eventually("memory.failed", lambda: receiver.of("memory.failed"))[0]
        assert event["data"]["memory_id"] == mid and event["data"]["error"]
        assert receiver.of("memory.extracted") == []  # not subscribed to it
    finally:
        fake.set_mode("ok")
        _unsubscribe_all(service)


def test_a_receiver_answering_errors_gets_the_event_on_a_retry_and_ready_shows_it(service, receiver):
    receiver.status = 503
    receiver.secret = _subscribe(service, receiver.url, ["memory.extracted"])["secret"]
    try:
        with service.client() as client:
            mid = client.post("/v1/remember", json={"text": "Retry me until you can.", "agent_id": "a"}).json()["id"]
            wait_status(client, mid)
            eventually("failed attempts", lambda: len(receiver.raw) >= 3)
            sub = client.get("/v1/webhooks").json()[0]
            assert sub["last_error"] == "HTTP 503" and sub["delivered"] == 0
            assert client.get("/ready").json()["webhooks"]["pending"] >= 1
            receiver.status = 200
            event = eventually("the retried delivery", lambda: receiver.of("memory.extracted"))[0]
            assert event["data"]["memory_id"] == mid
            # every attempt of one event carries the same event id: the receiver's dedup key
            assert {h["x-memory-event-id"] for h, _ in receiver.raw} == {event["id"]}
            ready = eventually(
                "the outbox drained", lambda: (r := client.get("/ready").json()["webhooks"])["pending"] == 0 and r
            )
            assert ready["subscriptions"] == 1 and ready["delivered"] >= 1 and ready["last_delivery_at"]
        # the console's jobs page shows the subscription: delivered, failures, the last error
        row = _console_jobs(service).split('id="webhooks"')[1].split("</table>")[0]
        assert receiver.url in row and "HTTP 503" in row and "never" not in row and ">delivering<" in row
    finally:
        _unsubscribe_all(service)


def test_a_replay_outside_the_window_is_refused_and_a_late_retry_is_not(service, receiver):
    """Replay (issue 53): a receiver that verifies as docs/webhooks.md says refuses a captured delivery sent again
    once it is older than its window (here 2 s, the doc's 5 minutes scaled down), and still accepts the
    service's own retry of an event long after the event: each attempt is signed with its own time."""
    receiver.tolerance_s = 2
    receiver.status = 503
    receiver.secret = _subscribe(service, receiver.url, ["memory.extracted"])["secret"]
    try:
        with service.client() as client:
            mid = client.post("/v1/remember", json={"text": "Sign me anew.", "agent_id": "a"}).json()["id"]
            wait_status(client, mid)
            first = eventually("a refused attempt", lambda: receiver.raw and receiver.raw[0])
            time.sleep(3.5)  # the event and its first attempt are now outside the receiver's window
            receiver.status = 200
            event = eventually("the retried delivery, accepted", lambda: receiver.of("memory.extracted"))[0]
        assert event["data"]["memory_id"] == mid and receiver.forged == 0
        assert int(event["_headers"]["x-memory-timestamp"]) > int(first[0]["x-memory-timestamp"])
        # a captured delivery (its headers and body as they were sent) replayed later is refused
        headers, body = receiver.raw[-1]
        replayed = {k: v for k, v in headers.items() if k.startswith("x-memory-") or k == "content-type"}
        assert httpx.post(receiver.url, content=body, headers=replayed, trust_env=False).status_code == 200
        assert receiver.forged == 0  # inside the window it verifies: the receiver dedups it by its event id
        time.sleep(3.5)
        assert httpx.post(receiver.url, content=body, headers=replayed, trust_env=False).status_code == 401
        assert receiver.forged == 1
    finally:
        _unsubscribe_all(service)


def _console_jobs(svc: InProcessService, key: str = "key-a") -> str:
    with httpx.Client(base_url=svc.url, trust_env=False) as browser:
        token = CSRF.search(browser.get("/ui/login").text).group(1)
        answer = browser.post("/ui/login", data={"key": key, "csrf": token, "next": "/ui/jobs"})
        assert answer.status_code == 303, answer.text
        return browser.get("/ui/jobs").text


def test_the_console_shows_no_webhooks_to_a_read_key(service):
    with service.client() as client:
        reader = client.post("/v1/keys", json={"role": "read"}).json()
    try:
        page = _console_jobs(service, reader["key"])
        assert 'id="webhooks"' not in page and 'id="jobs-failed"' in page
    finally:
        with service.client() as client:
            client.delete(f"/v1/keys/{reader['id']}")


def test_the_subscription_routes_bound_their_input(service):
    with service.client() as client:
        for body in (
            {"url": "ftp://example.com/hook", "events": ["memory.extracted"]},
            {"url": "file:///etc/passwd", "events": ["memory.extracted"]},
            {"url": "javascript:alert(1)", "events": ["memory.extracted"]},
            {"url": "http://", "events": ["memory.extracted"]},
            {"url": "http://user:pw@example.com/", "events": ["memory.extracted"]},
            {"url": "https://example.com/" + "a" * 3000, "events": ["memory.extracted"]},
            {"url": "https://example.com/", "events": []},
            {"url": "https://example.com/", "events": ["memory.deleted"]},
            {"url": "https://example.com/", "events": ["memory.extracted"], "team": "team-b"},
        ):
            answer = client.post("/v1/webhooks", json=body)
            assert answer.status_code == 422, (body, answer.text)
        with service.client("key-b") as other:  # no key: 401; another team's subscription: 404
            assert other.delete("/v1/webhooks/wh_nope").status_code == 404
        with service.client(None) as anonymous:
            assert anonymous.get("/v1/webhooks").status_code == 401
        made = [
            client.post("/v1/webhooks", json={"url": f"http://127.0.0.1:9/{n}", "events": ["limit.exhausted"]})
            for n in range(11)
        ]
        assert [m.status_code for m in made] == [201] * 10 + [409]
        assert "(10)" in made[-1].json()["detail"]
    _unsubscribe_all(service)


@pytest.fixture(scope="module")
def strict(fake: FakeLlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    """The service as an operator runs it by default: no webhook to a private address."""
    with InProcessService(tmp_path_factory.mktemp("strict") / "data", fake.url) as svc:
        yield svc


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "http://localhost/hook",  # a name that resolves to loopback
        "http://10.0.0.5/hook",
        "http://192.168.1.10/hook",
        "http://172.16.0.1/hook",
        "http://169.254.169.254/latest/meta-data",  # the cloud metadata address
        "http://[::1]/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://0.0.0.0/hook",
        "http://100.64.0.1/hook",
        "http://240.0.0.1/hook",
    ],
)
def test_private_addresses_are_refused_unless_the_operator_allows_them(strict, url):
    with strict.client() as client:
        answer = client.post("/v1/webhooks", json={"url": url, "events": ["memory.extracted"]})
    assert answer.status_code == 422, answer.text
    assert "MEMORY_WEBHOOK_ALLOW_PRIVATE" in answer.json()["detail"]


def test_a_private_url_stored_earlier_is_refused_at_delivery(strict, receiver):
    """An operator turned the allowance off after a subscription to a loopback receiver was made (as DNS
    rebinding would turn a public name private): deliveries to it are refused, the receiver gets nothing."""
    store = strict.services.webhooks.store
    sub, _ = store.subscribe("team-a", receiver.url, ["memory.extracted"])
    try:
        with strict.client() as client:
            mid = client.post("/v1/remember", json={"text": "Nothing leaves for loopback.", "agent_id": "a"}).json()[
                "id"
            ]
            wait_status(client, mid)
            listed = eventually(
                "a refused attempt", lambda: [s for s in client.get("/v1/webhooks").json() if s["last_error"]]
            )
        assert "MEMORY_WEBHOOK_ALLOW_PRIVATE" in listed[0]["last_error"]
        assert receiver.raw == []
    finally:
        store.unsubscribe("team-a", sub.id)


def test_the_body_is_the_json_that_was_signed(service, receiver):
    receiver.secret = _subscribe(service, receiver.url, ["memory.extracted"])["secret"]
    try:
        with service.client() as client:
            mid = client.post("/v1/remember", json={"text": "One more note.", "agent_id": "a"}).json()["id"]
            eventually("the event", lambda: receiver.of("memory.extracted"))
        headers, body = receiver.raw[-1]
        assert headers["content-type"] == "application/json"
        assert json.loads(body)["data"]["memory_id"] == mid
    finally:
        _unsubscribe_all(service)


def test_a_limit_used_up_sends_limit_exhausted_once(service, receiver):
    receiver.secret = _subscribe(service, receiver.url, ["limit.exhausted"])["secret"]
    try:
        with service.client() as client:
            spec = {"daily_limit": 3, "timezone": "UTC", "per": "agent"}
            assert client.put("/v1/limits/replies", json=spec).status_code == 201
            answers = [client.post("/v1/limits/replies/consume", json={"agent_id": "mailer"}) for _ in range(5)]
            assert [a.status_code for a in answers] == [200, 200, 200, 429, 429]
            # another agent's own counter, and a limit of another team: not this subscription's events
            client.post("/v1/limits/replies/consume", json={"agent_id": "other", "amount": 2})
            with service.client("key-b") as b:
                b.put("/v1/limits/replies", json={**spec, "daily_limit": 1})
                b.post("/v1/limits/replies/consume", json={"agent_id": "mailer"})
            client.post("/v1/limits/replies/consume", json={"agent_id": "other"})  # other's last one: a second event
            events = eventually(
                "two limit.exhausted events",
                lambda: len(receiver.of("limit.exhausted")) >= 2 and receiver.of("limit.exhausted"),
            )
        assert sorted(e["data"]["agent_id"] for e in events) == ["mailer", "other"]
        assert {(e["team"], e["data"]["name"], e["data"]["limit"]) for e in events} == {("team-a", "replies", 3)}
        assert receiver.forged == 0
    finally:
        _unsubscribe_all(service)
