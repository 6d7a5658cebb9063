"""The relevance floor: recall stops filling k with items that do not bear on the question.

A real service in this process (real stores, the real embedder; the fake llama-server extracts each text's
sentences as facts): an unrelated question gets fewer than k items and a note, a related one still gets
its hit first, a caller's min_score replaces the floor (-1: nothing cut), and the MCP recall tool says that
nothing in memory is close. Keyword-only hits (texts not embedded yet) are judged by the query's words.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from conftest import eventually, wait_status
from inprocess import InProcessService
from mcp import Client

from memory_service.client import AsyncMemoryClient
from memory_service.config import Settings
from memory_service.mcp_server.server import build_server, probe
from memory_service.mcp_server.tools import Toolbox
from memory_service.recall.floor import DEFAULT_FLOOR
from tests.fakes.fake_llama_server import FakeLlamaServer

PASSWORD = "The staging database password rotates every 90 days, on the first Monday of the quarter."
HOME = [
    "Grandma's apple pie needs two cups of flour and a pinch of cinnamon.",
    "The tomatoes in the back garden need watering every evening in July.",
    "Our flight to Lisbon leaves at 7:40 on Saturday from gate B12.",
    "Max the dog goes to the vet for his vaccinations next Thursday.",
    "The book club is reading a novel about a lighthouse keeper this month.",
    "Sofia started piano lessons and practises scales after school.",
    "The kitchen tap drips; the plumber comes on Wednesday morning.",
    "We painted the spare bedroom a pale green last weekend.",
    "The swimming pool opens at six on weekdays and at eight on Sundays.",
    "Aunt Rosa's birthday dinner is at the Italian place on Elm Street.",
    "The bakery on the corner sells sourdough only on Fridays.",
    "My running shoes are worn out after the half marathon.",
]
# a long note with an id in passing: the query "QX-5531 owner" is only 0.23 similar to it, but holds its id
NOTES = (
    "Weekly notes: the cafeteria menu changes on Monday, the parking garage closes for cleaning on Thursday, "
    "the summer party is planned for late June with a barbecue and live music, new chairs arrive for the "
    "third floor, the library gets two more shelves of novels, and ticket QX-5531 was reassigned to Lena. "
    "Remember to water the plants in the lobby and to bring a dish for the potluck lunch on Friday."
)
UNRELATED = "What is the CPU quota of the Kubernetes namespace for the payments service?"
RELATED = "when does the staging db password rotate?"
K = 10


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessService]:
    """Team a's 14 texts, extracted and embedded: more than k, so the old recall answered k of them."""
    with FakeLlamaServer("ok", tokens_per_s=20_000) as fake:
        svc = InProcessService(tmp_path_factory.mktemp("floor") / "data", fake.url).start()
        try:
            with svc.client() as client:
                ids = [
                    client.post("/v1/remember", json={"text": text, "agent_id": "home"}).json()["id"]
                    for text in [*HOME, PASSWORD, NOTES]
                ]
                for memory_id in ids:
                    assert wait_status(client, memory_id, timeout=60)["status"] == "done"

                def embedded() -> bool:  # every text's passage has its vector: each hit has a similarity
                    body = {"query": "notes", "k": 50, "kinds": ["passage"], "min_score": -1}
                    items = client.post("/v1/recall", json=body).json()["items"]
                    return len(items) == len(ids) and all(i["similarity"] is not None for i in items)

                eventually("passages embedded", embedded, timeout=60)
            yield svc
        finally:
            svc.stop()


def recall(svc: InProcessService, query: str, **body: Any) -> dict[str, Any]:
    with svc.client() as client:
        response = client.post("/v1/recall", json={"query": query, "k": K, **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_an_unrelated_question_gets_fewer_than_k_items_and_a_note(service):
    answer = recall(service, UNRELATED)
    assert len(answer["items"]) < 3, [(i["text"], i["similarity"]) for i in answer["items"]]
    assert all(i["similarity"] >= DEFAULT_FLOOR for i in answer["items"] if i["similarity"] is not None)
    note = answer["note"]
    assert note is not None and "relevance floor" in note and "min_score=-1" in note, note
    if not answer["items"]:
        assert note.startswith("nothing above the relevance floor")
    assert answer["context"].count("\n") + 1 == len(answer["items"]) or not answer["items"]


def test_a_related_question_still_gets_its_hit_first_without_the_noise(service):
    answer = recall(service, RELATED)
    texts = [i["text"] for i in answer["items"]]
    assert texts and "password rotates every 90 days" in texts[0], texts
    assert len(texts) < K, texts  # the home notes are not padded in
    assert answer["note"] and "weaker hit(s) below the relevance floor" in answer["note"]


def test_a_text_holding_the_querys_id_stays_whatever_its_cosine(service):
    answer = recall(service, "QX-5531 owner", kinds=["passage"])
    texts = [i["text"] for i in answer["items"]]
    assert texts and texts[0] == NOTES and len(texts) < K, texts
    assert answer["items"][0]["similarity"] < DEFAULT_FLOOR  # by its cosine alone it would have been left out


def test_min_score_replaces_the_floor_and_minus_one_cuts_nothing(service):
    everything = recall(service, UNRELATED, min_score=-1)
    assert len(everything["items"]) == K and everything["note"] is None
    own = recall(service, RELATED, min_score=0.5)  # the caller's own cut: no note, their threshold
    assert own["note"] is None and own["items"]
    assert all(i["similarity"] >= 0.5 for i in own["items"])
    low = recall(service, UNRELATED, min_score=0.0)  # below the floor: more than the default shows
    assert len(low["items"]) > len(recall(service, UNRELATED)["items"]) and low["note"] is None


def test_the_floor_is_the_documented_setting():
    assert Settings().recall_floor == DEFAULT_FLOOR


def test_the_mcp_recall_tool_says_nothing_in_memory_is_close(service):
    async def ask() -> str:
        async with AsyncMemoryClient(service.url, api_key="key-a") as memory:
            found = await probe(memory, service.url)
            toolbox = Toolbox(memory, url=service.url, agent_id="floor-tester")
            async with Client(build_server(toolbox, found)) as client:  # type: ignore[arg-type]
                result = await client.call_tool("recall", {"query": UNRELATED})
        return "\n".join(getattr(part, "text", "") for part in result.content)

    text = anyio.run(ask)
    assert "result(s) for" not in text, text  # not k lines of noise
    assert "Nothing in memory is close to" in text and "14 saved text(s)" in text, text


def test_keyword_only_hits_are_judged_by_the_query_words(inprocess):
    """No worker runs here: nothing is embedded, every hit is the keyword leg's (no similarity)."""
    with inprocess.client() as client:
        for text in ("Rollback of INC-4521 was done by the night shift.", "The night shift ends at six on Fridays."):
            assert client.post("/v1/remember", json={"text": text, "agent_id": "ops"}).status_code == 202
        found = client.post("/v1/recall", json={"query": "INC-4521 rollback"}).json()
        assert [i["text"] for i in found["items"]] == ["Rollback of INC-4521 was done by the night shift."]
        weak = {"query": "shift handover checklist for the payroll export", "k": 5}
        assert client.post("/v1/recall", json=weak).json()["items"] == []  # "shift" alone: too small a share
        every = client.post("/v1/recall", json={**weak, "min_score": -1}).json()
        assert len(every["items"]) == 2 and every["note"] is None  # -1: nothing cut, keyword-only hits too
