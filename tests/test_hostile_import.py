"""Import does not trust its input: bounded facts and spans, moments datetime can hold, real dates, an agent
pin, and fact vectors that a failed write leaves to the indexer's sweep instead of losing them.

In process: the real app and stores (no model server: nothing here reaches it), and for the vector write
the real journal (SQLite and PostgreSQL), embedder and Chroma.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memory_service.contract.types import MAX_FACT_SPANS, MAX_IMPORT_FACTS
from memory_service.embedding.embedder import Embedder, load_embedder
from memory_service.pipeline.forgetting import Forgetter
from memory_service.pipeline.importing import import_batch
from memory_service.pipeline.passages import PassageIndexer
from memory_service.storage.catalog import imported_fact_id
from memory_service.storage.consolidation import ConsolidationStore
from memory_service.storage.journal import Journal
from memory_service.storage.vectors import VectorItem, VectorStore

TEXT = "Alice moved the build server to Lisbon in March."


def line(**fields: Any) -> dict[str, Any]:
    """A valid export line (a fresh id each time), with `fields` changed."""
    base: dict[str, Any] = {"id": uuid.uuid4().hex, "text": TEXT, "agent_id": "porter", "created_at": 1.7e9}
    return {**base, **fields}


def fact(**fields: Any) -> dict[str, Any]:
    return {"id": uuid.uuid4().hex, "text": "Alice moved the build server to Lisbon", "spans": [[0, 38]], **fields}


def post_lines(client: Any, lines: list[str], key_headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = client.post("/v1/import", content="\n".join(lines) + "\n", headers=key_headers or {})
    assert response.status_code == 200, response.text
    return response.json()


BIG = "1e20"
HOSTILE: list[tuple[str, str]] = [
    # (raw line, what its error must name)
    (json.dumps(line(facts=[fact() for _ in range(MAX_IMPORT_FACTS + 1)])), f"at most {MAX_IMPORT_FACTS}"),
    (json.dumps(line(facts=[fact(spans=[[0, 5]] * (MAX_FACT_SPANS + 1))])), f"at most {MAX_FACT_SPANS}"),
    (json.dumps(line(facts=[fact(spans=[[0, len(TEXT) + 1]])])), f"0 <= start < end <= {len(TEXT)}"),
    (json.dumps(line(facts=[fact(spans=[[-1, 5]])])), "not inside the text"),
    (json.dumps(line(facts=[fact(spans=[[9, 3]])])), "not inside the text"),
    (json.dumps(line(facts=[fact(spans=[[4, 4]])])), "not inside the text"),
    (json.dumps(line(facts=[fact(spans=[[0, 10**400]])])), "not inside the text"),
    (json.dumps(line(facts=[fact(spans=[["0", 5]])])), "spans"),
    (json.dumps(line(facts=[fact(spans=[[0.5, 5]])])), "spans"),
    (json.dumps(line()).replace('"created_at": 1700000000.0', '"created_at": ' + BIG), "created_at"),
    (json.dumps(line()).replace('"created_at": 1700000000.0', '"created_at": -1e20'), "created_at"),
    (json.dumps(line()).replace('"created_at": 1700000000.0', '"created_at": Infinity'), "created_at"),
    (json.dumps(line()).replace('"created_at": 1700000000.0', '"created_at": NaN'), "created_at"),
    (json.dumps(line()).replace('"created_at": 1700000000.0', '"created_at": 1e400'), "created_at"),
    (json.dumps(line(occurred_at=1e20)), "occurred_at"),
    (json.dumps(line(occurred_day="2023-02-31")), "2023-02-31"),
    (json.dumps(line(occurred_day="0001-01-01")), "occurred_day"),
    (json.dumps(line(facts=[fact(created_at=1e20)])), "created_at"),
    (json.dumps(line(facts=[fact(superseded_by="x", superseded_at=-1e19)])), "superseded_at"),
]


def test_every_hostile_line_is_refused_by_line_and_bound_and_the_team_stays_readable(inprocess) -> None:
    good = line(
        occurred_at=1.6e9,
        occurred_day="2020-09-13",
        facts=[fact(spans=[[0, 0]]), fact(spans=[[0, 38], [39, len(TEXT)]], created_at=1.7e9)],
    )
    lines = [raw for raw, _ in HOSTILE] + [json.dumps(good)]
    with inprocess.client() as client:
        started = time.perf_counter()
        result = post_lines(client, lines)
        took = time.perf_counter() - started
        assert (result["imported"], result["failed"]) == (1, len(HOSTILE)), result
        for number, (error, (_, needle)) in enumerate(zip(result["errors"], HOSTILE), start=1):
            assert error["line"] == number and needle in error["detail"], (error, needle)
        assert took < 10, f"refusing the hostile lines took {took:.1f} s"  # measured: well under 1 s
        # what was imported lists, renders and exports as JSON (no Infinity, no NaN, no 500)
        assert client.get("/v1/memories").status_code == 200
        exported = client.get("/v1/export")
        assert exported.status_code == 200

        def refuse(constant: str) -> None:
            raise AssertionError(f"export wrote {constant}, which is not JSON")

        mine = [r for r in map(lambda x: json.loads(x, parse_constant=refuse), exported.text.splitlines())]
        copied = next(r for r in mine if r["text"] == TEXT and r["occurred_day"] == "2020-09-13")
        assert sorted(map(sorted, (f["spans"] for f in copied["facts"]))) == [[[0, 0]], [[0, 38], [39, len(TEXT)]]]


def test_a_pinned_key_exports_only_its_agent_and_cannot_import(inprocess) -> None:
    marker = uuid.uuid4().hex[:8]
    with inprocess.client() as admin:
        made = admin.post("/v1/keys", json={"role": "write", "agent_id": f"mine-{marker}"})
        assert made.status_code == 201, made.text
        mine, theirs = line(agent_id=f"mine-{marker}"), line(agent_id=f"theirs-{marker}")
        assert post_lines(admin, [json.dumps(mine), json.dumps(theirs)])["imported"] == 2
    with inprocess.client(made.json()["key"]) as pinned:
        exported = pinned.get("/v1/export")
        assert exported.status_code == 200
        agents = {json.loads(raw)["agent_id"] for raw in exported.text.splitlines()}
        assert agents == {f"mine-{marker}"}
        refused = pinned.post("/v1/import", content=json.dumps(line(agent_id=f"mine-{marker}")))
        assert refused.status_code == 403 and f"mine-{marker}" in refused.json()["detail"]


def test_an_export_imported_back_into_its_own_team_or_round_trip_adds_nothing(inprocess) -> None:
    """Found by the property test (tests/test_property_teams.py): a saved memory, exported and imported back into
    its own team, was imported again as a duplicate; and a copy that went to team B and came back did the same."""
    marker = uuid.uuid4().hex[:8]
    text = f"Saved natively {marker}."
    with inprocess.client("key-a") as a, inprocess.client("key-b") as b:
        saved = a.post("/v1/remember", json={"text": text, "agent_id": "porter"})
        assert saved.status_code == 202, saved.text
        mine = [raw for raw in a.get("/v1/export").text.splitlines() if marker in raw]
        assert post_lines(a, mine)["skipped"] == 1
        assert post_lines(b, mine)["imported"] == 1  # a copy in team B
        back = [raw for raw in b.get("/v1/export").text.splitlines() if marker in raw]
        tally = post_lines(a, back)
        assert (tally["imported"], tally["skipped"]) == (0, 1), tally
        listed = [m for m in a.get("/v1/memories", params={"limit": 500}).json()["items"] if m["text"] == text]
        assert len(listed) == 1


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return load_embedder("onnx")


def test_facts_imported_while_the_vector_store_fails_get_their_vectors_from_the_sweep(
    journal: Journal, embedder: Embedder, tmp_path: Path
) -> None:
    vectors = VectorStore(tmp_path / "chroma")
    # the team's fact collection holds a 3-dimensional vector: Chroma refuses every 384-dimensional write
    poison = VectorItem(id="f:poison", text="x", embedding=np.ones(3, dtype=np.float32), metadata={"kind": "fact"})
    vectors.upsert("a", [poison])
    record = line(status="done", facts=[fact(id="orig-1"), fact(id="orig-2", text="The move happened in March")])
    tally = import_batch(
        [record], team="a", journal=journal, embedder=embedder, vectors=vectors, re_extract=False, budget_s=20
    )
    assert tally.imported == 1  # the line is in: a vector store that fails loses nothing
    ids = {imported_fact_id("a", "orig-1"), imported_fact_id("a", "orig-2")}
    assert {f.id for f, _ in journal.unindexed_facts(10)} == ids
    # re-importing skips the line, as before: the facts' vectors must come from the sweep
    again = import_batch(
        [record], team="a", journal=journal, embedder=embedder, vectors=vectors, re_extract=False, budget_s=20
    )
    assert (again.imported, again.skipped) == (0, 1)
    vectors.drop("a")  # the store works again
    forgetter = Forgetter(journal, vectors, ConsolidationStore(journal))
    PassageIndexer(journal, embedder, vectors, forgetter.finish_pending)._sweep_facts()
    assert set(vectors.embeddings("a", "fact", sorted(ids))) == ids
    assert journal.unindexed_facts(10) == []
    vectors.close()


def test_imported_facts_are_indexed_at_once_when_the_store_works(journal: Journal, embedder: Embedder, tmp_path: Path):
    vectors = VectorStore(tmp_path / "chroma")
    record = line(status="done", facts=[fact(id="live"), fact(id="old", superseded_by="live", superseded_at=1.7e9)])
    import_batch([record], team="a", journal=journal, embedder=embedder, vectors=vectors, re_extract=False, budget_s=20)
    assert journal.unindexed_facts(10) == []
    assert set(vectors.embeddings("a", "fact", [imported_fact_id("a", x) for x in ("live", "old")])) == {
        imported_fact_id("a", "live")
    }
    vectors.close()
