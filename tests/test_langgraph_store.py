"""LangGraph's store over the service: `MemoryServiceStore` against the real app on a real port (in this
process, with the fake llama-server), and a real LangGraph graph that writes in one thread and finds it in
another. Each test's store has its own agent id, so the tests share one service and never each other's items."""

from __future__ import annotations

import asyncio
import importlib
import sys
import tomllib
import uuid
from collections.abc import Iterator
from typing import Any, TypedDict

import pytest
from conftest import ROOT
from inprocess import InProcessService
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import BaseStore, GetOp, PutOp, SearchOp

from memory_service.client import Forbidden, MemoryClient
from memory_service.integrations.langgraph import MemoryServiceStore
from tests.fakes.fake_llama_server import FakeLlamaServer


@pytest.fixture(scope="module", autouse=True)
def no_tracing() -> Iterator[None]:
    """LangGraph's tracer (langsmith) is off unless asked; say so anyway, so nothing here phones home."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("LANGSMITH_TRACING", "false")
        env.setenv("LANGCHAIN_TRACING_V2", "false")
        yield


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        svc = InProcessService(tmp_path_factory.mktemp("langgraph") / "data", fake.url).start()
        yield svc
        svc.stop()


@pytest.fixture
def agent() -> str:
    return f"lg-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def store(service: InProcessService, agent: str) -> Iterator[MemoryServiceStore]:
    with MemoryServiceStore(service.url, api_key="key-a", agent_id=agent) as made:
        yield made


def _saved_texts(service: InProcessService, agent: str, key: str = "key-a") -> list[str]:
    """What the service holds for the store's agent, read with our own client."""
    with MemoryClient(service.url, api_key=key) as memory:
        return [m.text for m in memory.list(agent_id=agent, limit=500).items]


VALUE = {
    "text": 'Ünïcode, quotes " and a newline\n',
    "n": 3,
    "ratio": 0.1,
    "big": 10**30,
    "ok": True,
    "none": None,
    "list": [1, "two", {"three": [3.5]}],
    "nested": {"deep": {"er": "x"}},
}


def test_get_returns_exactly_the_value_put(store: MemoryServiceStore) -> None:
    """Any JSON dict comes back equal, whatever the key: a key with the service's reserved prefixes too."""
    for key in ("plain", "hindsight:bank:doc:0", "import:mem_1", "with spaces / and : colons"):
        store.put(("users", "alice"), key, VALUE)
        item = store.get(("users", "alice"), key)
        assert item is not None and item.value == VALUE and item.key == key and item.namespace == ("users", "alice")
        assert list(item.value) == list(VALUE)  # the order of the fields too
    assert store.get(("users", "alice"), "never-put") is None
    assert store.get(("users", "bob"), "plain") is None  # same key, another namespace


def test_put_and_delete_are_idempotent(service: InProcessService, store: MemoryServiceStore, agent: str) -> None:
    ns = ("prefs", "alice")
    store.put(ns, "food", {"likes": "pizza"})
    store.put(ns, "food", {"likes": "pizza"})
    assert len(_saved_texts(service, agent)) == 1
    store.put(ns, "food", {"likes": "sushi"})  # replaces: the older text is forgotten
    store.put(ns, "food", {"likes": "sushi"})
    assert store.get(ns, "food").value == {"likes": "sushi"}
    assert len(_saved_texts(service, agent)) == 1
    store.put(ns, "food", {"likes": "pizza"})  # back to a value saved (and forgotten) before
    assert store.get(ns, "food").value == {"likes": "pizza"} and len(_saved_texts(service, agent)) == 1
    store.delete(ns, "food")
    store.delete(ns, "food")
    store.delete(ns, "never-put")
    assert store.get(ns, "food") is None and _saved_texts(service, agent) == []
    store.put(ns, "food", {"likes": "tea"})
    store.batch([PutOp(ns, "food", None)])  # value None deletes, as LangGraph specifies
    assert store.get(ns, "food") is None and _saved_texts(service, agent) == []


def test_a_batch_runs_in_order(store: MemoryServiceStore) -> None:
    ns = ("batch",)
    got = store.batch([PutOp(ns, "k", {"v": 1}), GetOp(ns, "k"), PutOp(ns, "k", None), GetOp(ns, "k")])
    assert got[0] is None and got[1].value == {"v": 1} and got[2] is None and got[3] is None


def _seed(store: MemoryServiceStore) -> None:
    store.put(("users", "alice", "prefs"), "food", {"note": "Alice loves margherita pizza", "kind": "food", "n": 5})
    store.put(("users", "alice", "prefs"), "drink", {"note": "Alice drinks green tea", "kind": "drink", "n": 2})
    store.put(("users", "alice", "trips"), "rome", {"note": "Alice ate pizza in Rome", "kind": "trip", "n": 9})
    store.put(("users", "bob", "prefs"), "food", {"note": "Bob loves pizza with anchovies", "kind": "food", "n": 7})


def _keys(items: list[Any]) -> set[tuple[tuple[str, ...], str]]:
    return {(item.namespace, item.key) for item in items}


def test_search_by_meaning_under_a_prefix_with_filters(store: MemoryServiceStore) -> None:
    _seed(store)
    hits = store.search(("users", "alice"), query="pizza")
    assert _keys(hits) == {(("users", "alice", "prefs"), "food"), (("users", "alice", "trips"), "rome")}
    assert all(hit.score is not None for hit in hits) and hits[0].value["note"].startswith("Alice")
    assert _keys(store.search(("users",), query="pizza", filter={"kind": "food"})) == {
        (("users", "alice", "prefs"), "food"),
        (("users", "bob", "prefs"), "food"),
    }
    assert _keys(store.search(("users",), query="pizza", filter={"n": {"$gt": 6}})) == {
        (("users", "alice", "trips"), "rome"),
        (("users", "bob", "prefs"), "food"),
    }
    assert store.search(("users", "carol"), query="pizza") == []


def test_search_without_a_query_lists_with_filters_and_pages(store: MemoryServiceStore) -> None:
    _seed(store)
    everything = store.search(("users",), limit=10)
    assert len(everything) == 4 and all(hit.score is None for hit in everything)
    assert _keys(store.search(("users", "alice", "prefs"))) == {
        (("users", "alice", "prefs"), "food"),
        (("users", "alice", "prefs"), "drink"),
    }
    assert _keys(store.search((), filter={"kind": "food", "n": {"$lte": 5}})) == {(("users", "alice", "prefs"), "food")}
    assert _keys(store.search(("users",), filter={"kind": {"$ne": "food"}})) == {
        (("users", "alice", "prefs"), "drink"),
        (("users", "alice", "trips"), "rome"),
    }
    pages = store.search(("users",), limit=2) + store.search(("users",), limit=2, offset=2)
    assert _keys(pages) == _keys(everything) and len(pages) == 4


def test_a_value_with_more_fields_than_tags_still_filters(store: MemoryServiceStore) -> None:
    """Past the service's 32 tags the fields are matched on this side: an equality filter still finds it."""
    wide = {f"f{i}": i for i in range(40)}
    store.put(("wide",), "w", wide)
    assert store.get(("wide",), "w").value == wide
    assert _keys(store.search(("wide",), query="f39", filter={"f39": 39})) == {(("wide",), "w")}
    assert store.search(("wide",), query="f39", filter={"f39": 38}) == []


def test_list_namespaces(store: MemoryServiceStore) -> None:
    _seed(store)
    assert store.list_namespaces() == [
        ("users", "alice", "prefs"),
        ("users", "alice", "trips"),
        ("users", "bob", "prefs"),
    ]
    assert store.list_namespaces(prefix=("users", "alice")) == [
        ("users", "alice", "prefs"),
        ("users", "alice", "trips"),
    ]
    assert store.list_namespaces(suffix=("prefs",)) == [("users", "alice", "prefs"), ("users", "bob", "prefs")]
    assert store.list_namespaces(prefix=("users", "*", "prefs")) == [
        ("users", "alice", "prefs"),
        ("users", "bob", "prefs"),
    ]
    assert store.list_namespaces(max_depth=2) == [("users", "alice"), ("users", "bob")]
    assert store.list_namespaces(limit=1, offset=1) == [("users", "alice", "trips")]


def test_the_async_twins(service: InProcessService, agent: str) -> None:
    async def run() -> None:
        async with MemoryServiceStore(service.url, api_key="key-a", agent_id=agent) as store:
            ns = ("users", "dana")
            await store.aput(ns, "food", {"note": "Dana loves ramen"})
            await store.aput(ns, "food", {"note": "Dana loves ramen"})
            assert (await store.aget(ns, "food")).value == {"note": "Dana loves ramen"}
            assert _keys(await store.asearch(("users",), query="ramen")) == {(ns, "food")}
            assert _keys(await store.asearch(("users",))) == {(ns, "food")}
            assert await store.alist_namespaces() == [ns]
            got = await store.abatch([SearchOp(("users",), query="ramen"), GetOp(ns, "food")])
            assert _keys(got[0]) == {(ns, "food")} and got[1].value == {"note": "Dana loves ramen"}
            await store.aput(ns, "food", {"note": "Dana now prefers udon"})
            assert (await store.aget(ns, "food")).value == {"note": "Dana now prefers udon"}
            await store.adelete(ns, "food")
            await store.adelete(ns, "food")
            assert await store.aget(ns, "food") is None and await store.alist_namespaces() == []

    asyncio.run(run())
    assert _saved_texts(service, agent) == []


def test_two_teams_keys_never_see_each_other(service: InProcessService, agent: str) -> None:
    """The team is the API key's: the same agent, namespace and key in two teams are two items."""
    ns = ("users", "erin")
    with (
        MemoryServiceStore(service.url, api_key="key-a", agent_id=agent) as a,
        MemoryServiceStore(service.url, api_key="key-b", agent_id=agent) as b,
    ):
        a.put(ns, "secret", {"note": "Team A's launch code is tulip"})
        assert b.get(ns, "secret") is None
        assert b.search(("users",), query="launch code tulip") == [] and b.search(()) == []
        assert b.list_namespaces() == []
        b.put(ns, "secret", {"note": "Team B's launch code is daisy"})
        b.delete(ns, "secret")  # forgets B's item only
        assert a.get(ns, "secret").value == {"note": "Team A's launch code is tulip"}
        assert _keys(a.search(("users",), query="launch code")) == {(ns, "secret")}
        assert b.get(ns, "secret") is None and _saved_texts(service, agent, "key-b") == []


def test_roles_and_pinned_keys(service: InProcessService, agent: str) -> None:
    """Read gets and searches; write puts new items; replacing or deleting forgets, which is the admin's. A key
    pinned to the store's agent does all of it; pinned to another agent, nothing (403)."""

    def key(role: str, pinned: str | None = None) -> str:
        with service.client() as admin:
            return admin.post("/v1/keys", json={"role": role, "agent_id": pinned}).json()["key"]

    ns = ("roles",)
    with MemoryServiceStore(service.url, api_key=key("admin", agent), agent_id=agent) as pinned_admin:
        pinned_admin.put(ns, "k", {"v": 1})
        pinned_admin.put(ns, "k", {"v": 2})
        assert pinned_admin.get(ns, "k").value == {"v": 2}
    with MemoryServiceStore(service.url, api_key=key("read"), agent_id=agent) as reader:
        assert reader.get(ns, "k").value == {"v": 2} and _keys(reader.search(ns)) == {(ns, "k")}
        with pytest.raises(Forbidden):
            reader.put(ns, "new", {"v": 1})
    with MemoryServiceStore(service.url, api_key=key("write"), agent_id=agent) as writer:
        writer.put(ns, "new", {"v": 1})
        with pytest.raises(Forbidden):
            writer.delete(ns, "new")
    with MemoryServiceStore(service.url, api_key=key("admin", "someone-else"), agent_id=agent) as stranger:
        for call in (lambda: stranger.get(ns, "k"), lambda: stranger.search(()), lambda: stranger.put(ns, "k", {})):
            with pytest.raises(Forbidden):
                call()
    with MemoryServiceStore(service.url, api_key="key-a", agent_id=agent) as admin:
        assert admin.get(ns, "k").value == {"v": 2} and admin.get(ns, "new").value == {"v": 1}


def test_bad_namespaces_are_refused_before_anything_is_sent(store: MemoryServiceStore) -> None:
    for namespace in [("a.b",), ("",), tuple(f"l{i}" for i in range(17))]:
        with pytest.raises(ValueError):
            store.batch([PutOp(namespace, "k", {"v": 1})])


# -- the Done-when: a real LangGraph graph, no LLM, two threads ---------------------------------------------------


class State(TypedDict, total=False):
    user: str
    note: str
    question: str
    found: list[str]
    exact: dict[str, Any] | None


def _remember(state: State, runtime: Runtime) -> State:
    """Deterministic: what the user said becomes a memory under their namespace."""
    assert runtime.store is not None
    runtime.store.put(("memories", state["user"]), "latest-note", {"note": state["note"]})
    return {}


def _recall(state: State, runtime: Runtime) -> State:
    assert runtime.store is not None
    hits = runtime.store.search(("memories", state["user"]), query=state["question"], limit=3)
    exact = runtime.store.get(("memories", state["user"]), "latest-note")
    return {"found": [hit.value["note"] for hit in hits], "exact": exact.value if exact else None}


async def _arecall(state: State, runtime: Runtime) -> State:
    assert runtime.store is not None
    hits = await runtime.store.asearch(("memories", state["user"]), query=state["question"], limit=3)
    exact = await runtime.store.aget(("memories", state["user"]), "latest-note")
    return {"found": [hit.value["note"] for hit in hits], "exact": exact.value if exact else None}


def _graph(store: BaseStore, recall: Any) -> Any:
    """remember when the state brings a note, else recall: one graph, a checkpointer per thread."""
    builder = StateGraph(State)
    builder.add_node("remember", _remember)
    builder.add_node("recall", recall)
    builder.add_conditional_edges(START, lambda state: "remember" if state.get("note") else "recall")
    builder.add_edge("remember", END)
    builder.add_edge("recall", END)
    return builder.compile(checkpointer=InMemorySaver(), store=store)


def test_a_langgraph_graph_writes_in_one_thread_and_finds_it_in_another(service: InProcessService, agent: str) -> None:
    # wait_s: each put waits for the facts, so the search below sees the extracted facts as well as the text
    with MemoryServiceStore(service.url, api_key="key-a", agent_id=agent, wait_s=30) as store:
        graph = _graph(store, _recall)
        note = "Alice's favourite pizza is margherita from Da Michele"
        graph.invoke({"user": "alice", "note": note}, {"configurable": {"thread_id": "thread-1"}})
        graph.invoke({"user": "bob", "note": "Bob likes sushi"}, {"configurable": {"thread_id": "thread-1"}})
        out = graph.invoke(
            {"user": "alice", "question": "which pizza does Alice like?"}, {"configurable": {"thread_id": "thread-2"}}
        )
        assert out["found"] == [note] and out["exact"] == {"note": note}
        other = graph.invoke({"user": "carol", "question": "pizza"}, {"configurable": {"thread_id": "thread-3"}})
        assert other["found"] == [] and other["exact"] is None
        assert graph.get_state({"configurable": {"thread_id": "thread-2"}}).values.get("note") is None


def test_the_same_graph_run_asynchronously(service: InProcessService, agent: str) -> None:
    async def run() -> dict[str, Any]:
        async with MemoryServiceStore(service.url, api_key="key-a", agent_id=agent) as store:
            graph = _graph(store, _arecall)
            await graph.ainvoke(
                {"user": "ann", "note": "Ann's dog is called Biscuit"}, {"configurable": {"thread_id": "w"}}
            )
            return await graph.ainvoke(
                {"user": "ann", "question": "what is the dog called"}, {"configurable": {"thread_id": "r"}}
            )

    out = asyncio.run(run())
    assert out["found"] == ["Ann's dog is called Biscuit"] and out["exact"] == {"note": "Ann's dog is called Biscuit"}


def test_the_docs_snippet_runs_unchanged(
    service: InProcessService, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (ROOT / "docs" / "langgraph.md").read_text()
    snippet = text.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.setenv("MEMORY_URL", service.url)
    monkeypatch.setenv("MEMORY_API_KEY", "key-a")
    exec(compile(snippet, "docs/langgraph.md", "exec"), {"__name__": "docs_langgraph"})
    assert capsys.readouterr().out.splitlines() == [
        "['Alice loves margherita pizza']",
        "{'note': 'Alice loves margherita pizza'}",
    ]


# -- the extra ---------------------------------------------------------------------------------------------------------


def test_without_langgraph_the_import_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "langgraph" or m.startswith("langgraph.")]:
        monkeypatch.setitem(sys.modules, name, None)  # an import of it now fails, as when it is not installed
    monkeypatch.delitem(sys.modules, "memory_service.integrations.langgraph")
    with pytest.raises(ImportError, match=r"pip install 'memory-service\[langgraph\]'"):
        importlib.import_module("memory_service.integrations.langgraph")


def test_langgraph_is_an_extra_and_dev_installs_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(dep.startswith("langgraph") for dep in project["dependencies"])
    assert any(dep.startswith("langgraph") for dep in project["optional-dependencies"]["langgraph"])
    assert "memory-service[langgraph]" in project["optional-dependencies"]["dev"]
