"""Storage under hostile timing and on a shared machine: forget racing fact decisions and saves, a restore cut
off between its two renames, and who may read the data dir.

Real journal (SQLite and PostgreSQL), real embedder and Chroma, the in-process service over HTTP against the
fake llama-server; the restore's crash window is a real process killed between the renames.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import stat
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import KEYS, ROOT

from memory_service.cli.transfer import run_export
from memory_service.config import Settings
from memory_service.embedding.embedder import Embedder, load_embedder
from memory_service.extraction.grounding import GroundedFact
from memory_service.llm.runtime.server import free_port
from memory_service.ops.backup import backup, restore
from memory_service.pipeline.dedup import decide_facts
from memory_service.pipeline.forgetting import Forgetter
from memory_service.services import Services
from memory_service.storage.consolidation import ConsolidationStore
from memory_service.storage.datadir import DataDir
from memory_service.storage.journal import Journal, Memory
from memory_service.storage.vectors import VectorStore
from tests.fakes.fake_llama_server import FakeLlamaServer

TEXT = "The Q3 marketing budget is 500 euros"


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return load_embedder("onnx")


def _claimed(journal: Journal, text: str) -> Memory:
    journal.insert(
        team="a", agent_id="bot", text=text, run_id=None, tags=[], metadata={}, idempotency_key=None, budget_s=20
    )
    job = journal.claim_next("w", 60)
    assert job is not None
    return job


def _decide_and_complete(journal: Journal, vectors: VectorStore, embedder: Embedder, job: Memory) -> None:
    plan, _ = decide_facts(
        job,
        [GroundedFact(job.text, [(0, len(job.text))])],
        journal=journal,
        embedder=embedder,
        vectors=vectors,
        near_duplicate=0.92,
    )
    assert journal.complete(job, plan, raw_reply=None, timings=None, report={})


# ---------------------------------------------------------------- forget vs. fact decisions


def test_a_forget_racing_a_merge_leaves_the_new_saves_fact(
    journal: Journal, tmp_path: Path, embedder: Embedder
) -> None:
    """Save B repeats save A's fact (a merge into A's fact) while A is forgotten: B's fact must survive.

    The forget starts while B's decision is made but not yet committed. Without the team's deciding lock the
    forget deletes A's fact (its only source) and B's commit then adds a source to a fact that no longer exists.
    """
    vectors = VectorStore(tmp_path / "chroma")
    forgetter = Forgetter(journal, vectors, ConsolidationStore(journal))
    first = _claimed(journal, TEXT)
    with journal.deciding("a"):
        _decide_and_complete(journal, vectors, embedder, first)
    second = _claimed(journal, TEXT)
    forgetting = threading.Thread(target=forgetter.forget, args=("a",), kwargs={"memory_ids": [first.id]})
    with journal.deciding("a"):
        plan, _ = decide_facts(
            second,
            [GroundedFact(TEXT, [(0, len(TEXT))])],
            journal=journal,
            embedder=embedder,
            vectors=vectors,
            near_duplicate=0.92,
        )
        assert plan.merged and not plan.new  # B's fact is A's fact
        forgetting.start()
        forgetting.join(1.0)  # a forget that does not wait for the decision is done by now
        assert journal.complete(second, plan, raw_reply=None, timings=None, report={})
    forgetting.join(30)
    assert not forgetting.is_alive()
    assert journal.get("a", first.id) is None
    facts = journal.facts_of_memory("a", second.id)
    assert [f.text for f in facts] == [TEXT]
    assert journal.fact_recall_rows("a", [facts[0].id])[facts[0].id][0] == second.id
    vectors.close()


# ---------------------------------------------------------------- forget vs. a save with the same key


@pytest.fixture(scope="module")
def fake_llama() -> FakeLlamaServer:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        yield fake


def _race_round(svc, body: dict, memory_id: str, statuses: list[int], fresh: list[str]) -> None:
    """Five clients save `body` three times each while a sixth forgets `memory_id`, all released at once."""
    barrier = threading.Barrier(6)

    def save() -> None:
        with svc.client() as own:
            barrier.wait()
            for _ in range(3):
                answer = own.post("/v1/remember", json=body)
                statuses.append(answer.status_code)
                if answer.status_code == 202 and answer.json()["created"]:
                    fresh.append(answer.json()["id"])

    def forget() -> None:
        with svc.client() as own:
            barrier.wait()
            statuses.append(own.delete(f"/v1/memories/{memory_id}").status_code)

    threads = [threading.Thread(target=save) for _ in range(5)] + [threading.Thread(target=forget)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def test_saves_racing_the_forget_of_their_idempotency_key_never_answer_5xx(inprocess_service, fake_llama) -> None:
    """A save whose key belongs to a memory being forgotten is a replay (before the forget) or a fresh save
    (after it): never a 500, and every save acknowledged as fresh can be read back."""
    svc = inprocess_service(fake_llama.url)
    statuses: list[int] = []
    fresh: list[str] = []
    forgotten: set[str] = set()
    with svc.client() as client:
        for round_ in range(8):
            key = f"race-{round_}-{uuid.uuid4().hex[:6]}"
            body = {
                "agent_id": "bot",
                "text": f"Round {round_}: the printer code is 88{round_}",
                "idempotency_key": key,
            }
            first = client.post("/v1/remember", json=body)
            assert first.status_code == 202
            forgotten.add(first.json()["id"])
            _race_round(svc, body, first.json()["id"], statuses, fresh)
        assert [s for s in statuses if s >= 500] == []
        assert set(statuses) <= {202, 204, 409}
        assert fresh, "no save came after a forget: the race was not exercised"
        for memory_id in fresh:
            assert memory_id not in forgotten
            assert client.get(f"/v1/memories/{memory_id}").status_code == 200, memory_id


# ---------------------------------------------------------------- restore cut off between its renames

# the restore in a child process, killed (SIGKILL) the moment it renames the staged data dir into place
_DIE_AT_SECOND_RENAME = """
import os, signal, sys
from pathlib import Path
from memory_service.config import Settings
from memory_service.ops.backup import restore

src, data = Path(sys.argv[1]), Path(sys.argv[2])
rename = Path.rename

def dying(self, target):
    if Path(target) == data:
        os.kill(os.getpid(), signal.SIGKILL)
    return rename(self, target)

Path.rename = dying
restore(src, Settings(data_dir=data, chroma_process=False), force=True)
"""


def _data_dir_with_one_memory(data: Path, text: str) -> None:
    data.mkdir(parents=True)
    store = DataDir(data)
    journal = store.open_journal()
    journal.insert(
        team="a", agent_id="bot", text=text, run_id=None, tags=[], metadata={}, idempotency_key=None, budget_s=20
    )
    journal.close()
    store.open_vectors().close()  # a vector store to copy: the restore needs no embedding


def _settings(data: Path) -> Settings:
    return Settings(data_dir=data, api_keys=KEYS, llm_url=f"http://127.0.0.1:{free_port()}", chroma_process=False)


@pytest.mark.process
def test_a_restore_killed_between_its_renames_is_refused_at_start_not_replaced_by_an_empty_dir(
    tmp_path: Path,
) -> None:
    data, saved = tmp_path / "data", tmp_path / "backup"
    _data_dir_with_one_memory(data, "The backed-up memory")
    backup(data, saved)
    child = subprocess.run([sys.executable, "-c", _DIE_AT_SECOND_RENAME, str(saved), str(data)], cwd=ROOT)
    assert child.returncode == -signal.SIGKILL
    assert not data.exists()  # the crash window: old data moved aside, the restored data not yet in place
    staged = [p for p in tmp_path.iterdir() if p.name.startswith(".data.restoring-")]
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("data.before-restore-")]
    assert len(staged) == 1 and len(aside) == 1
    with pytest.raises(RuntimeError, match="restore was cut off") as refused:
        Services.open(_settings(data))
    assert str(staged[0]) in str(refused.value) and str(aside[0]) in str(refused.value)
    assert not data.exists()  # no empty data dir hides the restored one
    staged[0].rename(data)  # what the message says to do
    services = Services.open(_settings(data))
    try:
        assert services.journal.counts()["queued"] == 1
    finally:
        services.close()


# ---------------------------------------------------------------- who may read the data dir


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root.parent)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


def _loose(root: Path) -> dict[str, int]:
    """Every path under `root` that its group or others may read, enter or write."""
    return {name: oct(mode) for name, mode in _modes(root).items() if mode & 0o077}


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most common umask (022): files 0644, directories 0755 unless the code says otherwise."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_the_data_dir_and_its_files_are_the_owners_only(tmp_path: Path, open_umask: None) -> None:
    data = tmp_path / "data"
    services = Services.open(_settings(data))
    try:
        services.journal.insert(
            team="a", agent_id="bot", text="secret", run_id=None, tags=[], metadata={}, idempotency_key=None, budget_s=9
        )
        top = _modes(data)
        assert top["data"] == 0o700
        for name in ("journal.sqlite3", "journal.sqlite3-wal", "limits.sqlite3", "keys.sqlite3", ".lock"):
            assert top[f"data/{name}"] == 0o600, name
    finally:
        services.close()
    assert _loose(data) == {}


def test_an_existing_world_readable_data_dir_is_tightened_at_start_and_logged_once(
    tmp_path: Path, open_umask: None, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    _data_dir_with_one_memory(data, "an older install's memory")
    for path in [data, *data.rglob("*")]:  # what an older version left: 0755 / 0644
        path.chmod(0o755 if path.is_dir() else 0o644)
    assert _loose(data)
    with caplog.at_level(logging.WARNING, logger="memory_service"):
        Services.open(_settings(data)).close()
        assert _loose(data) == {}
        assert len([r for r in caplog.records if "access away" in r.getMessage()]) == 1
        Services.open(_settings(data)).close()
        assert len([r for r in caplog.records if "access away" in r.getMessage()]) == 1  # once: nothing left


def test_backups_and_restored_data_dirs_are_the_owners_only(tmp_path: Path, open_umask: None) -> None:
    data, saved = tmp_path / "data", tmp_path / "backups" / "monday"
    _data_dir_with_one_memory(data, "a memory worth a backup")
    backup(data, saved)
    assert _loose(saved) == {}
    restored = tmp_path / "restored"
    restore(saved, Settings(data_dir=restored, chroma_process=False))
    assert _modes(restored)["restored"] == 0o700 and _loose(restored) == {}


def test_an_export_written_to_a_file_is_the_owners_only(
    inprocess_service, fake_llama: FakeLlamaServer, tmp_path: Path, open_umask: None
) -> None:
    svc = inprocess_service(fake_llama.url)
    with svc.client() as client:
        assert client.post("/v1/remember", json={"agent_id": "bot", "text": "exported secret"}).status_code == 202
    out = tmp_path / "team.jsonl"
    assert run_export(argparse.Namespace(url=svc.url, api_key="key-a", out=str(out))) == 0
    assert b"exported secret" in out.read_bytes()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
