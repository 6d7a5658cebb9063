"""A receiver down for a while gets every event after it comes back, though the service was restarted in
between: the outbox is in the journal, written with each event, and delivery resumes at the next start.
`memory-service serve` runs as a process against the fake llama-server; the receiver is a real HTTP server."""

from __future__ import annotations

import pytest
from conftest import eventually, wait_status
from fakes import FakeLlamaServer
from webhook_receiver import Receiver

from memory_service.llm.runtime.server import free_port

pytestmark = pytest.mark.process  # serve stopped and started again on the same data dir

ENV = {
    "MEMORY_WEBHOOK_ALLOW_PRIVATE": "1",  # the receiver is on loopback
    "MEMORY_WEBHOOK_RETRY_BASE_S": "0.05",
    "MEMORY_WEBHOOK_RETRY_MAX_S": "0.5",
}


def test_a_receiver_down_across_a_restart_gets_every_event_when_it_returns(service_factory, tmp_path):
    port = free_port()  # nothing listens here until the receiver comes back
    data_dir = tmp_path / "data"
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        first = service_factory(fake.url, data_dir=data_dir, env=ENV)
        with first.client() as client:
            made = client.post(
                "/v1/webhooks", json={"url": f"http://127.0.0.1:{port}/hook", "events": ["memory.extracted"]}
            )
            assert made.status_code == 201, made.text
            secret = made.json()["secret"]
            ids = [
                client.post("/v1/remember", json={"text": f"Deploy {n} finished at noon.", "agent_id": "ci"}).json()[
                    "id"
                ]
                for n in range(6)
            ]
            for mid in ids:
                assert wait_status(client, mid)["status"] == "done"
            # the receiver is down: every attempt failed, and every event waits in the outbox
            eventually("failed attempts", lambda: client.get("/v1/webhooks").json()[0]["last_error"])
            assert client.get("/ready").json()["webhooks"]["pending"] == len(ids)
        first.stop()

        receiver = Receiver(port)
        receiver.secret = secret
        try:
            second = service_factory(fake.url, data_dir=data_dir, env=ENV)
            got = eventually(
                "every event after the restart",
                lambda: (
                    (seen := {e["data"]["memory_id"] for e in receiver.of("memory.extracted")}) >= set(ids) and seen
                ),
            )
            assert got == set(ids)
            assert receiver.forged == 0  # each one signed with the secret given at creation
            with second.client() as client:
                status = eventually(
                    "the outbox drained", lambda: client.get("/ready").json()["webhooks"]["pending"] == 0
                )
                assert status
                sub = client.get("/v1/webhooks").json()[0]
                assert sub["delivered"] >= len(ids) and sub["failed"] == 0
        finally:
            receiver.close()
