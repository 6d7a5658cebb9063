"""Hostile webhook receivers cost only their own team (issue 53): a body trickled a byte every 3 s, a 3 GB
body, a receiver that accepts and never answers. Each runs against the real service in this process, with
real HTTP receivers on loopback (memory_service/testbed/receivers.py), while another team's event must arrive
within its bound and the process's memory must stay flat.

The attempt deadline is set to 30 s here (an operator may set up to 60): a quiet team's event that waited for
the hostile team's attempts, as one global batch did, would take that long; on its own it takes about a
second (the idle loop's poll)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import eventually
from fakes import FakeLlamaServer
from inprocess import InProcessService
from test_webhooks import _console_jobs

from memory_service.testbed.receivers import Receivers

HOSTILE_SUBSCRIPTIONS = 3
QUIET_BOUND_S = 10.0  # save extracted -> delivered, for the quiet team: ~1 s alone, 30 s behind a stuck batch
RSS_BOUND_MB = 64.0  # a few MB per stuck delivery at most; one 3 GB body read whole would be 3,000
ENV = {
    "MEMORY_WEBHOOK_ALLOW_PRIVATE": "1",
    "MEMORY_WEBHOOK_TIMEOUT_S": "30",
    "MEMORY_WEBHOOK_RETRY_BASE_S": "0.05",
    "MEMORY_WEBHOOK_RETRY_MAX_S": "0.3",
}


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLlamaServer]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as server:
        yield server


@pytest.fixture
def service(fake: FakeLlamaServer, tmp_path: Path) -> Iterator[InProcessService]:
    with InProcessService(tmp_path / "data", fake.url, env=ENV) as svc:
        yield svc


@pytest.fixture
def receivers() -> Iterator[Receivers]:
    with Receivers() as hooks:
        yield hooks


def _subscribe(svc: InProcessService, key: str, url: str) -> None:
    with svc.client(key) as client:
        answer = client.post("/v1/webhooks", json={"url": url, "events": ["memory.extracted"]})
        assert answer.status_code == 201, answer.text


def _save(svc: InProcessService, key: str, text: str) -> str:
    with svc.client(key) as client:
        answer = client.post("/v1/remember", json={"text": text, "agent_id": "a", "wait_s": 30})
        assert answer.status_code in (200, 201, 202) and answer.json()["status"] == "done", answer.text
        return str(answer.json()["id"])


@pytest.mark.parametrize("mode", ["trickle", "silent", "endless"])
def test_a_hostile_receiver_holds_only_its_own_teams_deliveries(service, receivers, mode):
    rss_before = rss_mb()
    for _ in range(HOSTILE_SUBSCRIPTIONS):  # team B's receivers misbehave
        _subscribe(service, "key-b", receivers.url(mode))
    _subscribe(service, "key-a", receivers.url("ok"))  # team A's receiver is fine
    for n in range(4):
        _save(service, "key-b", f"Team B's note {n}: the mirror in rack {n} was resynced.")
    eventually(f"the {mode} receiver getting deliveries", lambda: receivers.snapshot(mode).requests > 0)

    mid = _save(service, "key-a", "Team A rotated the signing key of the billing API.")
    arrival = eventually(
        "team A's event",
        lambda: next((a for a in receivers.snapshot("ok").arrivals if a.event["data"]["memory_id"] == mid), None),
        timeout=60,
    )
    assert arrival.latency_s < QUIET_BOUND_S, f"team A's event took {arrival.latency_s:.1f} s behind team B's {mode}"
    assert arrival.event["team"] == "team-a"

    hostile = receivers.snapshot(mode)
    if mode in ("trickle", "silent"):  # A's event went while B's attempts were still held, not after them
        assert hostile.open_connections > 0
    if mode == "endless":  # the service read a few KiB of each 3 GB answer, then hung up
        eventually("the service hanging up", lambda: receivers.snapshot(mode).open_connections == 0, timeout=60)
        assert receivers.snapshot(mode).body_bytes_sent < 64 * 1024**2 * HOSTILE_SUBSCRIPTIONS
    grown = rss_mb() - rss_before
    assert grown < RSS_BOUND_MB, f"the process grew {grown:.0f} MB against a {mode} receiver"


def test_a_stuck_attempt_ends_at_its_deadline_and_is_shown_failing(fake, tmp_path, receivers):
    """One deadline for the whole attempt (not per read): a byte every 0.5 s never trips a 1 s read timeout,
    yet the attempt ends at 1 s, is recorded, and /ready and the console name the failing subscription."""
    env = ENV | {"MEMORY_WEBHOOK_TIMEOUT_S": "1"}
    receivers.trickle_s = 0.5
    with InProcessService(tmp_path / "data", fake.url, env=env) as svc:
        _subscribe(svc, "key-b", receivers.url("trickle"))
        started = time.monotonic()
        _save(svc, "key-b", "Team B's receiver trickles its answer.")
        with svc.client("key-b") as client:
            sub = eventually(
                "a failed attempt recorded",
                lambda: next((s for s in client.get("/v1/webhooks").json() if s["last_error"]), None),
            )
            assert "1 s" in sub["last_error"] and "MEMORY_WEBHOOK_TIMEOUT_S" in sub["last_error"]
            assert time.monotonic() - started < 20
            failing = client.get("/ready").json()["webhooks"]["failing"]
            assert [f["id"] for f in failing] == [sub["id"]] and failing[0]["last_error"] == sub["last_error"]
        with svc.client("key-a") as client:  # another team sees none of it
            assert client.get("/ready").json()["webhooks"]["failing"] == []
        row = _console_jobs(svc, "key-b").split(f'id="webhook-{sub["id"]}"')[1].split("</tr>")[0]
        assert ">failing<" in row and "MEMORY_WEBHOOK_TIMEOUT_S" in row
