"""Facts a person would sign, end to end: the real service extracts a multi-speaker ops log through the fake
llama-server, whose reply holds the field cases (altered and invented identifiers, a case-changed email,
another line's speaker prefix, two values of one attribute, a pleasantry)."""

from __future__ import annotations

from pathlib import Path

from conftest import wait_status
from inprocess import InProcessService

from tests.fakes.fake_llama_server import FakeLlamaServer

LOG = (
    "Priya: Starting the migration now, questions go to alice@example.com.\n"
    "Tomás: I moved 45 tables from db-1 to db-2.\n"
    "Priya: The standup moved to 10:00.\n"
    "Priya: Correction, the standup moved to 10:30.\n"
    "Tomás: Haha that was fun, thanks so much for your patience today! Talk soon :)"
)
REPLY = [
    "Priya: Tomás moved 45 tables from db-1 to db-2.",
    "Tomás moved 45 tables from db-1 to db-1.",
    "Tomás moved 45 tables to db-16.",
    "Questions go to Alice@example.com.",
    "The standup moved to 10:00.",
    "The standup moved to 10:30.",
    "Haha that was fun, thanks so much for your patience today!",
]


def test_a_multi_speaker_log_keeps_only_facts_a_person_would_sign(tmp_path: Path) -> None:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        fake.set_mode("ok", facts=REPLY)
        with InProcessService(tmp_path / "data", fake.url) as service, service.client() as http:
            saved = http.post("/v1/remember", json={"text": LOG, "agent_id": "ops"}).json()["id"]
            done = wait_status(http, saved)
    facts = [f["text"] for f in done["facts"]]
    assert "Tomás moved 45 tables from db-1 to db-2." in facts  # the line's speaker, no other prefix
    assert "Priya: Questions go to alice@example.com." in facts  # the source's spelling
    assert "Priya: The standup moved to 10:30." in facts
    assert not any("10:00" in f or "db-16" in f or "db-1 to db-1" in f or "patience" in f for f in facts)
    assert not any(f.startswith("Priya: Tomás") for f in facts)
    codes = sorted(r["code"] for r in done["rejected_facts"])
    assert codes == ["identifiers", "identifiers", "small_talk"]
    assert done["extraction"]["conflicts"] == [
        {"kept": "Priya: The standup moved to 10:30.", "superseded": "Priya: The standup moved to 10:00."}
    ]
