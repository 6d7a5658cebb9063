"""`/docs` and `/redoc` work offline (issue 42, item 5): Swagger UI and ReDoc come from the service itself.

Headless Chromium (the system's, as in test_console_browser.py) loads each page with every request that
leaves the service's origin aborted, and must still see the API's operations, having asked nothing of any
other host.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from inprocess import LoopbackServer
from test_console_browser import WAIT_MS, browser  # noqa: F401  (the shared Chromium fixture)

from memory_service.app import create_app
from memory_service.config import Settings
from memory_service.llm.runtime.server import free_port

pytestmark = pytest.mark.process  # Chromium


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app on a loopback port; no lifespan (the pages and /openapi.json touch no store)."""
    data = tmp_path_factory.mktemp("docs") / "data"
    settings = Settings(data_dir=data, llm_url=f"http://127.0.0.1:{free_port()}", api_keys={"key-a": "team-a"})
    server = LoopbackServer(create_app(settings), lifespan="off").start()
    yield server.url
    server.stop()


def offline_page(browser: Any, origin: str) -> tuple[Any, list[str]]:  # noqa: F811
    """A page whose requests to anywhere but `origin` are aborted (and listed)."""
    context = browser.new_context(base_url=origin)
    outside: list[str] = []

    def route(request_route: Any) -> None:
        url = request_route.request.url
        if url == origin or url.startswith(origin + "/"):
            request_route.continue_()
        else:
            outside.append(url)
            request_route.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    return page, outside


def test_swagger_ui_lists_the_operations_with_the_network_off(
    browser: Any,  # noqa: F811
    served: str,
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    page, outside = offline_page(browser, served)
    page.goto("/docs")
    expect(page.locator(".opblock-summary-path", has_text="/v1/remember").first).to_be_visible()
    expect(page.locator(".opblock-summary-path", has_text="/v1/recall").first).to_be_visible()
    assert page.locator(".opblock").count() >= 20
    page.screenshot(path=tmp_path / "docs.png")
    assert outside == [], f"/docs asked other hosts: {outside}"


def test_redoc_lists_the_operations_with_the_network_off(
    browser: Any,  # noqa: F811
    served: str,
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    page, outside = offline_page(browser, served)
    page.goto("/redoc")
    expect(page.locator("h2", has_text="Create a key for this team").first).to_be_visible()  # an operation
    assert page.locator("h2").count() >= 20
    page.screenshot(path=tmp_path / "redoc.png")
    assert outside == [], f"/redoc asked other hosts: {outside}"
