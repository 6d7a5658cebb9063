"""The web console in a real browser: headless Chromium from the system's packages, driven by Playwright.

The service runs as `memory-service serve` against the fake llama-server, slowed so a save is seen
pending before it turns done. Every page is saved as a screenshot under the test's temp dir. No
browser is ever downloaded: a missing Chromium fails these tests with the command that installs it
(the `--dev` bootstrap does), it never skips them.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ServiceProcess, wait_status
from tests.fakes.fake_llama_server import FakeLlamaServer
from tests.inprocess import InProcessService

pytestmark = pytest.mark.process  # Chromium, against a serve subprocess

WAIT_MS = 60_000
TEXT = "Ines Ortega approved the Plover launch for May 3. The Plover budget is 400 dollars."


def chromium_path() -> str:
    found = os.environ.get("MEMORY_TEST_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found or not os.access(found, os.X_OK):
        pytest.fail(
            "no Chromium for the console's browser tests: run `scripts/bootstrap.sh --dev` "
            "(or `apt-get install -y chromium`), or point MEMORY_TEST_CHROMIUM at a Chromium binary"
        )
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: install the dev extras (`pip install -e '.[dev]'`)")
    executable = chromium_path()
    expect.set_options(timeout=WAIT_MS)  # waits for an element, never a fixed sleep
    with sync_playwright() as pw:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start; a container's /dev/shm is small
        launched = pw.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeLlamaServer]:
    with FakeLlamaServer("ok", tokens_per_s=6) as server:  # a reply of ~40 tokens takes seconds: watchable
        yield server


@pytest.fixture(scope="module")
def service(fake: FakeLlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = ServiceProcess(tmp_path_factory.mktemp("console") / "data", fake.url, {"MEMORY_MAX_ATTEMPTS": "1"}).start()
    yield svc
    svc.kill()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("console-screenshots")
    print(f"console screenshots: {folder}")
    return folder


@pytest.fixture(scope="module")
def api(service: ServiceProcess) -> Iterator[httpx.Client]:
    with service.client("key-a") as client:
        yield client


@pytest.fixture(scope="module")
def saved(api: httpx.Client) -> str:
    """The memory the tests look at, saved through the API; not waited for, so a page can watch it finish."""
    return api.post("/v1/remember", json={"text": TEXT, "agent_id": "planner", "tags": ["launch"]}).json()["id"]


def open_page(browser: Any, service: ServiceProcess, key: str, shots: Path) -> Any:
    """A fresh browser context logged in with `key` through the login form."""
    from playwright.sync_api import expect

    page = browser.new_context(viewport={"width": 1100, "height": 720}, base_url=service.url).new_page()
    page.set_default_timeout(WAIT_MS)
    page.goto("/ui/memories")
    expect(page).to_have_url(re.compile(r"/ui/login\?next="))
    if key == "key-a":
        page.screenshot(path=shots / "login.png")
    page.fill("#key", key)
    page.click("#login")
    expect(page).to_have_url(re.compile(r"/ui/memories$"))
    return page


def test_login_save_watch_it_turn_done_and_see_its_facts(
    browser: Any, service: ServiceProcess, shots: Path, saved: str
) -> None:
    from playwright.sync_api import expect

    page = open_page(browser, service, "key-a", shots)
    expect(page.locator("#team")).to_have_text("team-a")
    memory_id = saved  # saved through the API just before this page logged in
    page.goto("/ui/memories")
    row = page.locator(f"#mem-{memory_id}")
    expect(row.locator(".status")).to_have_text(re.compile("queued|extracting"))
    page.screenshot(path=shots / "memories-pending.png")
    expect(row.locator(".status")).to_have_text("done", timeout=WAIT_MS)  # the page refreshes itself
    page.screenshot(path=shots / "memories.png")
    row.locator("a.open").click()
    expect(page.locator("#status")).to_contain_text("done")
    expect(page.locator("#facts li.fact").first).to_contain_text("Ines Ortega approved the Plover launch")
    assert page.locator("#source mark").count() >= 2  # each fact's span marked in the text
    expect(page.locator("#timings")).to_contain_text("predicted tokens")
    page.screenshot(path=shots / "memory.png", full_page=True)


def test_search_runs_recall_and_shows_scores(
    browser: Any, service: ServiceProcess, api: httpx.Client, shots: Path, saved: str
) -> None:
    from playwright.sync_api import expect

    assert wait_status(api, saved)["status"] == "done"
    page = open_page(browser, service, "key-a", shots)
    page.fill("#q", "Plover budget")
    page.click("#apply")
    hits = page.locator("#hits tr.hit")
    expect(hits.first).to_be_visible()
    expect(hits.first.locator(".score")).to_have_text(re.compile(r"^\d+\.\d{4}$"))
    expect(page.locator("#hits")).to_contain_text("400 dollars")
    assert page.locator(f"#hits a[href='/ui/memories/{saved}']").count() >= 1
    page.screenshot(path=shots / "search.png", full_page=True)


def test_a_failed_job_shows_its_raw_reply_and_retries_from_the_jobs_page(
    browser: Any, service: ServiceProcess, api: httpx.Client, fake: FakeLlamaServer, shots: Path
) -> None:
    from playwright.sync_api import expect

    fake.set_mode("malformed", tokens_per_s=5000)
    memory_id = api.post("/v1/remember", json={"text": "The Gull tracker is archived.", "agent_id": "ops"}).json()["id"]
    assert wait_status(api, memory_id, timeout=60)["status"] == "failed"
    fake.set_mode("ok", tokens_per_s=5000)
    page = open_page(browser, service, "key-a", shots)
    page.goto(f"/ui/memories/{memory_id}")
    expect(page.locator("#last-error")).to_contain_text("BadReply")
    expect(page.locator("#raw-reply")).to_contain_text("Here are the facts")
    page.screenshot(path=shots / "memory-failed.png", full_page=True)
    page.goto("/ui/jobs")
    expect(page.locator("#failed-count")).to_have_text("1")
    page.screenshot(path=shots / "jobs.png", full_page=True)
    page.locator(f"#job-{memory_id} button.retry").click()  # a POST with the session's CSRF token
    expect(page).to_have_url(re.compile(r"/ui/jobs$"))
    expect(page.locator("#failed-count")).to_have_text("0")
    assert wait_status(api, memory_id, timeout=60)["status"] == "done"


def test_a_limits_usage_moves_after_a_consume(
    browser: Any, service: ServiceProcess, api: httpx.Client, shots: Path
) -> None:
    from playwright.sync_api import expect

    assert api.put("/v1/limits/emails", json={"daily_limit": 5, "timezone": "Europe/Madrid"}).status_code == 201
    page = open_page(browser, service, "key-a", shots)
    page.goto("/ui/limits")
    row = page.locator("#limit-emails")
    expect(row.locator(".used")).to_have_text("0")
    expect(row.locator(".resets")).to_contain_text("Europe/Madrid")
    assert (
        api.put("/v1/limits/calls", json={"daily_limit": 9, "timezone": "Asia/Tokyo", "per": "agent"}).status_code
        == 201
    )
    assert api.post("/v1/limits/emails/consume", json={"agent_id": "mailer", "amount": 2}).json()["used"] == 2
    assert api.post("/v1/limits/calls/consume", json={"agent_id": "mailer", "amount": 3}).json()["used"] == 3
    page.reload()
    expect(row.locator(".used")).to_have_text("2")
    expect(page.locator("tr[data-limit='calls'][data-agent='mailer'] .used")).to_have_text("3")
    expect(page.locator("#limit-calls .resets")).to_contain_text("+09:00 Asia/Tokyo")
    page.screenshot(path=shots / "limits.png", full_page=True)


def test_a_handled_key_is_found_by_lookup(
    browser: Any, service: ServiceProcess, api: httpx.Client, shots: Path
) -> None:
    from playwright.sync_api import expect

    assert api.post("/v1/handled", json={"key": "https://example.com/a?b=1#c"}).json()["first_time"] is True
    page = open_page(browser, service, "key-a", shots)
    page.goto("/ui/handled")
    page.fill("#handled-key", "https://example.com/a?b=1#c")
    page.click("#lookup")
    expect(page.locator("#handled-record")).to_contain_text("1 times")
    page.screenshot(path=shots / "handled.png", full_page=True)


def test_a_second_teams_key_sees_none_of_it(browser: Any, service: ServiceProcess, shots: Path, saved: str) -> None:
    from playwright.sync_api import expect

    page = open_page(browser, service, "key-b", shots)
    expect(page.locator("#team")).to_have_text("team-b")
    expect(page.locator("#memories")).to_contain_text("No memories match")
    page.screenshot(path=shots / "team-b-memories.png", full_page=True)
    page.fill("#q", "Plover budget")
    page.click("#apply")
    expect(page.locator("#hits")).to_contain_text("Nothing recalled")
    answer = page.goto(f"/ui/memories/{saved}")
    assert answer is not None and answer.status == 404
    page.goto("/ui/limits")
    expect(page.locator("#limits")).to_contain_text("no limits")
    page.goto("/ui/jobs")
    expect(page.locator("#failed-count")).to_have_text("0")
    page.goto("/ui/handled?key=" + "https%3A%2F%2Fexample.com%2Fa%3Fb%3D1%23c")
    expect(page.locator("#handled-none")).to_be_visible()
    page.screenshot(path=shots / "team-b-handled.png", full_page=True)


# ---------------------------------------------------------------- the pictures (console/charts.py)

PICTURE_TEXTS = (
    "The Plover budget is 400 dollars.",
    "Ines Ortega approved the Plover launch for May 3.",
    "The Gull tracker moved to Lisbon.",
)


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessService, FakeLlamaServer]]:
    """A service of its own (in process: its journal is at hand), so the Jobs chart counts only these jobs;
    a long budget, so a job held by a hanging model stays extracting while the page is looked at."""
    with FakeLlamaServer("ok", tokens_per_s=5000) as fake:
        env = {"MEMORY_EXTRACT_BUDGET_S": "600"}
        svc = InProcessService(tmp_path_factory.mktemp("pictures") / "data", fake.url, env).start()
        yield svc, fake
        svc.stop()


def test_the_pictures_render_with_their_numbers(
    browser: Any, pictures: tuple[InProcessService, FakeLlamaServer], shots: Path
) -> None:
    from playwright.sync_api import expect

    svc, _ = pictures
    with svc.client("key-a") as api:
        ids = [api.post("/v1/remember", json={"text": t, "agent_id": "planner"}).json()["id"] for t in PICTURE_TEXTS]
        assert [wait_status(api, i)["status"] for i in ids] == ["done"] * 3
        assert api.put("/v1/limits/emails", json={"daily_limit": 5, "timezone": "UTC"}).status_code == 201
        assert (
            api.put("/v1/limits/calls", json={"daily_limit": 3, "timezone": "UTC", "per": "agent"}).status_code == 201
        )
        for name, agent, amount in (("emails", "mailer", 4), ("calls", "mailer", 3), ("calls", "planner", 1)):
            assert api.post(f"/v1/limits/{name}/consume", json={"agent_id": agent, "amount": amount}).status_code == 200
    page = open_page(browser, svc, "key-a", shots)

    page.goto("/ui/limits")
    today = page.locator("#limit-emails td.today svg")
    expect(today).to_have_attribute("aria-label", "emails today: 4 of 5 (80%)")
    assert today.locator("rect.fill").get_attribute("width") == "96.0"  # 4/5 of 120
    assert (today.bounding_box() or {}).get("width") == 120  # drawn, at its size
    expect(page.locator("#limit-emails td.week svg rect.col")).to_have_count(7)
    expect(page.locator("#limit-emails td.week svg")).to_have_attribute("aria-label", re.compile(r"; \S+: 4$"))
    mailer = page.locator("tr[data-limit='calls'][data-agent='mailer'] td.today svg")
    expect(mailer).to_have_attribute("aria-label", "calls today, agent mailer: 3 of 3 (100%)")
    expect(page.locator("tr[data-agent='planner'] td.week svg")).to_have_attribute(
        "aria-label", re.compile(r"^calls, agent planner, used per day: .*: 1$")
    )
    page.screenshot(path=shots / "pictures-limits.png", full_page=True)

    page.goto("/ui/jobs")
    finished = page.locator("#finished-chart svg")
    expect(finished).to_have_attribute("aria-label", re.compile(r": 3 finished$"))  # all within the last 5 min
    expect(page.locator("#finished-chart figcaption")).to_contain_text("3 this hour")
    assert (finished.locator("rect.col").last.bounding_box() or {}).get("height", 0) > 50  # the tallest column
    expect(page.locator("#depth-chart svg")).to_have_attribute(
        "aria-label", re.compile(r": 0 jobs waiting or running$")
    )
    expect(page.locator("#team-line")).to_have_text("team team-a")  # a key's team: no keyless words
    page.screenshot(path=shots / "pictures-jobs.png", full_page=True)

    page.goto("/ui/memories")
    page.fill("#q", "Plover budget")
    page.click("#apply")
    first = page.locator("#hits tr.hit").first.locator("td.relevance svg")
    expect(first).to_have_attribute("aria-label", re.compile(r"^score \d\.\d{4}, 100% of the best hit's$"))
    assert page.locator("#hits td.relevance svg").count() == page.locator("#hits tr.hit").count() >= 2
    page.screenshot(path=shots / "pictures-search.png", full_page=True)

    other = open_page(browser, svc, "key-b", shots)  # team B: none of team A's jobs in its pictures
    other.goto("/ui/jobs")
    expect(other.locator("#finished-chart figcaption")).to_contain_text("0 this hour")
    said = other.locator("#finished-chart svg").get_attribute("aria-label") or ""
    assert said.count(": 0 finished") == 12, said
    other.goto("/ui/limits")
    expect(other.locator("#limits svg")).to_have_count(0)
    other.screenshot(path=shots / "pictures-team-b-limits.png", full_page=True)


def test_an_extracting_memory_shows_its_progress_bar(
    browser: Any, pictures: tuple[InProcessService, FakeLlamaServer], shots: Path
) -> None:
    from playwright.sync_api import expect

    svc, fake = pictures
    fake.set_mode("hang")  # the worker holds the job, extracting, while the model never answers
    text = " ".join(f"Locker {n} in the Puffin depot holds {n * 7} crates." for n in range(1, 40))
    with svc.client("key-a") as api:
        memory_id = api.post("/v1/remember", json={"text": text, "agent_id": "slow"}).json()["id"]
        wait_status(api, memory_id, statuses=("extracting",), timeout=60)
    assert svc.services is not None
    svc.services.journal.save_progress(memory_id, {"chunks": 2, "offset": 700})  # as after two chunks
    said = f"extraction progress: 700 of {len(text):,} characters ({100 * 700 / len(text):.0f}%), 2 chunk(s) done"
    page = open_page(browser, svc, "key-a", shots)
    page.goto(f"/ui/memories/{memory_id}")
    bar = page.locator("#progress svg")
    expect(bar).to_have_attribute("aria-label", said)
    assert float(bar.locator("rect.fill").get_attribute("width") or 0) == round(120 * 700 / len(text), 1)
    page.screenshot(path=shots / "pictures-progress.png", full_page=True)
    page.goto("/ui/jobs")
    expect(page.locator(f"#job-{memory_id} svg")).to_have_attribute("aria-label", said)
    expect(page.locator("#depth-chart svg")).to_have_attribute(
        "aria-label", re.compile(r": 1 jobs waiting or running$")
    )
    page.screenshot(path=shots / "pictures-jobs-extracting.png", full_page=True)
