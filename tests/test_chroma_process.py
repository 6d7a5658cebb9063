"""The embedded vector store served by a child process: same answers as in-process, errors told, and no child
outlives its service or a crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from memory_service.llm.runtime.server import free_port
from memory_service.storage.chroma_process import ChromaCallError
from memory_service.storage.vectors import VectorItem, VectorStore

pytestmark = pytest.mark.process  # the embedded store's child process, killed and replaced


def _items(n: int, seed: int = 0) -> list[VectorItem]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        vec = rng.standard_normal(384).astype(np.float32)
        out.append(
            VectorItem(
                id=f"p:{i}",
                text=f"text {i}",
                embedding=vec / np.linalg.norm(vec),
                metadata={"kind": "passage", "agent_id": "a" if i % 3 else "b"},
            )
        )
    return out


def _gone(pid: int, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # dead, not yet reaped by its parent
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, IndexError):
            return True
        try:  # our own child: reap it so it does not linger as a zombie
            if os.waitpid(pid, os.WNOHANG) != (0, 0):
                return True
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return False


def test_child_store_answers_as_the_in_process_store(tmp_path):
    items = _items(300)
    child, local = VectorStore(tmp_path / "child", process=True), VectorStore(tmp_path / "local")
    try:
        for store in (child, local):
            store.upsert("t", items)
            store.delete("t", ["p:7"])
        assert child.size("t", "passage") == local.size("t", "passage") == 299
        for probe in (items[7], items[8], items[100]):
            for where in (None, {"agent_id": "b"}):
                got = child.query("t", probe.embedding, 10, where=where, kind="passage")
                want = local.query("t", probe.embedding, 10, where=where, kind="passage")
                assert [h.id for h in got] == [h.id for h in want]
                assert [h.metadata for h in got] == [h.metadata for h in want]
                assert "p:7" not in {h.id for h in got}
        vectors = child.embeddings("t", "passage", ["p:1", "p:2", "p:7"])
        assert set(vectors) == {"p:1", "p:2"}
        assert np.allclose(vectors["p:2"], items[2].embedding, atol=1e-6)
        assert child.collection_names() == local.collection_names()
        assert child.drop("t") == 1 and child.collection_names() == []
    finally:
        child.close()
        local.close()


def test_a_chroma_error_is_raised_here_and_the_child_serves_on(tmp_path):
    store = VectorStore(tmp_path / "v", process=True)
    try:
        store.upsert("t", _items(5))
        with pytest.raises(ChromaCallError, match="where"):
            store.query("t", _items(1)[0].embedding, 3, where={"$nonsense": 1}, kind="passage")
        assert store.size("t", "passage") == 5
    finally:
        store.close()


def test_a_killed_child_is_replaced_and_what_it_stored_is_kept(tmp_path):
    store = VectorStore(tmp_path / "v", process=True)
    try:
        items = _items(20)
        store.upsert("t", items)
        first = store._client.pid
        os.kill(first, signal.SIGKILL)
        assert _gone(first)
        assert store.size("t", "passage") == 20  # a new child, the same data
        second = store._client.pid
        assert second != first
        assert store.query("t", items[4].embedding, 1, kind="passage")[0].id == "p:4"

        # dying in the middle of a call: the call is asked again of a new child and answers
        os.kill(second, signal.SIGSTOP)  # holds the call in flight until the kill
        answers: list = []
        caller = threading.Thread(target=lambda: answers.append(store.embeddings("t", "passage", ["p:4"])))
        caller.start()
        time.sleep(0.5)
        assert answers == [] and caller.is_alive()
        os.kill(second, signal.SIGKILL)
        caller.join(120)
        assert not caller.is_alive()
        assert np.allclose(answers[0]["p:4"], items[4].embedding, atol=1e-6)
        assert store._client.pid not in (first, second)
    finally:
        store.close()


def test_close_stops_the_child(tmp_path):
    store = VectorStore(tmp_path / "v", process=True)
    store.upsert("t", _items(3))
    pid = store._client.pid
    store.close()
    assert _gone(pid)


def test_the_child_exits_when_its_service_dies(tmp_path):
    """A service killed outright (no close) must not leave its store's process running and holding the files."""
    script = textwrap.dedent(f"""
        import os, sys, numpy as np
        from pathlib import Path
        from memory_service.storage.vectors import VectorStore, VectorItem
        store = VectorStore(Path({str(tmp_path / "v")!r}), process=True)
        store.upsert("t", [VectorItem(id="p:1", text="x", embedding=np.ones(384, dtype=np.float32),
                                      metadata={{"kind": "passage"}})])
        print(store._client.pid, flush=True)
        os.kill(os.getpid(), 9)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr
    pid = int(done.stdout.split()[0])
    assert _gone(pid), "the vector store's process outlived its service"
    store = VectorStore(tmp_path / "v", process=True)  # and the data it stored is there
    try:
        assert store.size("t", "passage") == 1
    finally:
        store.close()


def _store_process(service_pid: int) -> int:
    """The pid of the service's vector store child (the one child running this module)."""
    for pid in subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(service_pid)], capture_output=True, text=True
    ).stdout.split():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except (FileNotFoundError, ProcessLookupError):  # a short-lived child that ended after `ps` listed it
            continue
        if b"memory_service.storage.chroma_process" in cmdline:
            return int(pid)
    raise AssertionError("the service has no vector store process")


def _found_by_meaning(client, query: str, memory_id: str, timeout: float = 120) -> bool:
    """Recall over passages only, by a query sharing no word with the text: only the vector leg finds it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = client.post("/v1/recall", json={"query": query, "kinds": ["passage"], "k": 3})
        assert answer.status_code == 200, answer.text
        if any(item["memory_id"] == memory_id for item in answer.json()["items"]):
            return True
        time.sleep(0.3)
    return False


def test_a_service_whose_store_process_is_killed_keeps_every_save_findable(service_factory):
    dead_model = f"http://127.0.0.1:{free_port()}"  # passages are indexed with or without a model
    svc = service_factory(dead_model)
    with svc.client() as client:
        first = client.post("/v1/remember", json={"agent_id": "a", "text": "The ferry to the island leaves at dawn."})
        assert first.status_code == 202, first.text
        assert _found_by_meaning(client, "boat departure early morning", first.json()["id"])
        child = _store_process(svc.proc.pid)
        os.kill(child, signal.SIGKILL)
        assert _gone(child)
        second = client.post("/v1/remember", json={"agent_id": "a", "text": "Grandma bakes cinnamon bread on Sundays."})
        assert second.status_code == 202, second.text
        assert _found_by_meaning(client, "weekend pastry baking by a grandmother", second.json()["id"])
        assert _found_by_meaning(client, "boat departure early morning", first.json()["id"])
        assert _store_process(svc.proc.pid) != child
