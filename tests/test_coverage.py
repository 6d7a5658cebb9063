"""What the model leaves out is put back in code: the speaker's first person, and uncovered statements.

Pure tests of `extraction/coverage.py` and the vague-fact rule, then one through a real service whose
fake llama-server leaves a sentence out, so the stored facts are checked as recall returns them.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from conftest import wait_status
from inprocess import InProcessService

from memory_service.extraction.coverage import asked_in, fill_in_gaps, in_third_person, speaker_of, to_listener
from memory_service.extraction.grounding import GroundedFact, ground
from tests.fakes.fake_llama_server import FakeLlamaServer


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLlamaServer]:
    with FakeLlamaServer("ok", n_ctx=2048, tokens_per_s=5000.0) as server:
        yield server


@pytest.fixture(scope="module")
def client(fake: FakeLlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    svc = InProcessService(tmp_path_factory.mktemp("coverage") / "data", fake.url).start()
    with svc.client("key-a") as c:
        yield c
    svc.stop()


LINE = (
    "[1:56 pm on 8 May, 2023] Caroline: Thanks, Melanie! This necklace is super special to me - a gift "
    "from my grandma in my home country, Sweden. I've worn it every day since I was young. Did you like it?"
)


def test_a_chat_header_names_the_speaker_but_a_label_does_not() -> None:
    speaker = speaker_of(LINE)
    assert speaker is not None and speaker.name == "Caroline"
    assert LINE[speaker.body_start :].startswith("Thanks, Melanie!")
    assert speaker_of("Jon Smith: I moved to Oslo.").name == "Jon Smith"  # type: ignore[union-attr]
    for text in (
        "Note: I restarted the job.",
        "Error: I could not reach the host.",
        "I moved to Oslo.",
        "Deploy failed at 10:30: disk full.",
        "caroline: lower case is not a name",
    ):
        assert speaker_of(text) is None, text


def test_first_person_becomes_the_speakers_name() -> None:
    said = in_third_person("I'm keen on counseling and I've told my mum; it means a lot to me and myself.", "Ana")
    assert said == "Ana is keen on counseling and Ana has told Ana's mum; it means a lot to Ana and Ana."
    assert in_third_person("Iceland is nice, I think.", "Ana") == "Iceland is nice, Ana think."
    assert in_third_person("The team shipped it.", "Ana") == "The team shipped it."


def test_uncovered_statements_become_facts_with_their_own_span() -> None:
    kept = ground(["Caroline has worn it every day since she was young."], LINE).kept
    result = fill_in_gaps(kept, LINE)
    texts = [f.text for f in result.facts]
    assert result.speaker == "Caroline" and result.added == 1
    assert texts[0] == "Caroline has worn it every day since she was young."
    added = result.facts[1]
    assert added.text == (
        "This necklace is super special to Caroline - a gift from Caroline's grandma in "
        "Caroline's home country, Sweden."
    )
    ((start, end),) = added.spans
    assert LINE[start:end] == (
        "This necklace is super special to me - a gift from my grandma in my home country, Sweden."
    )
    # the greeting, the question and the covered sentence added nothing; every added fact is grounded
    assert not any("Thanks" in t or t.endswith("?") for t in texts)
    assert len(ground([added.text], LINE).kept) == 1


def test_the_models_facts_are_rewritten_and_nothing_is_added_when_they_cover_the_text() -> None:
    text = "Jon: I lost my job as a banker, so I'm opening a dance studio."
    kept = [
        GroundedFact("I lost my job as a banker.", [(5, 30)]),
        GroundedFact("I'm opening a dance studio.", [(5, 62)]),
    ]
    result = fill_in_gaps(kept, text)
    assert [f.text for f in result.facts] == ["Jon lost Jon's job as a banker.", "Jon is opening a dance studio."]
    assert result.rewritten == 2 and result.added == 0
    assert [f.spans for f in result.facts] == [[(5, 30)], [(5, 62)]]


def test_a_fact_that_does_not_name_its_speaker_is_stored_as_the_line_shows_it() -> None:
    text = (
        "[10:37 am on 27 June, 2023] Melanie: We explored nature and went on a hike. The 2 younger kids "
        "love nature. (shared a photo: a painting of a sunset over a lake)"
    )
    kept = ground(["We explored nature and went on a hike."], text).kept
    result = fill_in_gaps(kept, text)
    # the model's fact in its own words, the sentences no fact covered: each names who said it
    assert [f.text for f in result.facts] == [
        "Melanie explored nature and went on a hike.",  # "we" is the speaker's side (issue 44)
        "Melanie: The 2 younger kids love nature.",
        "Melanie: (shared a photo: a painting of a sunset over a lake)",
    ]
    assert result.attributed == 2 and result.facts[0].spans == kept[0].spans
    # a fact that names the speaker, in any case or by part of the name, keeps its words
    named = fill_in_gaps([GroundedFact("jon smith moved to Oslo.", [(12, 28)])], "Jon Smith: I moved to Oslo.")
    assert [f.text for f in named.facts] == ["jon smith moved to Oslo."] and named.attributed == 0
    assert [
        f.text
        for f in fill_in_gaps([GroundedFact("Jon moved to Oslo.", [(12, 28)])], "Jon Smith: I moved to Oslo.").facts
    ] == ["Jon moved to Oslo."]
    # a text with no speaker has no one to name
    note = fill_in_gaps([], "Rotated the API keys for the billing service.")
    assert note.attributed == 0 and all(":" not in f.text for f in note.facts)


def test_a_text_without_a_speaker_keeps_its_words_and_small_talk_adds_nothing() -> None:
    note = "Rotated the API keys for the billing service. The old keys stop working on Friday."
    result = fill_in_gaps([GroundedFact("The API keys for the billing service were rotated.", [(0, 45)])], note)
    assert [f.text for f in result.facts][1:] == ["The old keys stop working on Friday."]
    assert result.speaker is None and result.rewritten == 0
    assert fill_in_gaps([], "Jon: Haha, thanks! Talk soon, bye!").facts == []
    assert fill_in_gaps([], "Jon: Sounds good.").facts == []


def test_a_short_statement_ending_on_a_bare_pronoun_is_rejected_as_vague() -> None:
    source = "Caroline: Yeah, I'm part of that! I love the pottery class I joined, and I am so proud of it."
    result = ground(
        [
            "Caroline is part of that!",
            "Caroline is so proud of it.",
            "Caroline loves the pottery class she joined and is proud of it.",
        ],
        source,
    )
    assert {r.text: r.code for r in result.rejected} == {
        "Caroline is part of that!": "vague",
        "Caroline is so proud of it.": "vague",
    }
    assert [f.text for f in result.kept] == ["Caroline loves the pottery class she joined and is proud of it."]


def test_a_sentence_the_model_left_out_is_stored_and_recalled(fake: FakeLlamaServer, client: httpx.Client) -> None:
    text = (
        "[2:10 pm on 3 July, 2023] Gina: I just launched an ad campaign for my clothing store. "
        "I also started taking dance classes again."
    )
    fake.set_mode("ok", facts=["Gina started taking dance classes again."])
    memory_id = client.post("/v1/remember", json={"text": text, "agent_id": "chat"}).json()["id"]
    body = wait_status(client, memory_id)
    assert body["status"] == "done"
    facts = [f["text"] for f in body["facts"]]
    assert "Gina just launched an ad campaign for Gina's clothing store." in facts
    assert body["extraction"]["completed"] == {
        "speaker": "Gina",
        "first_person_rewritten": 0,
        "sentences_added": 1,
        "answers_question_of": None,
        "speaker_named": 0,
        "added_facts": ["Gina just launched an ad campaign for Gina's clothing store."],
    }
    items = client.post("/v1/recall", json={"query": "ad campaign clothing store", "kinds": ["fact"], "k": 3}).json()
    assert items["items"][0]["text"] == "Gina just launched an ad campaign for Gina's clothing store."
    assert items["items"][0]["memory_id"] == memory_id


QUESTION = "[3:00 pm on 1 June, 2023] Caroline: Wow, that dress! How long have you and your husband been married?"
REPLY = "[3:02 pm on 1 June, 2023] Melanie: 5 years already! Time flies. Thanks, Caroline!"


def test_an_answer_keeps_the_question_it_answers_with_the_question_as_a_source() -> None:
    asked = asked_in("mem_q", QUESTION)
    assert asked is not None and QUESTION[asked.start : asked.end] == "How long have you and your husband been married?"
    assert asked.asker == "Caroline"
    result = fill_in_gaps([], REPLY, asked)
    assert result.answered
    [pair] = [f for f in result.facts if "asked" in f.text]
    assert (
        pair.text == "Melanie, asked how long have Melanie and Melanie's husband been married? said: 5 years already!"
    )
    assert [REPLY[s:e] for s, e in pair.spans] == ["5 years already!"]
    assert pair.context == [("mem_q", asked.start, asked.end)]
    assert to_listener("Did you see your sister? Are you ok?", "Jo") == "Did Jo see Jo's sister? Are Jo ok?"


def test_an_answer_reaches_past_thanks_to_the_sentence_that_names_something() -> None:
    asked = asked_in("mem_q", "[7:18 pm] Gina: Wow, Jon! How's the hunt for investors going?")
    reply = "[7:18 pm] Jon: Thanks, Gina! Searching for investors has been tough, but I'm staying hopeful. Anyway."
    [pair] = [f for f in fill_in_gaps([], reply, asked).facts if "asked" in f.text]
    assert pair.text == (
        "Jon, asked how's the hunt for investors going? said: Thanks, Gina! Searching for investors "
        "has been tough, but Jon is staying hopeful."
    )
    assert [reply[s:e] for s, e in pair.spans] == [
        "Thanks, Gina! Searching for investors has been tough, but I'm staying hopeful."
    ]
    # a reply that only thanks keeps what it says; one that thanks and asks back answers nothing
    assert fill_in_gaps([], "[7:18 pm] Jon: Yes! Thanks!", asked).answered
    assert not fill_in_gaps([], "[7:18 pm] Jon: Thanks! What about you?", asked).answered


def test_no_pair_without_a_question_a_known_answerer_or_another_speaker() -> None:
    assert asked_in("m", "Caroline: I went to the support group. It was great.") is None
    assert asked_in("m", "Caroline: Is it open? I think so.") is None  # the question is not where it ended
    asked = asked_in("mem_q", QUESTION)
    assert not fill_in_gaps([], "Caroline: I was asking myself too, actually.", asked).answered
    assert not fill_in_gaps([], "5 years already!", asked).answered  # who answered is not known
    assert not fill_in_gaps([], "Melanie: Why do you ask?", asked).answered


def test_a_reply_is_stored_with_its_question_as_a_source_and_recalled_by_the_questions_words(
    fake: FakeLlamaServer, client: httpx.Client
) -> None:
    fake.set_mode("ok", facts=[])
    run = {"agent_id": "chat", "run_id": "session-7"}
    question = client.post("/v1/remember", json={"text": QUESTION, **run}).json()["id"]
    reply = client.post("/v1/remember", json={"text": REPLY, **run}).json()["id"]
    body = wait_status(client, reply)
    assert body["extraction"]["completed"]["answers_question_of"] == question
    [pair] = [f for f in body["facts"] if "asked" in f["text"]]
    hits = client.post(
        "/v1/recall", json={"query": "How long has Melanie been married?", "kinds": ["fact"], "k": 3}
    ).json()["items"]
    assert hits[0]["fact_id"] == pair["id"]
    assert set(hits[0]["source_memory_ids"]) == {reply, question}
    # forgetting the question removes it as a source; the answer's own fact stays
    assert client.delete(f"/v1/memories/{question}").status_code == 204
    hits = client.post(
        "/v1/recall", json={"query": "How long has Melanie been married?", "kinds": ["fact"], "k": 3}
    ).json()["items"]
    assert hits[0]["fact_id"] == pair["id"] and hits[0]["source_memory_ids"] == [reply]
