"""`memory-service reindex`: the vector store rebuilt from the journal gives the same recalls.

The service runs as a subprocess with the fake model (it answers at once, always with facts); the
reindex runs as the command an operator types, on the embedded store and on a real `chroma run`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ServiceProcess, wait_status

from memory_service.llm.runtime.server import free_port
from memory_service.storage.vectors import KINDS, VectorStore
from tests.fakes.fake_llama_server import FakeLlamaServer

pytestmark = pytest.mark.process  # reindex runs as the CLI, beside serve subprocesses

TEXTS = {
    "a": [
        "The staging database backups run every night at 02:00 and are kept for fourteen days.",
        "Escalation for ticket INC-48213 goes to Priya Raman on the platform team.",
        "Marco prefers the quarterly report as a single PDF attached to the email.",
        "The pump station in Valencia was serviced on 3 March by the Acme crew.",
    ],
    "b": [
        "The warehouse robots were upgraded to firmware 7.4 after the audit.",
        "The firewall change for the billing cluster is scheduled for Thursday evening.",
    ],
}
QUERIES = [
    "How long are snapshots retained?",
    "who handles escalations",
    "report format preferences",
    "maintenance of pumps",
    "firmware upgrade",
    "network change window",
]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLlamaServer]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as server:
        yield server


def reindex(data: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`memory-service reindex` with no MEMORY_* setting from this environment but the embedder's."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MEMORY_") or k in ("MEMORY_CACHE_DIR", "MEMORY_EMBED_THREADS", "MEMORY_EMBEDDER")
    }
    return subprocess.run(
        [sys.executable, "-m", "memory_service.cli.main", "--json", "reindex", "--data-dir", str(data), *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def summary(result: subprocess.CompletedProcess[str]) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip())


def keys_env(teams: dict[str, str]) -> dict[str, str]:
    return {"MEMORY_API_KEYS": ",".join(f"key-{name}:{team}" for name, team in teams.items())}


def fill(svc: ServiceProcess, teams: dict[str, str]) -> None:
    """Save each team's texts and wait for their facts."""
    for name, texts in TEXTS.items():
        with svc.client(f"key-{name}") as client:
            ids = [client.post("/v1/remember", json={"text": t, "agent_id": "scribe"}).json()["id"] for t in texts]
            for memory_id in ids:
                memory = wait_status(client, memory_id)
                assert memory["status"] == "done" and memory["facts"], memory


def recalls(svc: ServiceProcess) -> dict[tuple[str, str, str], list[tuple]]:
    """Every query's hits, in order, per team and kind (so the vector search is what is compared)."""
    out = {}
    for name in TEXTS:
        with svc.client(f"key-{name}") as client:
            for query in QUERIES:
                for kind in KINDS:
                    items = client.post("/v1/recall", json={"query": query, "k": 5, "kinds": [kind]}).json()["items"]
                    out[(name, query, kind)] = [(i["kind"], i["memory_id"], i["fact_id"], i["text"]) for i in items]
    assert any(hits for (_, _, kind), hits in out.items() if kind == "fact")
    return out


def vector_counts(vectors: VectorStore, teams: dict[str, str]) -> dict[tuple[str, str], int]:
    return {(name, kind): vectors.size(team, kind) for name, team in teams.items() for kind in KINDS}


def embedded_counts(path: Path, teams: dict[str, str], *, drop: bool = False) -> dict[tuple[str, str], int]:
    """The counts in the embedded store at `path` (its teams' collections dropped after, with `drop`); the
    store is closed again, so a later open sees what other processes wrote."""
    vectors = VectorStore(path)
    try:
        counts = vector_counts(vectors, teams)
        for team in teams.values() if drop else ():
            vectors.drop(team)
        return counts
    finally:
        vectors.close()


def test_reindex_rebuilds_the_embedded_store_with_the_same_recalls(fake, tmp_path):
    teams = {"a": "team-a", "b": "team-b"}
    data = tmp_path / "data"
    svc = ServiceProcess(data, fake.url, keys_env(teams)).start()
    try:
        fill(svc, teams)
        before = recalls(svc)
        refused = reindex(data)  # the service holds the data dir
        assert refused.returncode == 1 and "running" in refused.stderr, refused.stderr
    finally:
        assert svc.stop() == 0
    counts = embedded_counts(data / "chroma", teams)

    shutil.rmtree(data / "chroma")
    done = summary(reindex(data))
    assert done["passages_embedded"] == sum(len(t) for t in TEXTS.values()) and done["facts_embedded"] >= 6
    assert done["team"] is None

    svc = ServiceProcess(data, fake.url, keys_env(teams)).start()
    try:
        assert recalls(svc) == before
    finally:
        assert svc.stop() == 0
    assert embedded_counts(data / "chroma", teams) == counts


def test_reindex_team_rebuilds_only_that_teams_collections(fake, tmp_path):
    teams = {"a": "team-a", "b": "team-b"}
    data = tmp_path / "data"
    svc = ServiceProcess(data, fake.url, keys_env(teams)).start()
    try:
        fill(svc, teams)
    finally:
        assert svc.stop() == 0
    counts = embedded_counts(data / "chroma", teams, drop=True)
    assert all(v for (_, kind), v in counts.items() if kind != "consolidated")  # consolidation is off here

    done = summary(reindex(data, "--team", "team-a"))
    assert done["team"] == "team-a" and done["passages_embedded"] == len(TEXTS["a"])
    after = embedded_counts(data / "chroma", teams)
    assert {k: v for k, v in after.items() if k[0] == "a"} == {k: v for k, v in counts.items() if k[0] == "a"}
    assert {v for k, v in after.items() if k[0] == "b"} == {0}  # team B's collections were left alone


def test_reindex_rebuilds_the_collections_on_a_chroma_server(chroma_server, fake, tmp_path):
    run = uuid.uuid4().hex[:8]  # the server is shared by the session: teams of this test only
    teams = {"a": f"team-a-{run}", "b": f"team-b-{run}"}
    env = {**keys_env(teams), "MEMORY_CHROMA_URL": chroma_server.url}
    data = tmp_path / "data"
    svc = ServiceProcess(data, fake.url, env).start()
    try:
        fill(svc, teams)
        before = recalls(svc)
    finally:
        assert svc.stop() == 0
    vectors = VectorStore(url=chroma_server.url)
    counts = vector_counts(vectors, teams)
    for team in teams.values():
        vectors.drop(team)

    done = summary(reindex(data, env={"MEMORY_CHROMA_URL": chroma_server.url}))
    assert done["reindexed"] == chroma_server.url and not (data / "chroma").exists()
    assert vector_counts(vectors, teams) == counts

    svc = ServiceProcess(data, fake.url, env).start()
    try:
        assert recalls(svc) == before
    finally:
        assert svc.stop() == 0


def test_reindex_refuses_an_unreachable_chroma_server(fake, tmp_path):
    data = tmp_path / "data"
    ServiceProcess(data, fake.url).start().stop()
    url = f"http://127.0.0.1:{free_port()}"
    result = reindex(data, env={"MEMORY_CHROMA_URL": url})
    assert result.returncode == 1 and f"MEMORY_CHROMA_URL={url}" in result.stderr, result.stderr
