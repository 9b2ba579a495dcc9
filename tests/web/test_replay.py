"""Replay in a real browser, as staff: the timeline (parallel calls as overlapping bars), stepping by
keyboard and buttons, play, a call's details, the model's view, re-execute and branch."""

from __future__ import annotations

from typing import Any

import pytest

from agent.parser import encode_call
from tests.web import harness


@pytest.fixture(scope="module")
def recorded(server: harness.WebServer) -> dict[str, Any]:
    """A finished session whose first step runs two commands at the same time (and one whose output
    is new on every run, so re-executing it differs)."""
    outputs = [
        "Two checks at once.\n\n" + encode_call("run_command", {"command": "sleep 0.4; echo first"}) + "\n"
        + encode_call("run_command", {"command": "sleep 0.4; echo second"}) + "\n"
        + encode_call("read_file", {"path": "stats.py"}) + "\n"
        + encode_call("run_command", {"command": "python3 -c 'import uuid; print(uuid.uuid4())'"}),
        "Fixing it.\n\n" + encode_call("edit_file", {"path": "stats.py", "search": "(len(v) - 1)", "replace": "len(v)"}),
        "Fixed the mean.",
    ]
    s = server.create_session(outputs, title="replay me")
    events = server.run_turn(s["id"], "Check and fix.")
    return {"session": s, "events": events}


def test_replay_timeline_steps_details(page: Any, server: harness.WebServer, recorded: dict[str, Any]) -> None:
    sid, n = recorded["session"]["id"], len(recorded["events"])
    harness.sign_in(page, server.url, server.staff)
    page.goto(f"{server.url}/#/replay/{sid}")
    page.wait_for_selector(".timeline .bar.call")
    assert page.inner_text(".position").startswith(f"event {n}/{n}")

    # the two commands ran together: their bars overlap on the time axis, on different rows
    bars = [page.locator(f".bar.call[data-call-id='{c}']").bounding_box() for c in ("t1s1c0", "t1s1c1")]
    assert bars[0]["x"] < bars[1]["x"] + bars[1]["width"] and bars[1]["x"] < bars[0]["x"] + bars[0]["width"], bars
    assert bars[0]["y"] != bars[1]["y"], bars

    # keyboard: the scrubber steps event by event
    page.focus("#scrubber")
    page.keyboard.press("Home")
    assert page.inner_text(".position").startswith(f"event 0/{n}")
    assert page.locator(".conversation .transcript").count() == 0
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    assert page.inner_text(".position").startswith(f"event 3/{n}")
    assert "Check and fix." in page.inner_text(".conversation")

    # buttons: to the end of the first model step, then back one event
    page.click("button[aria-label='next model step']")
    first_step_end = next(i + 1 for i, e in enumerate(recorded["events"]) if e["type"] == "assistant_message")
    assert page.inner_text(".position").startswith(f"event {first_step_end}/{n}")
    page.click("button[aria-label='step back']")
    assert page.inner_text(".position").startswith(f"event {first_step_end - 1}/{n}")

    # play from the start at 20x until the end
    page.click("button[aria-label='to the start']")
    page.select_option("#speed", "20")
    page.focus("button[aria-label='play']")
    page.keyboard.press("Space")  # the controls work from the keyboard
    page.wait_for_function(f"() => document.querySelector('.position').textContent.startsWith('event {n}/{n}')",
                           timeout=20_000)
    page.wait_for_selector("button[aria-label='play']")  # it stops at the end

    # a bar opens the call: arguments, output, how long it ran
    page.click(".bar.call[data-call-id='t1s1c1']")
    details = page.locator(".details")
    assert "sleep 0.4; echo second" in details.inner_text() and "second" in details.locator(".card-output").last.inner_text()
    ran = details.locator("dt:has-text('ran for') + dd").inner_text()
    assert ran.endswith(" ms") or ran.endswith(" s"), ran
    page.click(".bar.call[data-call-id='t1s2c0']")
    page.wait_for_selector(".details .d2h-file-wrapper")
    assert "edit_file" in details.locator("h2").inner_text()

    # the conversation as the model read it: system prompt, outputs with their XML, results in call order
    page.check("input[name='view'] >> nth=1")
    page.wait_for_selector(".model-view .mv-tool")
    model = page.inner_text(".model-view")
    assert '<tool_call name="run_command">' in model and model.index("first") < model.index("second")

    assert harness.axe(page) == []
    page.check("input[name='view'] >> nth=0")
    page.click(".bar.call[data-call-id='t1s1c0']")
    harness.check_screen(page, "replay")
    page.console.assert_clean()


def test_reexecute_and_branch(page: Any, server: harness.WebServer, recorded: dict[str, Any]) -> None:
    sid = recorded["session"]["id"]
    harness.sign_in(page, server.url, server.staff)
    page.goto(f"{server.url}/#/replay/{sid}")
    page.click("button:has-text('Re-execute')")
    page.wait_for_selector(".reexec-report", timeout=60_000)
    calls = sum(e["type"] == "tool_call_started" for e in recorded["events"])
    assert page.inner_text(".count-same") == f"{calls - 1} same"
    assert page.inner_text(".count-differs") == "1 differs"
    # the call that differs, recorded and replayed output side by side
    differs = page.locator(".comparison.status-differs")
    assert differs.count() == 1 and differs.get_attribute("data-call-id") == "t1s1c3"
    differs.locator(".d2h-file-side-diff").first.wait_for()
    assert differs.locator(".d2h-file-side-diff").count() == 2  # two columns: recorded | replayed
    page.uncheck(".reexec-report input[type=checkbox]")  # every call
    assert page.locator(".comparison.status-same").count() == calls - 1

    page.fill("#from-step", "1")
    page.fill("#branch-outputs", '["The branch takes over after step 1."]')
    page.click("form[aria-label='branch'] button[type=submit]")
    link = page.locator("p[role=status] a", has_text="replay")
    child = link.inner_text().split()[-1]
    link.click()
    page.wait_for_selector(".lineage")
    assert f"branched from {sid} at step 1" in page.inner_text(".lineage")
    page.goto(f"{server.url}/#/replay/{sid}")
    page.wait_for_selector(f".lineage a[href='#/replay/{child}']")
    page.console.assert_clean()
