"""The console's pictures: the SVG builders (numbers in, widths and spoken labels out), the jobs ring that
feeds the Jobs chart, and each page drawing them, in process over HTTP.

Every label a picture carries is read back from its `aria-label`, the words a screen reader says; the
browser tests (tests/test_console_browser.py) check the same pictures render and take screenshots.
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, Counter

from memory_service.app import create_app
from memory_service.config import Settings
from memory_service.console.charts import BAR_W, COLUMNS_H, bar, columns
from memory_service.pipeline.job_history import BUCKETS, JobHistory
from memory_service.services import Services
from memory_service.storage.journal import FactPlan, NewFact
from tests.conftest import InProcessApp, free_port
from tests.test_console import login

LABEL = re.compile(r'aria-label="([^"]*)"')


def svg(markup: str) -> ET.Element:
    """The picture parsed as XML: it must be well-formed whatever the names in it."""
    return ET.fromstring(str(markup))


def fill_width(markup: str) -> float:
    return float(svg(markup).findall("{*}rect")[1].get("width") or "nan")


def labels(page: str) -> list[str]:
    return [html.unescape(m) for m in LABEL.findall(page)]


def label_of(page: str, element_id: str) -> str:
    """The spoken label of the first picture after `id="element_id"`."""
    return html.unescape(LABEL.search(page.split(f'id="{element_id}"', 1)[1]).group(1))


# ---------------------------------------------------------------- the builders


def test_a_bar_fills_its_share_of_the_width_and_says_its_numbers() -> None:
    picture = bar(3, 5, "emails today")
    assert fill_width(picture) == pytest.approx(BAR_W * 3 / 5)
    assert svg(picture).get("aria-label") == "emails today: 3 of 5 (60%)"
    assert svg(picture).find("{*}title").text == "emails today: 3 of 5 (60%)"
    assert svg(picture).get("role") == "img" and "over" not in svg(picture).get("class")


@pytest.mark.parametrize(
    ("value", "whole", "width", "words", "over"),
    [
        (0, 5, 0.0, "x: 0 of 5 (0%)", False),
        (0, 0, 0.0, "x: 0 of 0 (no allowance)", False),
        (2, 0, BAR_W, "x: 2 of 0 (no allowance)", True),
        (7, 5, BAR_W, "x: 7 of 5 (140%)", True),  # a limit lowered below today's use
        (-4, 5, 0.0, "x: -4 of 5 (0%)", False),
        (10**15, 7, BAR_W, "x: 1,000,000,000,000,000 of 7 (14,285,714,285,714,286%)", True),
        (1_234_567, 10_000_000, BAR_W * 0.1234567, "x: 1,234,567 of 10,000,000 (12%)", False),
    ],
)
def test_a_bar_at_the_edges(value: int, whole: int, width: float, words: str, over: bool) -> None:
    picture = bar(value, whole, "x")
    assert fill_width(picture) == pytest.approx(width, abs=0.05)
    assert svg(picture).get("aria-label") == words
    assert ("over" in svg(picture).get("class", "").split()) is over


def test_hostile_names_are_escaped_and_invisible_characters_shown() -> None:
    name = "<script>alert(1)</script>\"' & \u202egnp.exe\u200f\n\x00"
    for picture in (bar(1, 2, name), columns([(name, 3), ("ok", 1)], name, ceiling=2)):
        text = str(picture)
        assert "<script" not in text and "\u202e" not in text and "\x00" not in text and "\n" not in text
        said = svg(picture).get("aria-label")  # parses: the quotes did not end the attribute
        assert said.startswith("<script>alert(1)</script>\"' & \ufffdgnp.exe\ufffd\ufffd\ufffd")


def test_columns_scale_to_the_largest_value_or_the_limit_and_say_every_day() -> None:
    week = [("2026-12-01", 0), ("2026-12-02", 4), ("2026-12-03", None), ("2026-12-04", 10)]
    picture = svg(columns(week, "calls, used per day", ceiling=5))
    rects = picture.findall("{*}rect")
    assert [r.find("{*}title").text for r in rects] == ["2026-12-01: 0", "2026-12-02: 4", "2026-12-04: 10"]
    heights = [float(r.get("height")) for r in rects]
    assert heights[0] == 1.0  # a zero is a hairline, not nothing
    assert heights[2] == COLUMNS_H - 2 and heights[1] == pytest.approx((COLUMNS_H - 2) * 0.4, abs=0.05)
    assert [r.get("class") for r in rects] == ["col", "col", "col over"]  # 10 of a limit of 5
    assert picture.find("{*}line[@class='limit']").find("{*}title").text == "limit 5"
    assert picture.find("{*}g").find("{*}title").text == "2026-12-03: not measured"  # a gap, no column
    assert picture.get("aria-label") == (
        "calls, used per day: 2026-12-01: 0; 2026-12-02: 4; 2026-12-03: not measured; 2026-12-04: 10"
    )
    assert svg(columns([], "nothing")).get("aria-label") == "nothing: no data"
    huge = svg(columns([("a", 10**18), ("b", 1)], "huge"))
    assert [float(r.get("height")) for r in huge.findall("{*}rect")] == [COLUMNS_H - 2, 1.0]


# ---------------------------------------------------------------- the jobs ring


def ring() -> tuple[JobHistory, Counter]:
    jobs = Counter("memory_jobs", "test", ["team", "outcome"], registry=CollectorRegistry())
    return JobHistory(jobs, sample_s=15, window_s=3600), jobs


def test_the_ring_buckets_depth_and_finished_jobs_by_team_and_keeps_an_hour() -> None:
    history, jobs = ring()
    t0 = 1_000_000.0
    history.record({"team-a": 4}, now=t0 + 10)  # in the first five minutes of the hour ending t0 + 3600
    jobs.labels("team-a", "done").inc(2)
    jobs.labels("team-a", "failed").inc()
    jobs.labels("team-a", "retried").inc(5)  # comes back: not finished
    history.record({"team-a": 1}, now=t0 + 1900)
    jobs.labels("team-a", "done").inc()  # after the last sample: counted in the live last bucket
    buckets = history.buckets("team-a", depth_now=0, now=t0 + 3600)
    assert len(buckets) == BUCKETS
    assert [b.depth for b in buckets] == [4, None, None, None, None, None, 1, None, None, None, None, 0]
    assert [b.finished for b in buckets] == [0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 1]
    later = history.buckets("team-a", depth_now=0, now=t0 + 3600 + 400)  # the first sample left the hour
    assert later[0].depth is None and sum(b.finished for b in later) == 4
    for n in range(1000):  # bounded: an hour of samples, whatever ran before
        history.record({"team-a": n}, now=t0 + 4000 + n * 15)
    assert len(history._samples) == 3600 / 15 + 1


def test_a_teams_buckets_do_not_depend_on_another_teams_jobs() -> None:
    alone, alone_jobs = ring()
    shared, shared_jobs = ring()
    for history, jobs, busy in ((alone, alone_jobs, False), (shared, shared_jobs, True)):
        jobs.labels("team-a", "done").inc(3)
        if busy:
            jobs.labels("team-b", "done").inc(50)
        history.record({"team-a": 2, **({"team-b": 900} if busy else {})}, now=2000.0)
        if busy:
            jobs.labels("team-b", "failed").inc(7)
    assert alone.buckets("team-a", 2, now=3000.0) == shared.buckets("team-a", 2, now=3000.0)
    assert [b.finished for b in shared.buckets("team-b", 0, now=3000.0)][-4:] == [50, 0, 0, 7]
    assert sum(b.finished for b in alone.buckets("team-b", 0, now=3000.0)) == 0


# ---------------------------------------------------------------- the pages


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessApp]:
    made = InProcessApp(tmp_path_factory.mktemp("pictures") / "data")
    yield made
    made.services.close()


def test_the_limits_page_draws_todays_bar_and_the_week_per_limit_and_agent(app: InProcessApp) -> None:
    api = app.client("key-a")
    assert api.put("/v1/limits/emails", json={"daily_limit": 5, "timezone": "UTC"}).status_code == 201
    assert api.put("/v1/limits/calls", json={"daily_limit": 9, "timezone": "UTC", "per": "agent"}).status_code == 201
    for name, agent, amount in (("emails", "mailer", 2), ("calls", "mailer", 3), ("calls", "planner", 9)):
        answer = api.post(f"/v1/limits/{name}/consume", json={"agent_id": agent, "amount": amount})
        assert answer.status_code == 200, answer.text
    page = login(app, "key-a").get("/ui/limits").text
    said = labels(page)
    assert "emails today: 2 of 5 (40%)" in said
    week = next(s for s in said if s.startswith("emails, used per day: "))
    assert week.count(": 0") == 6 and week.endswith(": 2") and len(week.split("; ")) == 7  # today last
    assert "calls today, agent planner: 9 of 9 (100%)" in said
    assert "calls today, agent mailer: 3 of 9 (33%)" in said
    assert any(s.startswith("calls (all agents), used per day: ") and s.endswith(": 12") for s in said)
    assert any(s.startswith("calls, agent planner, used per day: ") and s.endswith(": 9") for s in said)
    assert 'class="col over"' not in page.split('data-agent="planner"', 1)[1]  # at the limit is not over it
    other = login(app, "key-b").get("/ui/limits").text
    assert labels(other) == [] and "no limits" in other


def test_the_jobs_page_charts_the_teams_own_hour_and_says_split_saves_are_not_lost(app: InProcessApp) -> None:
    services = app.services
    api = app.client("key-a")
    api.post("/v1/remember", json={"text": "The Teal tracker moves to Lisbon.", "agent_id": "ops"})
    services.metrics.job("team-a", "done")  # what the extraction worker counts for each finished job
    services.metrics.job("team-a", "done")
    services.metrics.history.sample(services.journal)
    services.metrics.job("team-a", "failed")
    a = login(app, "key-a").get("/ui/jobs").text
    depth, finished = label_of(a, "depth-chart"), label_of(a, "finished-chart")
    assert depth.startswith("this team's queue depth, every five minutes: ")
    assert depth.count("not measured") == BUCKETS - 1 and depth.endswith(": 1 jobs waiting or running")
    assert finished.endswith(": 3 finished") and "3 this hour" in a
    b = login(app, "key-b").get("/ui/jobs").text  # team B's picture holds nothing of team A's
    assert label_of(b, "depth-chart").endswith(": 0 jobs waiting or running")
    assert label_of(b, "finished-chart").count(": 0 finished") == BUCKETS and "0 this hour" in b

    services.primary_model.throughput.prior(200.0, 0.5, source="a slow test model")
    verdict = login(app, "key-a").get("/ui/jobs").text.split('id="verdict"', 1)[1].split("</td>", 1)[0]
    assert "split" in verdict and "not lost" in verdict and "cut" not in verdict  # as `doctor` says


def test_an_extracting_memory_shows_a_progress_bar(app: InProcessApp) -> None:
    api = app.client("key-a")
    memory_id = api.post("/v1/remember", json={"text": "Plover." * 50, "agent_id": "ops"}).json()["id"]
    journal = app.services.journal
    while (claimed := journal.claim_next("test")) is not None and claimed.id != memory_id:
        pass  # earlier tests' jobs: extracting too, as a worker would hold them
    journal.save_progress(memory_id, {"chunks": 2, "offset": 100}, "test")
    a = login(app, "key-a")
    assert label_of(a.get(f"/ui/memories/{memory_id}").text, "progress") == (
        "extraction progress: 100 of 350 characters (29%), 2 chunk(s) done"
    )
    jobs = a.get("/ui/jobs").text.split(f'id="job-{memory_id}"', 1)[1].split("</tr>", 1)[0]
    assert "extraction progress: 100 of 350 characters (29%)" in html.unescape(jobs)


def test_search_hits_carry_a_score_bar_against_the_best_hit(app: InProcessApp) -> None:
    journal, api = app.services.journal, app.client("key-a")
    for n, text in enumerate(("The Wren budget is 400 dollars.", "The Wren launch is on May 3.")):
        memory_id = api.post("/v1/remember", json={"text": text, "agent_id": "fin"}).json()["id"]
        fact = NewFact(id=f"f:wren-{n}", text=text, norm=text.lower(), shape=f"wren {n}", spans=[(0, len(text))])
        journal.complete(
            journal.get("team-a", memory_id), FactPlan(new=[fact]), raw_reply=None, timings=None, report={}
        )
    page = login(app, "key-a").get("/ui/memories?q=Wren+budget+dollars").text
    hits = page.split('id="hits"', 1)[1]
    bars = [s for s in labels(hits) if s.startswith("score ")]
    assert len(bars) >= 1 and re.fullmatch(r"score \d\.\d{4}, 100% of the best hit's", bars[0])
    assert all(re.fullmatch(r"score -?\d\.\d{4}, \d+% of the best hit's", s) for s in bars)


def test_the_header_names_the_keyless_team(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", llm_url=f"http://127.0.0.1:{free_port()}", chroma_process=False)
    services = Services.open(settings)
    try:
        page = (
            TestClient(create_app(settings, services=services), base_url="http://127.0.0.1:8700").get("/ui/jobs").text
        )
    finally:
        services.close()
    header = re.sub(r"<[^>]+>", "", page.split('id="team-line"', 1)[1].split("</span>", 1)[0].split(">", 1)[1])
    assert header == "keyless mode: team local"
