"""Budgeted recall and the reader's answers in `memory-service eval` (issue 33, items 1 and 2).

The metric code on cases whose answer is known by hand, then the LoCoMo eval end to end against the service
in this process, the fake llama-server (real HTTP) as its extraction model and tokenizer, a second one as the
reader and a third as the judge: the JSON's shape, budgeted recall monotone in B and never above the recall of
every item, and the reader's prompt within its budget by the same tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memory_service.evals import budget, reader
from memory_service.evals.options import eval_parser
from tests.fakes.fake_llama_server import FakeLlamaServer, count_tokens


def test_f1_is_one_for_the_gold_answer_and_zero_for_a_disjoint_one() -> None:
    assert reader.token_f1("Rex", "Rex") == 1.0
    assert reader.token_f1("The dog, Rex!", "rex dog") == 1.0  # case, punctuation, articles and commas aside
    assert reader.token_f1("a cat named Tom", "Rex") == 0.0
    assert reader.token_f1("", "Rex") == 0.0
    assert reader.token_f1("Rex the dog", "Rex") == pytest.approx(2 * 0.5 * 1.0 / 1.5)
    # multi-hop: each gold part by its best answer part, averaged; open-domain: the gold before ";"
    assert reader.answer_f1("violin, piano", "piano, violin", 1) == 1.0
    assert reader.answer_f1("violin", "piano, violin", 1) == 0.5
    assert reader.answer_f1("Boston", "Boston; or nearby", 3) == 1.0


def test_lines_fit_in_rank_order_and_one_too_long_is_skipped() -> None:
    """The raw-turn baseline is cut by recall's own rule: a line that would pass B is skipped, a later
    shorter one still tried."""
    assert budget.fits([10, 10, 10], 21) == [0, 1]  # 10 + 1 + 10: the newline between them counts
    assert budget.fits([10, 10, 10], 20) == [0]
    assert budget.fits([30, 1, 1], 20) == [1, 2]  # the 30 does not fit; the two short lines after it do
    assert budget.fits([], 256) == []
    costs = [7, 40, 3, 12, 90, 5]
    assert [len(budget.fits(costs, b)) for b in (8, 50, 100, 300)] == [1, 2, 5, 6]


_TOPICS = ["gardening", "the weather", "a football match", "cooking pasta", "a road trip", "an old film"]


def _locomo_sample() -> list[dict]:
    """One conversation of 24 long turns over two sessions, so 256 tokens hold only a few of them."""
    turns = []
    for n in range(1, 25):
        speaker = "Ann" if n % 2 else "Bob"
        topic = _TOPICS[n % len(_TOPICS)]
        text = f"Talking about {topic} again, I spent the whole afternoon on it with {n} friends and it went well."
        turns.append({"speaker": speaker, "dia_id": f"D{1 + n // 13}:{n}", "text": text})
    turns[2]["text"] = "I adopted a dog named Rex last week."
    turns[5]["text"] = "I started learning the violin in March."
    turns[14]["text"] = "I moved to Denver for a job at an airline."
    conversation = {
        "speaker_a": "Ann",
        "speaker_b": "Bob",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [t for t in turns if t["dia_id"].startswith("D1:")],
        "session_2_date_time": "10:00 am on 9 June, 2023",
        "session_2": [t for t in turns if t["dia_id"].startswith("D2:")],
    }
    qa = [
        {"question": "What is the name of Ann's dog?", "answer": "Rex", "evidence": ["D1:3"], "category": 4},
        {"question": "What does Bob learn?", "answer": "the violin", "evidence": ["D1:6"], "category": 4},
        {
            "question": "Where did Ann move, and what did Bob learn?",
            "answer": "Denver, violin",
            "evidence": ["D2:15", "D1:6"],
            "category": 1,
        },
        {
            "question": "What did they talk about?",
            "answer": "gardening",
            "evidence": ["D1:1", "D1:7", "D2:13"],
            "category": 3,
        },
    ]
    return [{"sample_id": "syn-1", "conversation": conversation, "qa": qa}]


def test_locomo_eval_reports_budgeted_recall_and_reader_answers(inprocess_service, tmp_path: Path) -> None:
    from memory_service.evals.cli import run_eval

    data = tmp_path / "tiny_locomo.json"
    data.write_text(json.dumps(_locomo_sample()))
    out = tmp_path / "out"
    with (
        FakeLlamaServer("ok", tokens_per_s=50_000) as model,
        FakeLlamaServer("ok", tokens_per_s=50_000) as read,
        FakeLlamaServer("ok", tokens_per_s=50_000) as judge,
    ):
        read.set_mode("ok", content="Rex")
        judge.set_mode("ok", content="CORRECT")
        svc = inprocess_service(model.url)
        argv = ["--data", str(data), "--out", str(out), "--url", svc.url, "--api-key", "key-a"]
        argv += ["--reader-url", read.url, "--judge-url", judge.url, "--reader-limit", "3", "--reader-budget", "256"]
        assert run_eval(eval_parser().parse_args(argv)) == 0
        prompts = [r["messages"][-1]["content"] for r in read.recorded()]
        judged = judge.recorded()
        urls = {"model": model.url, "reader": read.url, "judge": judge.url}
    result = json.loads((out / "locomo-tiny_locomo.json").read_text())
    assert (out / "locomo-tiny_locomo.png").stat().st_size > 0
    assert result["budget"]["tokenizer"] == f"{urls['model']}/tokenize" and result["budget"]["note"] is None
    for mode in ("default", "facts", "passages", "embedding_baseline"):
        overall = result["results"][mode]["overall"]
        figures = [overall[f"recall@{b}tok"] for b in (256, 512, 1024)] + [overall["recall@all"]]
        assert figures == sorted(figures), (mode, figures)
        assert overall["tokens_per_item"] > 0
        assert set(result["results"][mode]["per_category"]["4-single-hop"]) >= {"recall@512tok", "items@512tok"}
    passages = result["results"]["passages"]["overall"]
    assert passages["items@256tok"] < passages["items@1024tok"]  # the budget binds on these long turns
    assert passages["recall@all"] == 1.0  # every turn is among 100 items
    # the reader: three questions a mode, answered from at most 256 tokens of context, scored and judged
    answers = result["answers"]
    assert set(answers) == {"default", "passages", "embedding_baseline"}
    for mode in answers:
        assert answers[mode]["overall"]["n"] == 3 and answers[mode]["overall"]["J"] == 1.0
        first = answers[mode]["samples"][0]
        assert first["answer"] == "Rex" and first["gold"] == "Rex" and first["scores"]["f1"] == 1.0
    assert answers["default"]["samples"][1]["scores"]["f1"] == 0.0  # "Rex" for "the violin"
    assert len(prompts) == 9 and len(judged) == 9
    contexts = [p.split("Memories:\n", 1)[1].split("\n\nQuestion:", 1)[0] for p in prompts]
    assert all(0 < count_tokens(c) <= 256 for c in contexts)
    assert any(c.startswith("[2023-05-08 ") for c in contexts)  # dated lines, as recall's context has them
    assert urls["reader"] in result["budget"]["reader"] and urls["judge"] in result["budget"]["judge"]
    assert json.loads((out / "summary.json").read_text())["locomo-tiny_locomo"]["reader_f1"]["default"] is not None
