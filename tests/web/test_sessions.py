"""The session browser in a real browser, as staff: filters, full-text search with snippets, server
pages (cursor) forward and back."""

from __future__ import annotations

from typing import Any

import pytest

from tests.web import harness

RUN = "browse-run"


@pytest.fixture(scope="module")
def seeded(server: harness.WebServer) -> dict[str, Any]:
    server.seed_rl_run(RUN, iterations=1, tasks=28, samples=2)  # 56 rollouts: more than one page of 50
    s = server.create_session(["Looked at it: the <b>median</b> is fine."], title="search me")
    server.run_turn(s["id"], "Is the zygomorphic median right?")
    return s


def test_filter_search_and_page(page: Any, server: harness.WebServer, seeded: dict[str, Any]) -> None:
    harness.sign_in(page, server.url, server.staff)
    page.click("nav.top a:has-text('Sessions')")
    page.wait_for_selector("table.sessions tbody tr")

    # RL rollouts of one run: 56, in pages of 50 cut by the server
    page.select_option("#f-kind", "rl")
    page.fill("#f-run", RUN)
    page.click("form[aria-label='filter sessions'] button[type=submit]")
    page.wait_for_url("**kind=rl**")
    page.wait_for_function("""() => {
      const kinds = [...document.querySelectorAll('table.sessions tbody td:nth-child(3)')].map(td => td.textContent);
      return kinds.length === 50 && kinds.every(k => k.startsWith('rl · browse-run'));
    }""")
    assert page.locator("a:has-text('next page')").count() == 1
    first_page = page.locator("table.sessions tbody tr td:first-child a").all_inner_texts()
    page.click("a:has-text('next page')")
    page.wait_for_url("**cursor=**")
    page.wait_for_function("() => document.querySelectorAll('table.sessions tbody tr').length === 6")
    second = page.locator("table.sessions tbody tr td:first-child a").all_inner_texts()
    assert not set(first_page) & set(second)
    assert page.locator("a:has-text('next page')").count() == 0
    page.click("button:has-text('previous page')")
    page.wait_for_function("() => document.querySelectorAll('table.sessions tbody tr').length === 50")

    # full-text search over messages: the match is shown as text, the words marked
    page.click("a:has-text('clear')")
    # the previous page's rows are still there while the cleared filters render: wait for the form itself
    # to be reset, or the search below can be typed into the old form and sent with kind=rl (no match)
    page.wait_for_function("() => !location.href.includes('kind=') && document.querySelector('#f-run').value === ''"
                           " && document.querySelector('#f-kind').value !== 'rl'")
    page.wait_for_selector("table.sessions tbody tr")
    page.fill("#f-q", "zygomorphic")
    page.click("form[aria-label='filter sessions'] button[type=submit]")
    page.wait_for_selector(".snippet mark")
    assert page.locator("table.sessions tbody tr").count() == 1
    assert page.inner_text(".snippet mark").lower() == "zygomorphic"
    page.fill("#f-q", "median")
    page.click("form[aria-label='filter sessions'] button[type=submit]")
    page.wait_for_url("**q=median**")
    page.wait_for_selector(".snippet mark")
    assert page.locator(".snippet b").count() == 0  # the model's <b> is text, not markup

    page.click("a:has-text('clear')")
    page.wait_for_selector("table.sessions tbody tr")
    harness.check_screen(page, "sessions")
    page.console.assert_clean()
