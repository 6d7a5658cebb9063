"""Time questions: recall favours items dated in a window the question names, and dated items for "when".

The parsing is checked on notes, logs and chat questions alike; the ranking on real SQLite and Chroma with a
deterministic bag-of-words embedder (no weights), and through the API with the fake llama-server extracting
(its facts get their relative dates resolved by the real pipeline).
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import pytest
from conftest import wait_status

from memory_service.client import MemoryClient
from memory_service.pipeline.passages import index_passages
from memory_service.recall.floor import OFF
from memory_service.recall.search import RecallQuery, recall
from memory_service.recall.vectors import FilteredVectors
from memory_service.recall.when import MAX_EXPRESSIONS, MAX_ITEM_DATES, TimeQuestion, Window, item_dates
from memory_service.storage.journal import Journal
from memory_service.storage.vectors import VectorStore
from tests.fakes.fake_llama_server import FakeLlamaServer
from tests.word_embedder import WordEmbedder

TEAM = "team-time"
AS_OF = datetime(2024, 3, 10, 15, 0, tzinfo=UTC).timestamp()  # a Sunday


def epoch(day: str) -> float:
    return datetime.fromisoformat(day).replace(hour=12, tzinfo=UTC).timestamp()


def d(day: str) -> date:
    return date.fromisoformat(day)


@pytest.mark.parametrize(
    ("query", "window"),
    [
        ("what failed in the deploy on 2024-03-05?", Window((d("2024-03-05"), d("2024-03-05")))),
        ("Where did Joanna travel to in July 2022?", Window((d("2022-07-01"), d("2022-07-31")))),
        ("What movie did Joanna watch on 1 May, 2022?", Window((d("2022-05-01"), d("2022-05-01")))),
        ("which alerts fired on March 3rd, 2024", Window((d("2024-03-03"), d("2024-03-03")))),
        ("what did Sam say on 8 May", Window((d("2000-05-08"), d("2000-05-08")), yearless=True)),
        ("When did Melanie go camping in June?", Window((d("2000-06-01"), d("2000-06-30")), yearless=True)),
        ("what did we deploy last week", Window((d("2024-02-26"), d("2024-03-03")))),
        ("errors from 3 days ago", Window((d("2024-03-07"), d("2024-03-07")))),
        ("who was on call yesterday", Window((d("2024-03-09"), d("2024-03-09")))),
        ("tickets closed last month", Window((d("2024-02-01"), d("2024-02-29")))),
        ("incidents before June", Window((d("2022-05-31"), d("2023-05-31")))),  # June 2023: June 2024 is ahead
        ("Where was Tim in the week before 16 November 2023?", Window((d("2023-11-09"), d("2023-11-15")))),
        ("what changed since March 2023", Window((d("2023-03-01"), d("2024-03-01")))),
        ("what happened in 2021", Window((d("2021-01-01"), d("2021-12-31")))),
    ],
)
def test_a_question_names_the_days_it_means(query: str, window: Window) -> None:
    assert TimeQuestion.of(query, AS_OF).windows == (window,)


@pytest.mark.parametrize(
    "query",
    ["May I see the runbook?", "restart worker 2024 times", "the 8 mayors met", "version 2023-beta", "room 12 May"],
)
def test_words_that_only_look_like_dates_name_no_window(query: str) -> None:
    # "room 12 May" is a day and a month: read (a boost, never a filter, so a misread costs little)
    windows = TimeQuestion.of(query, AS_OF).windows
    assert windows == ((Window((d("2000-05-12"), d("2000-05-12")), yearless=True),) if "room" in query else ())


def test_when_is_asked_in_its_usual_forms_only() -> None:
    asks = [
        TimeQuestion.of(q).asks_when
        for q in ("When did the build break?", "what date is the launch", "how long ago was it")
    ]
    assert asks == [True, True, True]
    assert not TimeQuestion.of("What did Caroline paint?").asks_when


def test_parsing_is_bounded_and_never_fails() -> None:
    many = " and ".join(f"2023-01-{n:02d}" for n in range(1, 29))
    assert len(TimeQuestion.of(many, AS_OF).windows) == MAX_EXPRESSIONS
    assert TimeQuestion.of("the logs of 999 years ago", AS_OF).windows[0].span[0].year == 2024 - 100
    assert TimeQuestion.of("before 0002-01-01, 100 years ago", epoch("0050-06-01")).windows == ()
    spans, dated = item_dates("2024-01-01 " * 200 + "(2023)", epoch("2024-02-02"))
    assert len(spans) == MAX_ITEM_DATES + 1 and dated  # its own dates, then the day it happened


def test_an_item_is_dated_by_its_text_and_by_when_it_happened() -> None:
    spans, dated = item_dates("Caroline went to a support group yesterday (7 May 2023).", epoch("2023-05-08"))
    assert spans == [(d("2023-05-07"), d("2023-05-07")), (d("2023-05-08"), d("2023-05-08"))] and dated
    spans, dated = item_dates("The release slipped to the week of 1 May 2023; planned last year (2022).", None)
    assert spans == [(d("2023-05-01"), d("2023-05-07")), (d("2022-01-01"), d("2022-12-31"))] and dated
    assert item_dates("deploy failed again, rolled back", epoch("2024-03-05")) == ([(d("2024-03-05"),) * 2], False)
    spans, _ = item_dates("moved from Wednesday, September 30th, 2023 to Oct 2, 2023; v2 in May", None)
    assert spans == [(d("2023-09-30"), d("2023-09-30")), (d("2023-10-02"), d("2023-10-02"))]


class Stores:
    def __init__(self, root: Path) -> None:
        self.journal = Journal(root / "journal.sqlite3")
        self.vectors = VectorStore(root / "chroma")
        self.embedder = WordEmbedder()
        self.search = FilteredVectors(self.journal, self.vectors)

    def save(self, text: str, *, occurred: str | None = None, team: str = TEAM) -> str:
        memory, _ = self.journal.insert(
            team=team,
            agent_id="ops",
            text=text,
            run_id=None,
            tags=[],
            metadata={},
            idempotency_key=None,
            budget_s=60.0,
            now=epoch("2024-03-09"),
            occurred_at=epoch(occurred) if occurred else None,
        )
        index_passages([memory], self.embedder, self.vectors)
        self.journal.mark_indexed([memory.id])
        return memory.id

    def top(self, query: str, *, team: str = TEAM, **kw) -> list[str]:
        hits = recall(
            RecallQuery(team=team, query=query, k=3, kinds=("passage",), as_of=AS_OF, **kw),
            journal=self.journal,
            embedder=self.embedder,
            search=self.search,
            floor=OFF,  # time ranking, every hit however weak (the floor: test_relevance_floor)
        ).hits
        return [h.memory_id for h in hits]


@pytest.fixture
def stores(tmp_path) -> Stores:
    s = Stores(tmp_path)
    yield s
    s.journal.close()


def test_a_log_line_of_the_day_asked_about_ranks_first(stores: Stores) -> None:
    # the asked-about day's line says least about the deploy: by words alone it comes last
    other = [
        stores.save(f"deploy of billing failed: migration timeout on db-{n}", occurred=f"2024-03-0{n}") for n in (1, 2)
    ]
    asked = stores.save("deploy failed", occurred="2024-03-05")
    assert stores.top("why did the deploy of billing fail")[-1] == asked  # no date asked: by words
    assert stores.top("why did the deploy of billing fail on 2024-03-05")[0] == asked
    assert stores.top("why did the deploy of billing fail on 2 March")[0] == other[1]


def test_a_relative_date_counts_from_the_questions_as_of(stores: Stores) -> None:
    old = stores.save("standup notes: the search cluster was resized to six nodes", occurred="2024-01-15")
    recent = stores.save("standup notes: the search cluster was resized to six nodes again", occurred="2024-02-28")
    assert stores.top("when was the search cluster resized to six nodes")[0] == old
    assert stores.top("was the search cluster resized to six nodes last week")[0] == recent


def test_a_date_written_in_a_note_counts_without_occurred_at(stores: Stores) -> None:
    stores.save("vendor call: the renewal price for the storage contract goes up by ten percent")
    dated = stores.save("2023-11-20 vendor call: storage renewal price")
    assert stores.top("storage contract renewal price in November")[0] == dated


def test_another_teams_dates_do_not_move_a_teams_answer(stores: Stores) -> None:
    first = stores.save("deploy of billing failed: migration timeout", occurred="2024-03-01")
    second = stores.save("deploy failed", occurred="2024-03-02")
    before = stores.top("why did the deploy of billing fail on 2024-03-05")
    for n in range(5):
        stores.save(f"deploy of billing failed {n}", occurred="2024-03-05", team="team-other")
    assert stores.top("why did the deploy of billing fail on 2024-03-05") == before == [first, second]


def test_a_when_question_favours_the_item_that_carries_a_date(stores: Stores) -> None:
    undated = stores.save("Caroline went to the support group and talked")
    dated = stores.save("Caroline went to the support group and talked a lot (7 May 2023)")
    assert stores.top("Did Caroline go to the support group?")[0] == undated
    assert stores.top("When did Caroline go to the support group?")[0] == dated


def test_the_api_counts_yesterday_from_as_of(inprocess_service) -> None:
    """Through the route: `as_of` reaches recall, and the pipeline resolves the fact's own "yesterday"."""
    said = {"2023-05-01": "Caroline went to the support group.", "2023-05-08": "Caroline went to a support group."}
    with FakeLlamaServer("ok", tokens_per_s=50_000) as fake:
        svc = inprocess_service(fake.url, env={"MEMORY_EXTRACT_CONTEXT_SAVES": "0"})
        with svc.client("key-a") as client:
            ids = {}
            for day, text in said.items():
                body = {"text": text, "agent_id": "chat", "occurred_at": f"{day}T13:00:00+00:00"}
                ids[day] = client.post("/v1/remember", json=body).json()["id"]
                assert wait_status(client, ids[day], timeout=30)["status"] == "done"
            ask = {"query": "Where did Caroline go yesterday?", "k": 2, "kinds": ["passage"]}
            for asked, day in (("2023-05-02T09:00:00Z", "2023-05-01"), ("2023-05-09T09:00:00Z", "2023-05-08")):
                items = client.post("/v1/recall", json={**ask, "as_of": asked}).json()["items"]
                assert items[0]["memory_id"] == ids[day], (asked, items)
                with MemoryClient(svc.url, api_key="key-a") as ours:  # the Python client passes it on too
                    found = ours.recall(ask["query"], k=2, kinds=["passage"], as_of=asked)
                assert found.items[0].memory_id == ids[day], (asked, found.items)
            bad = client.post("/v1/recall", json={**ask, "as_of": "yesterday"})
            assert bad.status_code == 422, bad.text
            saved = client.post(
                "/v1/remember",
                json={
                    "text": "Caroline went to the support group yesterday.",
                    "agent_id": "chat",
                    "occurred_at": "2023-05-08T13:00:00Z",
                },
            )
            facts = wait_status(client, saved.json()["id"], timeout=30)["facts"]
            assert [f["text"] for f in facts] == ["Caroline went to the support group yesterday (7 May 2023)."]
