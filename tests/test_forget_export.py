"""List, forget and export/import on the real service (in this process, over HTTP) with the fake model.

The fake answers with the saved text's own sentences as facts, so two texts sharing a sentence share
a fact, and "the quota is 50" then "the quota is 70" is a superseded value.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from conftest import wait_status
from inprocess import InProcessService

from memory_service.api.routes.transfer import export_chunks
from tests.fakes.fake_llama_server import FakeLlamaServer


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLlamaServer]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as server:
        yield server


@pytest.fixture(scope="module")
def service(fake: FakeLlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    svc = InProcessService(tmp_path_factory.mktemp("forget") / "data", fake.url).start()
    yield svc
    svc.stop()


def save(client: httpx.Client, text: str, agent_id: str, **extra) -> str:
    response = client.post("/v1/remember", json={"text": text, "agent_id": agent_id, **extra})
    assert response.status_code == 202, response.text
    return response.json()["id"]


def list_all(client: httpx.Client, **params) -> list[dict]:
    items, cursor = [], None
    while True:
        page = client.get("/v1/memories", params={**params, **({"cursor": cursor} if cursor else {})})
        assert page.status_code == 200, page.text
        body = page.json()
        items += body["items"]
        cursor = body["next_cursor"]
        if cursor is None:
            return items


def export(client: httpx.Client) -> list[dict]:
    response = client.get("/v1/export")
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in response.text.splitlines() if line]


def recall_texts(client: httpx.Client, query: str) -> list[dict]:
    items = []
    for kind in ("passage", "fact"):
        response = client.post("/v1/recall", json={"query": query, "k": 100, "kinds": [kind]})
        assert response.status_code == 200, response.text
        items += response.json()["items"]
    return items


def test_list_pages_newest_first_filters_and_stays_in_the_team(service):
    marker = uuid.uuid4().hex[:8]
    with service.client("key-a") as a, service.client("key-b") as b:
        ids = [
            save(
                a,
                f"Lister {marker} note number {i} about the pump station.",
                f"lister-{marker}",
                run_id=f"run-{i % 2}",
                tags=["even" if i % 2 == 0 else "odd"],
            )
            for i in range(7)
        ]
        for memory_id in ids:
            wait_status(a, memory_id)
        pages, cursor = [], None
        while True:
            body = a.get(
                "/v1/memories",
                params={"agent_id": f"lister-{marker}", "limit": 3, **({"cursor": cursor} if cursor else {})},
            ).json()
            pages.append(body["items"])
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert [len(p) for p in pages] == [3, 3, 1]
        listed = [item["id"] for page in pages for item in page]
        assert listed == list(reversed(ids))  # newest first, nothing twice, nothing missed
        first = pages[0][0]
        assert first["text"].startswith(f"Lister {marker}") and first["status"] == "done" and first["facts"] >= 1
        assert set(first) == {"id", "status", "agent_id", "run_id", "text", "tags", "created_at", "facts"}
        mine = {"agent_id": f"lister-{marker}"}
        assert {i["id"] for i in list_all(a, **mine, run_id="run-0")} == set(ids[0::2])
        assert {i["id"] for i in list_all(a, **mine, tag="odd")} == set(ids[1::2])
        assert len(list_all(a, **mine, status="done")) == 7 and list_all(a, **mine, status="queued") == []
        assert list_all(a, **mine, since="2999-01-01T00:00:00Z") == []
        assert b.get("/v1/memories", params=mine).json() == {"items": [], "next_cursor": None}
        for params, status in (
            ({"limit": 0}, 422),
            ({"limit": 501}, 422),
            ({"status": "lost"}, 422),
            ({"cursor": "not-a-cursor"}, 400),
            ({"since": "yesterday"}, 422),
            ({"since": "2030-01-01T00:00:00Z", "until": "2020-01-01T00:00:00Z"}, 422),
        ):
            response = a.get("/v1/memories", params=params)
            assert response.status_code == status, (params, response.text)
            assert response.json()["detail"] and response.json()["error"]


def test_forget_one_removes_text_and_sole_facts_and_keeps_shared_facts(service):
    marker = uuid.uuid4().hex[:8]
    shared = f"The harbour crane {marker} is rated for forty tonnes."
    with service.client("key-a") as a, service.client("key-b") as b:
        gone = save(a, f"{shared} Marta Kowalski inspected the crane cables {marker}gone.", "inspector")
        kept = save(a, f"{shared} Pieter Jansen repainted the crane cabin {marker}kept.", "painter")
        for memory_id in (gone, kept):
            assert wait_status(a, memory_id)["status"] == "done"
        before = a.get(f"/v1/memories/{gone}").json()["facts"]
        assert any(f"{marker}gone" in f["text"] for f in before), before
        assert any(shared in f["text"] for f in before), before

        assert b.delete(f"/v1/memories/{gone}").status_code == 404  # another team's id: as unknown
        unknown = a.delete("/v1/memories/mem_doesnotexist")
        assert unknown.status_code == 404
        assert b.delete(f"/v1/memories/{gone}").json()["detail"].replace(gone, "X") == unknown.json()["detail"].replace(
            "mem_doesnotexist", "X"
        )
        assert a.delete(f"/v1/memories/{gone}").status_code == 204
        assert a.delete(f"/v1/memories/{gone}").status_code == 404

        assert a.get(f"/v1/memories/{gone}").status_code == 404
        assert gone not in {i["id"] for i in list_all(a, agent_id="inspector")}
        assert gone not in {r["id"] for r in export(a)}
        items = recall_texts(a, f"Marta Kowalski crane cables {marker}gone harbour {marker}")
        assert all(f"{marker}gone" not in i["text"] and i["memory_id"] != gone for i in items), items
        assert all(gone not in i["source_memory_ids"] for i in items)
        facts = [i for i in items if i["kind"] == "fact" and shared in i["text"]]
        assert facts and all(i["memory_id"] == kept and i["source_memory_ids"] == [kept] for i in facts), facts
        kept_facts = a.get(f"/v1/memories/{kept}").json()["facts"]
        assert any(shared in f["text"] for f in kept_facts)


def test_forgetting_a_text_mid_extraction_does_not_bring_it_back(fake, service):
    marker = uuid.uuid4().hex[:8]
    db = str(service.data_dir / "journal.sqlite3")
    fake.set_mode("ok", tokens_per_s=15)  # a reply takes seconds: time to forget the text under it
    try:
        with service.client("key-a") as a:
            memory_id = save(a, f"Ingrid Olsen moved the backup window {marker} to three in the morning.", "ops")
            wait_status(a, memory_id, statuses=("extracting",), timeout=30)
            assert a.delete(f"/v1/memories/{memory_id}").status_code == 204
            deadline = time.monotonic() + 30
            while f"job {memory_id}: its memory was forgotten" not in service.log():
                assert time.monotonic() < deadline, service.log()[-2000:]
                time.sleep(0.2)
            assert a.get(f"/v1/memories/{memory_id}").status_code == 404
            assert all(i["id"] != memory_id for i in list_all(a, agent_id="ops"))
            assert all(marker not in i["text"] for i in recall_texts(a, f"Ingrid Olsen backup window {marker}"))
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                assert conn.execute("SELECT COUNT(*) FROM memories WHERE id = ?", (memory_id,)).fetchone()[0] == 0
                assert conn.execute("SELECT COUNT(*) FROM facts WHERE text LIKE ?", (f"%{marker}%",)).fetchone()[0] == 0
    finally:
        fake.set_mode("ok", tokens_per_s=20_000)


def test_bulk_forget_needs_a_selector_and_confirm_and_stays_in_the_team(service):
    marker = uuid.uuid4().hex[:8]
    agent = f"bulk-{marker}"
    with service.client("key-a") as a, service.client("key-b") as b:
        mine = [save(a, f"Bulk {marker} entry {i} about ledger reconciliation.", agent) for i in range(5)]
        theirs = save(b, f"Bulk {marker} entry of the other team.", agent)
        other = save(a, f"Bulk {marker} entry by someone else.", f"other-{marker}")
        refused = a.delete("/v1/memories", params={"agent_id": agent})
        assert refused.status_code == 400 and "confirm=true" in refused.json()["detail"]
        assert a.delete("/v1/memories", params={"confirm": "true"}).status_code == 400
        assert len(list_all(a, agent_id=agent)) == 5
        response = a.delete("/v1/memories", params={"agent_id": agent, "confirm": "true"})
        assert response.status_code == 200 and response.json() == {"deleted": 5}
        assert list_all(a, agent_id=agent) == []
        assert all(a.get(f"/v1/memories/{m}").status_code == 404 for m in mine)
        assert b.get(f"/v1/memories/{theirs}").status_code == 200
        assert a.get(f"/v1/memories/{other}").status_code == 200
        again = a.delete("/v1/memories", params={"agent_id": agent, "confirm": "true"})
        assert again.json() == {"deleted": 0}


def test_export_import_round_trip_into_another_team(service):
    marker = uuid.uuid4().hex[:8]
    agent = f"porter-{marker}"
    with service.client("key-a") as a, service.client("key-b") as b:
        old = save(
            a, f"The outbound email quota {marker} is 50.", agent, tags=["quota"], metadata={"n": 1}, run_id="r1"
        )
        assert wait_status(a, old)["status"] == "done"
        new = save(a, f"The outbound email quota {marker} is 70.", agent, tags=["quota"])
        assert wait_status(a, new)["status"] == "done"
        old_facts = a.get(f"/v1/memories/{old}").json()["facts"]
        assert old_facts and old_facts[0]["superseded_by"], old_facts  # 70 replaced 50

        lines = [r for r in export(a) if r["agent_id"] == agent]
        assert [r["id"] for r in lines] == [old, new]  # oldest first
        assert lines[0]["metadata"] == {"n": 1} and lines[0]["run_id"] == "r1" and lines[0]["tags"] == ["quota"]
        assert lines[0]["facts"][0]["superseded_by"] and lines[0]["facts"][0]["spans"]
        too_big = {**lines[0], "id": "x", "metadata": {"blob": "x" * 9000}}
        body = "".join(json.dumps(r) + "\n" for r in lines) + "this line is not json\n" + json.dumps(too_big)
        response = b.post("/v1/import", content=body, headers={"content-type": "application/x-ndjson"})
        assert response.status_code == 200, response.text
        assert response.json()["imported"] == 2 and response.json()["failed"] == 2
        assert [e["line"] for e in response.json()["errors"]] == [3, 4]
        assert "metadata" in response.json()["errors"][1]["detail"]
        replay = b.post("/v1/import", content=body).json()
        assert replay["imported"] == 0 and replay["skipped"] == 2  # idempotent per line

        copied = list_all(b, agent_id=agent)
        assert sorted(i["text"] for i in copied) == sorted(r["text"] for r in lines)
        assert all(i["status"] == "done" and i["facts"] >= 1 for i in copied)
        by_text = {r["text"]: r for r in export(b) if r["agent_id"] == agent}
        for original in lines:
            twin = by_text[original["text"]]
            assert twin["created_at"] == original["created_at"] and twin["metadata"] == original["metadata"]
            assert [(f["text"], f["spans"]) for f in twin["facts"]] == [
                (f["text"], f["spans"]) for f in original["facts"]
            ]
        old_twin, new_twin = by_text[lines[0]["text"]], by_text[lines[1]["text"]]
        assert old_twin["facts"][0]["superseded_by"] == new_twin["facts"][0]["id"]  # the history, relinked
        items = b.post("/v1/recall", json={"query": f"outbound email quota {marker}", "kinds": ["fact"]}).json()[
            "items"
        ]
        assert [i["text"] for i in items if marker in i["text"]] == [lines[1]["facts"][0]["text"]]
        assert all(i["memory_id"] not in (old, new) for i in items)

        fresh = b.post(
            "/v1/import?re_extract=true",
            content=json.dumps({**lines[0], "id": "elsewhere-1", "idempotency_key": None}) + "\n",
        ).json()
        assert fresh["imported"] == 1
        again = [i for i in list_all(b, agent_id=agent) if i["id"] not in {c["id"] for c in copied}]
        assert len(again) == 1 and wait_status(b, again[0]["id"])["status"] == "done"
        assert all(r["agent_id"] != agent for r in export(a) if r["id"] not in (old, new))


def _deleted_rows(db: str) -> int | None:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return conn.execute("SELECT COUNT(*) FROM memories WHERE status = 'deleted'").fetchone()[0]
    except sqlite3.Error:
        return None


def test_export_body_is_streamed_in_chunks_of_whole_lines():
    """A chunk per line cost a worker-thread hop each (10k lines: half the export's time); per page it doesn't."""
    consumed = 0

    def records() -> Iterator[dict]:
        nonlocal consumed
        for i in range(250):
            consumed += 1
            yield {"id": f"m{i}", "text": "café\nline"}

    chunks = export_chunks(records(), size=100)
    first = next(chunks)
    assert consumed == 100 and first.count(b"\n") == 100  # streamed: nothing read ahead of the chunk sent
    rest = list(chunks)
    assert [c.count(b"\n") for c in rest] == [100, 50]
    lines = b"".join([first, *rest]).decode().splitlines()
    assert [json.loads(line) for line in lines] == [{"id": f"m{i}", "text": "café\nline"} for i in range(250)]


def test_sigkill_during_bulk_forget_never_brings_a_forgotten_text_back(fake, service_factory, tmp_path):
    data_dir = tmp_path / "kill-forget"
    service = service_factory(fake.url, data_dir=data_dir)
    doomed_agent, count = "doomed", 300
    with service.client() as client:
        doomed = [
            save(client, f"Quartzdoom entry {i}: zebra{i} crossed the yard at gate {i}.", doomed_agent)
            for i in range(count)
        ]
        keeper = save(client, "Quartzkeep entry: the zebra keeper fed the animals at gate 7.", "keeper")
        deadline = time.monotonic() + 300
        while list_all(client, status="queued") or list_all(client, status="extracting"):
            assert time.monotonic() < deadline, "extraction did not finish"
            time.sleep(0.5)
        assert any("Quartzdoom" in i["text"] for i in recall_texts(client, "zebra crossed the yard quartzdoom"))
        assert any(i["kind"] == "fact" for i in recall_texts(client, "zebra crossed the yard quartzdoom"))

    def bulk_forget() -> None:
        try:
            with service.client(timeout=120) as c:
                c.delete("/v1/memories", params={"agent_id": doomed_agent, "confirm": "true"})
        except httpx.HTTPError:
            pass  # the service was killed under it

    db = str(data_dir / "journal.sqlite3")
    worker = threading.Thread(target=bulk_forget)
    worker.start()
    deadline = time.monotonic() + 60
    while (_deleted_rows(db) or 0) == 0:
        assert time.monotonic() < deadline and worker.is_alive(), "the forget never started"
        time.sleep(0.002)
    service.kill()  # marked in SQLite, vectors part-way (or not yet) removed
    worker.join()
    left_half_done = _deleted_rows(db)

    restarted = service_factory(fake.url, data_dir=data_dir)
    with restarted.client() as client:
        assert _deleted_rows(db) == 0  # start-up finished the purge
        if left_half_done:
            assert f"finished forgetting {left_half_done} memory(ies)" in restarted.log()
        for query in ("zebra crossed the yard quartzdoom", "quartzdoom entry gate", "zebra17 gate 17"):
            items = recall_texts(client, query)
            assert all("Quartzdoom" not in i["text"] and i["memory_id"] not in doomed for i in items), items
        assert any("Quartzkeep" in i["text"] for i in recall_texts(client, "zebra keeper fed the animals"))
        assert list_all(client, agent_id=doomed_agent) == []
        assert all(client.get(f"/v1/memories/{m}").status_code == 404 for m in doomed[::30])
        assert [r["id"] for r in export(client)] == [keeper]


@pytest.mark.process  # the CLI in its own process
def test_cli_export_import_list_and_forget(service, tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    marker = uuid.uuid4().hex[:8]
    agent = f"cli-{marker}"

    def cli(*argv: str, key: str = "key-a") -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "memory_service.cli.main", "--json", *argv, "--url", service.url, "--api-key", key],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    with service.client("key-a") as a:
        ids = [save(a, f"CLI {marker} note {i} on the boiler pressure.", agent) for i in range(3)]
        for memory_id in ids:
            wait_status(a, memory_id)
    dump = tmp_path / "team-a.jsonl"
    assert cli("export", "--out", str(dump)).returncode == 0
    mine = [line for line in dump.read_text().splitlines() if marker in line]
    assert len(mine) == 3
    only_mine = tmp_path / "mine.jsonl"
    only_mine.write_text("\n".join(mine) + "\n")
    done = cli("import", str(only_mine), key="key-b")
    assert done.returncode == 0 and json.loads(done.stdout)["imported"] == 3, done.stdout + done.stderr
    listed = cli("list", "--agent-id", agent, key="key-b")
    assert listed.returncode == 0 and len(json.loads(listed.stdout)["items"]) == 3
    assert cli("forget", "--agent-id", agent, key="key-b").returncode == 2  # no --yes: a usage error
    forgot = cli("forget", "--agent-id", agent, "--yes", key="key-b")
    assert forgot.returncode == 0 and json.loads(forgot.stdout) == {"deleted": 3}
    assert cli("forget", ids[0]).returncode == 0 and cli("get", ids[0]).returncode == 1
