"""Smoke tests for the eval harness and benchmark helpers: metric code on hand-made data, and the
LoCoMo runner end to end (its own service, real tiny-model llama-server, real HTTP) on a tiny file.

The metrics decide what the eval reports, so they are checked on cases whose answer is known by hand.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import pytest

from memory_service.bench import consolidation, limits, transfer, transfer_data
from memory_service.evals import personaext as persona
from memory_service.testbed import locomo_data, locomo_metrics, results
from memory_service.testbed.stats import goal, percentile


def test_evidence_ids_are_normalised_split_and_checked() -> None:
    valid = {"D8:6", "D9:17", "D30:5", "D11:26", "D1:3"}
    assert locomo_data.normalize_evidence(["D8:6; D9:17"], valid) == ["D8:6", "D9:17"]
    assert locomo_data.normalize_evidence(["D30:05"], valid) == ["D30:5"]
    assert locomo_data.normalize_evidence(["D:11:26"], valid) == ["D11:26"]
    assert locomo_data.normalize_evidence(["D", "D99:1", "D1:3", "D1:03"], valid) == [
        "D1:3"
    ]  # unknown dropped, deduped
    assert locomo_data.normalize_evidence(["D2:4"]) == ["D2:4"]  # no valid set: keep


def test_ranked_turns_follow_fact_provenance() -> None:
    items = [
        {"kind": "fact", "memory_id": "m2", "source_memory_ids": ["m2", "m5"]},
        {"kind": "passage", "memory_id": "m2", "source_memory_ids": ["m2"]},
        {"kind": "passage", "memory_id": "m9", "source_memory_ids": ["m9"]},  # not ours: ignored
        {"kind": "passage", "memory_id": "m1"},
    ]
    mapping = {"m1": "D1:1", "m2": "D1:2", "m5": "D2:1"}
    ranked = locomo_metrics.ranked_dia_ids(items, mapping)
    assert ranked == ["D1:2", "D2:1", "D1:1"]
    gold = ["D2:1", "D1:1"]
    assert locomo_metrics.recall_at(ranked, gold, 1) == 0.0
    assert locomo_metrics.recall_at(ranked, gold, 2) == 0.5
    assert locomo_metrics.recall_at(ranked, gold, 10) == 1.0
    assert locomo_metrics.hit_at(ranked, gold, 1) == 0.0 and locomo_metrics.hit_at(ranked, gold, 2) == 1.0
    assert locomo_metrics.reciprocal_rank(ranked, gold) == 0.5
    assert locomo_metrics.reciprocal_rank([], gold) == 0.0


def test_aggregate_means_per_category() -> None:
    rows = [
        {"category": 1, "scores": locomo_metrics.score_question(["D1:1"], ["D1:1"])},
        {"category": 1, "scores": locomo_metrics.score_question(["D1:2"], ["D1:1"])},
        {"category": 4, "scores": locomo_metrics.score_question(["D1:2", "D1:1"], ["D1:1", "D3:3"])},
    ]
    agg = locomo_metrics.aggregate(rows)
    assert agg["overall"]["n"] == 3
    assert agg["per_category"]["1-multi-hop"]["recall@1"] == 0.5
    assert agg["per_category"]["4-single-hop"]["recall@5"] == 0.5
    assert agg["per_category"]["4-single-hop"]["mrr"] == 0.5
    assert agg["overall"]["hit@10"] == pytest.approx(2 / 3, abs=1e-4)


def test_turn_text_carries_date_speaker_and_photo() -> None:
    turn = locomo_data.Turn("D1:1", 1, "1:56 pm on 8 May, 2023", "Caroline", "Look!", caption="a dog on a beach")
    assert locomo_data.turn_text(turn) == "[1:56 pm on 8 May, 2023] Caroline: Look! (shared a photo: a dog on a beach)"


def test_personaext_matching_and_summary() -> None:
    assert (
        persona.detokenize(["hello", ",", "i", "like", "wine", "and", "coffee", "."])
        == "hello, i like wine and coffee."
    )
    assert persona.phrase_in("coffee", "The speaker likes wine and Coffee.")
    assert not persona.phrase_in("tea", "The speaker likes steak.")  # whole words only
    assert persona.phrase_in_lenient("teas", "The speaker likes big fancy tea.")
    assert not persona.phrase_in("teas", "The speaker likes big fancy tea.")
    rows = [
        {
            "text": "i like tea",
            "label": "like_drink",
            "tail": "tea",
            "status": "done",
            "facts": ["Likes tea."],
            "rejected": [],
            "reject_reasons": [],
            "proposed": 2,
            "stored": 1,
            "merged": 0,
            "predicted_n": 20,
            "wall_s": 1.0,
            "tail_in_facts": True,
            "tail_in_facts_lenient": True,
            "tail_in_proposed": True,
        },
        {
            "text": "i ski",
            "label": "like_activity",
            "tail": "ski",
            "status": "done",
            "facts": [],
            "rejected": ["Skis a lot."],
            "reject_reasons": ["ungrounded: x"],
            "proposed": 1,
            "stored": 0,
            "merged": 0,
            "predicted_n": 10,
            "wall_s": 2.0,
            "tail_in_facts": False,
            "tail_in_facts_lenient": False,
            "tail_in_proposed": False,
        },
    ]
    metrics = persona.summarize(rows)["metrics"]
    assert metrics["tail_found_in_stored_facts"] == 0.5
    assert metrics["stored_over_proposed"] == pytest.approx(1 / 3, abs=1e-4)
    assert metrics["facts_per_utterance_mean"] == 0.5
    assert metrics["reject_reasons"] == {"ungrounded": 1}
    assert metrics["no_gold_utterances"] == 0


def test_percentile_and_goal_verdicts() -> None:
    data = [float(x) for x in range(1, 101)]
    assert percentile(data, 50) == 50.0 and percentile(data, 99) == 99.0 and percentile(data, 100) == 100.0
    assert percentile([], 50) is None
    assert goal(4.0, 5.0)["met"] is True and goal(6.0, 5.0)["met"] is False
    assert goal(0.8, 0.7, at_most=False)["met"] is True and goal(None, 1.0)["met"] is None


def test_plots_are_skipped_with_one_log_line_without_matplotlib(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """matplotlib is an optional extra: without it the results are written and the plots skipped, said once."""
    drawn: list[Path] = []
    results.plots_available.cache_clear()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    try:
        with caplog.at_level(logging.WARNING, logger=results.__name__):
            for name in ("one.png", "two.png", "three.png"):
                assert results.save_plot(lambda result, path: drawn.append(path), {}, tmp_path / name) is False
    finally:
        results.plots_available.cache_clear()  # the next caller sees the real matplotlib again
    assert drawn == [] and list(tmp_path.iterdir()) == []
    lines = [r.getMessage() for r in caplog.records if r.name == results.__name__]
    assert len(lines) == 1, lines
    assert "matplotlib is not installed" in lines[0] and "memory-service[bench]" in lines[0]


def test_plots_are_drawn_when_matplotlib_is_there(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # the dev extra installs it; this checks the path that draws
    results.plots_available.cache_clear()
    result = persona.summarize(
        [
            {
                "text": "i like tea",
                "label": "like_drink",
                "tail": "tea",
                "status": "done",
                "facts": ["Likes tea."],
                "rejected": [],
                "reject_reasons": [],
                "proposed": 1,
                "stored": 1,
                "merged": 0,
                "predicted_n": 9,
                "wall_s": 1.0,
                "tail_in_facts": True,
                "tail_in_facts_lenient": True,
                "tail_in_proposed": True,
            },
        ]
    )
    assert results.save_plot(persona.plot, result, tmp_path / "sub" / "personaext.png") is True
    assert (tmp_path / "sub" / "personaext.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_limits_client_fails_sniffio_imports_fast_only_when_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Importing the limits benchmark leaves sniffio alone; its main() blocks a missing one for httpcore."""
    monkeypatch.setitem(sys.modules, "sniffio", sys.modules.get("sniffio"))  # restored after the test
    monkeypatch.delitem(sys.modules, "sniffio")
    real_find_spec = limits.importlib.util.find_spec
    monkeypatch.setattr(
        limits.importlib.util,
        "find_spec",
        lambda name, package=None: None if name == "sniffio" else real_find_spec(name, package),
    )
    limits._fail_fast_without_sniffio()
    assert "sniffio" in sys.modules and sys.modules["sniffio"] is None
    with pytest.raises(ImportError):
        import sniffio  # noqa: F401


@pytest.mark.process  # the benchmark starts its own serve
def test_transfer_benchmark_quick_mode(tmp_path: Path) -> None:
    """List, export and forget on 500 imported memories, end to end: each section measured, nothing forgotten back."""
    shares = {
        agent: sum(transfer_data.agent_of(i) == agent for i in range(1000))
        for agent in (transfer_data.BULK_AGENT, transfer_data.RARE_AGENT)
    }
    assert shares == {transfer_data.BULK_AGENT: 300, transfer_data.RARE_AGENT: 20}
    result = transfer.run(quick=True, workdir=tmp_path)
    assert result["forgotten_never_returned"] is True and result["failed_checks"] == []
    assert result["memories"] == 500 and 500 <= result["facts"] <= 1500 and result["import"]["failed"] == 0
    assert result["list"]["limit_100"]["pages"] == 5 and result["list"]["limit_500"]["items"] == 500
    assert result["list_filtered"]["limit_100"]["items"] == 10
    assert result["export"]["lines"] == 500 and result["baseline_same_run"]["sqlite_direct_export"]["lines"] == 500
    assert result["forget_one"]["n"] == 20 and result["forget_bulk"]["deleted"] == 150
    after = result["after_forget"]
    assert after["forgotten"] == 170 and after["list_count"] == after["export_count"] == 330
    assert after["recall_control_found"] > 0  # recall works at all, so finding no forgotten id means something
    results.save_plot(transfer.plot, result, tmp_path / "transfer.png")


def test_consolidation_benchmark_seed_gives_every_subject_a_group_due() -> None:
    """The seed must keep consolidation busy: one group per subject, each fact grounded in its memory's text."""
    from memory_service.consolidation.groups import group_facts
    from memory_service.storage.consolidation import SourceFact

    lines = consolidation.records(1_700_000_000.0)
    facts = []
    for line in lines:
        for fact in line["facts"]:
            ((start, end),) = fact["spans"]
            assert line["text"][start:end] == fact["text"]
            facts.append(
                SourceFact(
                    id=fact["id"],
                    agent_id=line["agent_id"],
                    text=fact["text"],
                    tags=[],
                    created_at=fact["created_at"],
                    memory_ids=[line["id"]],
                )
            )
    groups = group_facts("t", facts)
    assert sorted(g.subject for g in groups) == sorted(consolidation.SUBJECTS)
    assert all(len(g.facts) == consolidation.FACTS_PER_SUBJECT for g in groups)


SYNTHETIC = [
    {
        "sample_id": "syn-1",
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Bob",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a dog named Rex last week."},
                {"speaker": "Bob", "dia_id": "D1:2", "text": "I started learning the violin in March."},
                {"speaker": "Ann", "dia_id": "D1:3", "text": "I work as a nurse at Mercy Hospital in Boston."},
            ],
            "session_2_date_time": "10:00 am on 9 June, 2023",
            "session_2": [
                {
                    "speaker": "Bob",
                    "dia_id": "D2:1",
                    "text": "I moved to Denver for a job at an airline.",
                    "blip_caption": "a photo of mountains",
                },
            ],
        },
        "qa": [
            {"question": "What is the name of Ann's dog?", "answer": "Rex", "evidence": ["D1:1"], "category": 4},
            {"question": "Where does Ann work?", "answer": "Mercy Hospital", "evidence": ["D1:03"], "category": 4},
            {"question": "When did Bob move?", "answer": "June 2023", "evidence": ["D2:1; D1:2"], "category": 2},
            {"question": "adversarial", "adversarial_answer": "x", "evidence": ["D1:1"], "category": 5},
            {"question": "broken evidence", "answer": "x", "evidence": ["D9:9"], "category": 1},
        ],
    }
]


def test_locomo_runner_end_to_end_on_tiny_model(tiny_llama, tmp_path: Path) -> None:
    from memory_service.evals.cli import run_eval

    data = tmp_path / "tiny_locomo.json"
    data.write_text(json.dumps(SYNTHETIC))
    out = tmp_path / "out"
    args = argparse.Namespace(
        data=[str(data)], out=str(out), url=None, api_key=None, limit=None, model="tiny", llm_url=tiny_llama.url
    )
    assert run_eval(args) == 0
    result = json.loads((out / "locomo-tiny_locomo.json").read_text())
    assert (out / "locomo-tiny_locomo.png").stat().st_size > 0
    assert result["questions"] == 3 and result["turns"] == 4
    conv = result["conversations"][0]
    assert conv["skipped_questions"] == {"adversarial": 1, "no_valid_evidence": 1}
    assert conv["extraction"]["memories"] == 4
    assert sum(conv["extraction"]["status"].values()) == 4
    # the cost: llama.cpp's own seconds per save, and no idle-time figure when consolidation is off
    assert conv["extraction"]["model_s_per_save_mean"] > 0 and conv["extraction"]["model_s_total"] > 0
    assert result["timing_s"]["consolidation_wait_at_idle"] is None
    assert set(result["results"]) == {"passages", "facts", "default", "embedding_baseline"}
    # 4 turns and k=20: raw-turn recall must find every evidence turn; the default includes the passages
    assert result["results"]["passages"]["overall"]["recall@20"] == 1.0
    assert result["results"]["default"]["overall"]["recall@20"] == 1.0
    assert result["model"] and "timing_s" in result and result["settings"]["isolation"] == "team"


def test_scrape_reads_gauges_and_histograms_of_a_metrics_page() -> None:
    from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

    from memory_service.testbed.probes import scrape

    registry = CollectorRegistry()
    Gauge("memory_vector_indexes_ready", "ready", registry=registry).set(2)
    ack = Histogram("memory_remember_ack_seconds", "ack", buckets=(0.005, 0.01), registry=registry)
    for seconds in (0.001, 0.002, 0.007, 0.5):
        ack.observe(seconds)
    samples = scrape(generate_latest(registry).decode())
    assert samples["memory_vector_indexes_ready"] == [({}, 2.0)]
    buckets = {labels["le"]: value for labels, value in samples["memory_remember_ack_seconds_bucket"]}
    assert buckets == {"0.005": 2.0, "0.01": 3.0, "+Inf": 4.0}
    assert samples["memory_remember_ack_seconds_count"] == [({}, 4.0)]


def test_eval_passes_settings_to_its_own_service_and_refuses_anything_else() -> None:
    from memory_service.evals.cli import service_settings

    assert service_settings(["MEMORY_EXTRACT_COMPLETE=0", "MEMORY_TIMEZONE=Europe/Madrid"]) == {
        "MEMORY_EXTRACT_COMPLETE": "0",
        "MEMORY_TIMEZONE": "Europe/Madrid",
    }
    for bad in ("EXTRACT_COMPLETE=0", "MEMORY_EXTRACT_COMPLETE"):
        with pytest.raises(SystemExit, match="MEMORY_NAME=VALUE"):
            service_settings([bad])


def test_raw_http_client_reads_answers_reconnects_after_a_close_and_refuses_chunked_bodies() -> None:
    """The remember benchmark's minimal client, against a real HTTP/1.1 server that drops the connection
    after every second answer (as uvicorn does to an idle keep-alive connection) and chunks one route."""
    import asyncio
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from memory_service.bench.raw_http import RawHttpClient, RawHttpError

    connections: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        served = 0

        def setup(self) -> None:
            super().setup()
            connections.append(1)

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            reply = json.dumps({"echo": json.loads(body), "auth": self.headers["Authorization"]}).encode()
            self.send_response(202)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)
            type(self).served += 1
            self.close_connection = type(self).served % 2 == 0  # closed without telling the client

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"2\r\nok\r\n0\r\n\r\n")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    async def exchange() -> list[tuple[int, bytes]]:
        async with RawHttpClient(url, "k-1") as client:
            answers = [await client.request("POST", "/v1/remember", {"text": f"save {i}"}) for i in range(5)]
            with pytest.raises(RawHttpError, match="chunked"):
                await client.request("GET", "/health")
        return answers

    try:
        answers = asyncio.run(exchange())
    finally:
        server.shutdown()
    assert [status for status, _ in answers] == [202] * 5
    assert [json.loads(body) for _, body in answers] == [
        {"echo": {"text": f"save {i}"}, "auth": "Bearer k-1"} for i in range(5)
    ]
    assert len(connections) >= 3  # every answer arrived although the server closed twice
