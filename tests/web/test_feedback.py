"""Feedback in a real browser: thumbs down with a comment on a turn, keep one file and revert another
(the revert changes the workspace), then staff see it in replay and find it in the session browser."""

from __future__ import annotations

from typing import Any

from agent.parser import encode_call
from tests.web import harness


def test_rate_keep_revert_then_replay(page: Any, server: harness.WebServer) -> None:
    outputs = [
        "Editing two files.\n\n"
        + encode_call("edit_file", {"path": "stats.py", "search": "(len(v) - 1)", "replace": "len(v)"}) + "\n"
        + encode_call("write_file", {"path": "NOTES.md", "content": "mean fixed\n"}),
        "Both done.",
    ]
    s = server.create_session(outputs, title="feedback")
    server.run_turn(s["id"], "Fix the mean and take notes.")
    harness.sign_in(page, server.url, server.user)
    page.goto(f"{server.url}/#/chat/{s['id']}")
    page.wait_for_selector(".turn-end.reason-completed")

    page.click("button[aria-label='bad answer']")
    page.fill("#fb-1", "it should have run the tests")
    page.click(".feedback button:has-text('Save')")
    page.wait_for_selector(".ratings li")
    assert page.inner_text(".ratings").strip() == "alice rated this turn bad: “it should have run the tests”"
    assert page.get_attribute("button[aria-label='bad answer']", "aria-pressed") == "true"

    page.wait_for_selector(".workspace .files li:has-text('NOTES.md')")
    page.locator(".files li", has_text="NOTES.md").locator("button", has_text="keep").click()
    page.wait_for_selector(".files li:has-text('NOTES.md') button[aria-pressed='true']:has-text('keep')")
    page.locator(".files li", has_text="stats.py").locator("button", has_text="revert").click()
    page.wait_for_selector(".verdict-note.verdict-revert")
    assert "alice reverted stats.py" in page.inner_text(".verdict-note.verdict-revert")
    page.wait_for_function("() => ![...document.querySelectorAll('.workspace .files li')].some(li => li.textContent.includes('stats.py'))")
    r = server.client().get(f"/v1/sessions/{s['id']}/diff").json()
    assert [f["path"] for f in r["files"]] == ["NOTES.md"]  # the revert put stats.py back in the workspace
    violations = harness.axe(page)
    assert violations == [], violations
    page.console.assert_clean()

    # staff: the feedback is in the replay, in order, and the browser finds the session by it
    page.click("button:has-text('Sign out')")
    harness.sign_in(page, server.url, server.staff)
    page.goto(f"{server.url}/#/replay/{s['id']}")
    page.wait_for_selector("#fb-h")
    listed = page.inner_text(".feedback-list")
    assert "turn 1: alice rated it bad “it should have run the tests”" in listed
    assert "stats.py: alice reverted it" in listed and "NOTES.md: alice kept it" in listed
    page.focus("#scrubber")
    page.keyboard.press("Home")
    assert page.locator("#fb-h").count() == 0  # before it was given
    page.goto(f"{server.url}/#/sessions?feedback=down")
    page.wait_for_selector(f"table.sessions a[href='#/replay/{s['id']}']")
    assert "1 down" in page.inner_text("table.sessions tbody")
    page.console.assert_clean()
