"""Fixtures for the browser tests: one server and one Chromium for the whole run (a fresh browser
context, so a fresh tab with empty sessionStorage, per test). Skipped with the reason when Chromium,
Playwright or the built app is missing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.web import harness

REASON = harness.missing()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if REASON:
        here = Path(__file__).parent
        for item in items:
            if Path(str(item.fspath)).is_relative_to(here):
                item.add_marker(pytest.mark.skip(reason=REASON))


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.WebServer]:
    with harness.web_server(tmp_path_factory.mktemp("web")) as srv:
        yield srv


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = harness.launch(p)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, tmp_path: Path) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900}, accept_downloads=True)
    context.set_default_timeout(15_000)
    pg = context.new_page()
    pg.console = harness.Console(pg)  # type: ignore[attr-defined]
    yield pg
    context.close()
