"""Backup and restore on the real service (a subprocess, over HTTP) with the fake model.

`memory-service backup` runs as a command while the service serves; later saves, consumes and
handled keys must all be gone after `memory-service restore`, and everything backed up must be
back: memories and facts, limit usage, handled keys, and recall by meaning (rebuilt vectors) and by
exact id (keyword index). A damaged backup must change nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import ServiceProcess, wait_status

from memory_service.storage.datalock import DataDirBusy, DataDirLock
from memory_service.storage.journal import Journal
from memory_service.storage.limits import LimitStore
from tests.fakes.fake_llama_server import FakeLlamaServer

pytestmark = pytest.mark.process  # backup and restore run as the CLI, beside a serve subprocess

BACKUP_TEXT = "The staging database backups run every night at 02:00 and are kept for fourteen days."
PARAPHRASE = "How long are snapshots retained?"
TICKET_TEXT = "Escalation for ticket INC-48213 goes to Priya Raman on the platform team."
OTHER_TEXTS = [
    "The pump station in Valencia was serviced on 3 March by the Acme crew.",
    "Marco prefers the quarterly report as a single PDF attached to the email.",
]
PENDING_TEXT = "The firewall change for the billing cluster is scheduled for Thursday evening."
LATER_TEXT = "The warehouse robots were upgraded to firmware 7.4 after the audit."
LIMIT, KEY, LATER_KEY = "outbound-email", "https://example.com/tickets/1", "https://example.com/tickets/2"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLlamaServer]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as server:
        yield server


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`memory-service ARGS` as an operator runs it, with no MEMORY_* setting from this environment but the
    embedder's (the data dir is always given with --data-dir)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MEMORY_") or k in ("MEMORY_CACHE_DIR", "MEMORY_EMBED_THREADS", "MEMORY_EMBEDDER")
    }
    return subprocess.run(
        [sys.executable, "-m", "memory_service.cli.main", "--json", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def summary(result: subprocess.CompletedProcess[str]) -> dict:
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout  # one line of JSON
    return json.loads(lines[0])


def save(client: httpx.Client, text: str, agent_id: str = "planner") -> str:
    response = client.post("/v1/remember", json={"text": text, "agent_id": agent_id})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def memories(client: httpx.Client) -> dict[str, dict]:
    """Every memory of the team, as GET /v1/memories/{id} shows it (facts included)."""
    ids, cursor = [], None
    while True:
        body = client.get("/v1/memories", params={"limit": 100, **({"cursor": cursor} if cursor else {})}).json()
        ids += [item["id"] for item in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            return {memory_id: client.get(f"/v1/memories/{memory_id}").json() for memory_id in ids}


def ledger(client: httpx.Client) -> dict:
    """Limit usage and handled keys, as the API shows them."""
    return {
        "limit": client.get(f"/v1/limits/{LIMIT}").json(),
        "handled": client.get("/v1/handled", params={"key": KEY}).json(),
        "later_handled": client.get("/v1/handled", params={"key": LATER_KEY}).status_code,
    }


def recall(client: httpx.Client, query: str, kind: str) -> list[dict]:
    response = client.post("/v1/recall", json={"query": query, "k": 5, "kinds": [kind]})
    assert response.status_code == 200, response.text
    return response.json()["items"]


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_backup_while_serving_then_restore_gives_back_exactly_the_backup(fake, tmp_path):
    data, backup_dir = tmp_path / "data", tmp_path / "backup"
    fake.set_mode("ok")
    svc = ServiceProcess(data, fake.url).start()
    try:
        with svc.client("key-a") as a, svc.client("key-b") as b:
            kept = {text: save(a, text) for text in [BACKUP_TEXT, TICKET_TEXT, *OTHER_TEXTS]}
            other_team = save(b, "Team B keeps its own notes about the staging database.", "b-agent")
            for memory_id in [*kept.values(), other_team]:
                assert wait_status(a if memory_id != other_team else b, memory_id)["status"] == "done"
            assert a.put(f"/v1/limits/{LIMIT}", json={"daily_limit": 10, "timezone": "UTC"}).status_code == 201
            assert a.post(f"/v1/limits/{LIMIT}/consume", json={"agent_id": "mailer", "amount": 3}).json()["used"] == 3
            assert a.post("/v1/handled", json={"key": KEY}).json()["first_time"] is True
            # a job the model cannot take yet: queued in the backup, extracted after the restore
            fake.set_mode("loading")
            pending = save(a, PENDING_TEXT)
            before = memories(a)
            before_b = memories(b)
            before_ledger = ledger(a)
            assert before[pending]["status"] in ("queued", "extracting")
            assert all(before[m]["status"] == "done" and before[m]["facts"] for m in kept.values())

            kept_key = json.loads(
                cli("keys", "create", "--team", "team-a", "--role", "read", "--data-dir", str(data)).stdout
            )["key"]
            made = summary(cli("backup", str(backup_dir), "--data-dir", str(data)))  # while the service runs
            assert made["memories"] == len(kept) + 2 and made["vectors"] == "rebuilt on restore"
            assert not (backup_dir / "chroma").exists()

            refused = cli("restore", str(backup_dir), "--data-dir", str(data), "--force")
            assert refused.returncode == 1 and "is running on" in refused.stderr

            fake.set_mode("ok")
            later = save(a, LATER_TEXT)
            wait_status(a, later)
            assert a.post(f"/v1/limits/{LIMIT}/consume", json={"agent_id": "mailer", "amount": 2}).json()["used"] == 5
            assert a.post("/v1/handled", json={"key": KEY}).json()["seen_count"] == 2
            assert a.post("/v1/handled", json={"key": LATER_KEY}).json()["first_time"] is True
            later_key = json.loads(
                cli("keys", "create", "--team", "team-a", "--role", "read", "--data-dir", str(data)).stdout
            )["key"]
    finally:
        assert svc.stop() == 0

    refused = cli("restore", str(backup_dir), "--data-dir", str(data))
    assert refused.returncode == 1 and "--force" in refused.stderr
    restored = summary(cli("restore", str(backup_dir), "--data-dir", str(data), "--force"))
    assert restored["vectors"] == "rebuilt" and restored["passages_embedded"] == len(kept) + 2
    assert restored["facts_embedded"] >= len(kept)
    aside = Path(restored["previous_data"])
    assert aside.parent == data.parent and (aside / "journal.sqlite3").is_file()  # kept, not deleted
    assert not [p for p in tmp_path.iterdir() if ".restoring-" in p.name]

    svc = ServiceProcess(data, fake.url).start()
    try:
        with svc.client("key-a") as a, svc.client("key-b") as b:
            after = memories(a)
            assert set(after) == set(before) and later not in after
            for memory_id in kept.values():
                assert after[memory_id] == before[memory_id]
            assert memories(b) == before_b
            assert ledger(a) == before_ledger and before_ledger["later_handled"] == 404
            assert a.get(f"/v1/memories/{later}").status_code == 404
        with svc.client(kept_key) as reader, svc.client(later_key) as unknown:  # keys are restored too
            assert reader.get("/v1/team").json()["role"] == "read"
            assert unknown.get("/v1/team").status_code == 401
        with svc.client("key-a") as a:
            # the job that was waiting for the model in the snapshot is extracted now
            done = wait_status(a, pending)
            assert done["status"] == "done" and done["facts"]

            # vector leg: no word in common with the text, so only the rebuilt vectors can find it
            passages = recall(a, PARAPHRASE, "passage")
            assert passages[0]["memory_id"] == kept[BACKUP_TEXT] and passages[0]["similarity"] is not None
            facts = recall(a, PARAPHRASE, "fact")
            assert facts[0]["memory_id"] == kept[BACKUP_TEXT] and facts[0]["similarity"] is not None
            # keyword leg: an exact id
            assert recall(a, "INC-48213", "passage")[0]["memory_id"] == kept[TICKET_TEXT]
            assert all(hit["memory_id"] != later for hit in recall(a, "warehouse robots firmware", "passage"))
            restored_state = memories(a)
    finally:
        assert svc.stop() == 0

    # with no service on the data dir, a backup also copies the vectors, and a restore uses the copy
    quiet_backup, copy_dir = tmp_path / "quiet-backup", tmp_path / "data-copy"
    made = summary(cli("backup", str(quiet_backup), "--data-dir", str(data)))
    assert made["vectors"] == "copied" and (quiet_backup / "chroma" / "chroma.sqlite3").is_file()
    restored = summary(cli("restore", str(quiet_backup), "--data-dir", str(copy_dir)))
    assert restored["vectors"] == "copied" and restored["previous_data"] is None
    svc = ServiceProcess(copy_dir, fake.url).start()
    try:
        with svc.client("key-a") as a:
            assert memories(a) == restored_state
            assert recall(a, PARAPHRASE, "passage")[0]["memory_id"] == kept[BACKUP_TEXT]
    finally:
        assert svc.stop() == 0


@pytest.fixture(scope="module")
def small_backup(tmp_path_factory) -> Path:
    """A backup of a data dir written through the stores (no service, no model needed)."""
    root = tmp_path_factory.mktemp("small")
    journal = Journal(root / "data" / "journal.sqlite3")
    journal.insert(
        team="local",
        agent_id="a",
        text="The pump station needs ticket INC-7.",
        run_id=None,
        tags=[],
        metadata={},
        idempotency_key=None,
        budget_s=20,
    )
    journal.close()
    limits = LimitStore(root / "data" / "limits.sqlite3")
    limits.set_limit("local", LIMIT, 5, "UTC", "team")
    limits.consume("local", LIMIT, "a", 2, None)
    limits.close()
    made = summary(cli("backup", str(root / "backup"), "--data-dir", str(root / "data")))
    assert made["memories"] == 1
    return root / "backup"


def _flip_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: _flip_byte(b / "journal.sqlite3"), "journal.sqlite3 does not match its checksum"),
        (lambda b: (b / "limits.sqlite3").unlink(), "limits.sqlite3 is missing"),
        (
            lambda b: (b / "limits.sqlite3").write_bytes((b / "limits.sqlite3").read_bytes()[:4096]),
            "limits.sqlite3 has 4096 bytes",
        ),
        (lambda b: (b / "manifest.json").unlink(), "not a complete backup: manifest.json is missing"),
        (lambda b: (b / "manifest.json").write_text('{"format": '), "manifest.json is unreadable"),
    ],
    ids=["flipped-byte", "missing-file", "truncated-file", "no-manifest", "broken-manifest"],
)
def test_restore_of_a_damaged_backup_fails_clearly_and_changes_nothing(small_backup, tmp_path, damage, message):
    broken = tmp_path / "broken"
    shutil.copytree(small_backup, broken)
    damage(broken)
    data = tmp_path / "data"
    (data / "chroma").mkdir(parents=True)
    conn = sqlite3.connect(data / "journal.sqlite3")
    conn.execute("CREATE TABLE marker (x)")
    conn.close()
    (data / "chroma" / "vectors.bin").write_bytes(b"current vectors")
    before = tree_digest(data)

    result = cli("restore", str(broken), "--data-dir", str(data), "--force")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("restore failed: ") and message in result.stderr, result.stderr
    assert tree_digest(data) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "data"]  # nothing staged or moved aside


def test_backup_refuses_a_non_empty_target_and_a_missing_data_dir(small_backup, tmp_path):
    result = cli("backup", str(small_backup), "--data-dir", str(small_backup.parent / "data"))
    assert result.returncode == 1 and "not empty" in result.stderr
    result = cli("backup", str(tmp_path / "b"), "--data-dir", str(tmp_path / "nowhere"))
    assert result.returncode == 1 and "no journal.sqlite3" in result.stderr
    assert not (tmp_path / "b").exists() and not (tmp_path / "nowhere").exists()


def test_a_service_waiting_on_a_restore_locks_the_restored_dir_not_the_old_one(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    restoring = DataDirLock(data).acquire(exclusive=True, wait=False)
    with pytest.raises(DataDirBusy):
        DataDirLock(data).acquire(exclusive=False, wait=False)
    service = DataDirLock(data)
    waiter = threading.Thread(target=service.acquire, kwargs={"exclusive": False, "wait": True})
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # waits for the restore
    data.rename(tmp_path / "data.before-restore")  # the swap a restore makes before it lets go
    data.mkdir()
    restoring.release()
    waiter.join(10)
    assert not waiter.is_alive()
    with pytest.raises(DataDirBusy):  # the service now holds the new data dir
        DataDirLock(data).acquire(exclusive=True, wait=False)
    DataDirLock(tmp_path / "data.before-restore").acquire(exclusive=True, wait=False).release()
    service.release()
    DataDirLock(data).acquire(exclusive=True, wait=False).release()
