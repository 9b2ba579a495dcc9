"""The chat in a real browser against a real server: sign in, start a session from the form, watch a
turn stream (text, three parallel cards with live timers, command output, a highlighted diff), the
workspace panel and its patch, approvals, interrupt, and a dropped connection mid-turn."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.web import harness

RECONNECT_NOISE = (r"WebSocket connection to .* failed", r"net::ERR_", r"Failed to load resource")


def open_chat(page: Any, base: str, token: str, session_id: str) -> None:
    harness.sign_in(page, base, token)
    page.goto(f"{base}/#/chat/{session_id}")
    page.wait_for_selector(".conn[data-state='open']")


def send(page: Any, text: str) -> None:
    page.fill("#prompt", text)
    page.keyboard.press("Enter")


def test_sign_in_and_chat_a_turn(page: Any, server: harness.WebServer) -> None:
    page.goto(f"{server.url}/")
    page.fill("#token", "fw_not_a_real_token_at_all_000000000")
    page.click("form[aria-label='sign in'] button[type=submit]")
    page.wait_for_selector(".signin .error")
    assert "not valid" in page.inner_text(".signin .error")
    page.fill("#token", server.user)
    page.keyboard.press("Enter")  # the form submits from the keyboard
    page.wait_for_selector("nav.top")
    assert page.locator("nav.top a[href='#/runs']").count() == 0  # no staff link for a user
    assert page.evaluate("sessionStorage.getItem('flywheel.token')") == server.user
    assert page.evaluate("localStorage.length") == 0 and page.evaluate("document.cookie") == ""

    # a session from the form: the policy's outputs pasted as JSON, slow enough to watch
    import json

    page.wait_for_selector("#policy option[value='preset:demo']", state="attached")
    harness.check_screen(page, "chat-home")
    page.fill("#ws-path", str(server.workspace))
    page.select_option("#policy", "scripted")
    page.fill("#outputs", json.dumps({"outputs": harness.fix_outputs(), "chunk_chars": 6, "delay_s": 0.02}))
    page.fill("#title", "fix the mean")
    page.click("form[aria-label='new session'] button[type=submit]")
    page.wait_for_url("**/#/chat/*")
    page.wait_for_selector(".conn[data-state='open']")
    session_id = page.url.rsplit("/", 1)[1]
    assert "fw_" not in page.url

    page.evaluate("""() => {
      window.__lens = [];
      new MutationObserver(() => {
        const el = document.querySelector('.msg.assistant .text');
        if (el && window.__lens[window.__lens.length - 1] !== el.textContent.length) window.__lens.push(el.textContent.length);
      }).observe(document.body, {subtree: true, childList: true, characterData: true});
    }""")
    send(page, "The tests fail. Fix stats.py.")

    # the command prints while the two reads are done: its card runs, with output so far and a live timer
    cmd = ".card[data-call-id='t1s1c2']"
    page.wait_for_selector(f"{cmd} .card-output.live")
    live = page.evaluate(f"""() => {{
      const c = document.querySelector("{cmd}");
      return {{cls: c.className, out: c.querySelector('.card-output.live').textContent,
               t: c.querySelector('.elapsed') && c.querySelector('.elapsed').textContent,
               siblings: c.parentElement.querySelectorAll('.card').length,
               parallel: c.parentElement.classList.contains('parallel')}};
    }}""")
    assert "status-running" in live["cls"] and "tick 1" in live["out"] and "tick 4" not in live["out"], live
    assert live["siblings"] == 3 and live["parallel"], live
    time.sleep(0.35)
    later = page.evaluate(f"() => document.querySelector(\"{cmd} .elapsed\")?.textContent")
    assert later and later != live["t"], (live["t"], later)  # the timer ticks while the command runs

    page.wait_for_selector(".turn-end.reason-completed", timeout=30_000)
    lens = page.evaluate("window.__lens")
    assert len(lens) >= 3 and lens == sorted(lens), lens  # the first text grew in several renders

    # three calls side by side, all done; the edit as a highlighted diff
    assert page.locator(".calls.parallel").first.locator(".card.status-ok").count() == 3
    diff = page.locator(".card[data-call-id='t1s2c0'] .d2h-file-wrapper")
    assert "len(v)" in diff.inner_text()
    assert diff.locator(".hljs-keyword").count() >= 1

    # what the model wrote is text, never markup
    final = page.locator(".msg.assistant .text").last.inner_text()
    assert final == harness.FIX_TEXT
    assert page.evaluate("window.__pwned") is None
    assert page.locator(".transcript img, .transcript script").count() == 0

    # the workspace panel: the changed file, the combined diff, the patch
    page.wait_for_selector(".workspace .files li:has-text('stats.py')")
    with page.expect_download() as dl:
        page.click("text=Download patch")
    patch = Path(dl.value.path()).read_text()
    assert "-    return sum(v) / (len(v) - 1)" in patch and "+    return sum(v) / len(v)" in patch

    harness.check_screen(page, "chat")

    events = server.events(session_id)
    assert [e["type"] for e in events].count("tool_call_started") == 4
    page.console.assert_clean("401 \\(Unauthorized\\)")  # the wrong token, refused at sign-in


def test_dropped_connection_mid_turn_loses_and_repeats_nothing(page: Any, server: harness.WebServer) -> None:
    proxy = harness.TcpProxy(server.proc.port)
    try:
        s = server.create_session(harness.fix_outputs("for i in 1 2 3 4 5 6; do echo tick $i; sleep 0.25; done"),
                                  chunk_chars=4, delay_s=0.02, title="reconnect")
        open_chat(page, proxy.url, server.user, s["id"])
        send(page, "Fix it.")
        page.wait_for_selector(".card[data-call-id='t1s1c2'].status-running")
        proxy.cut()  # the server's socket goes away mid-turn
        page.wait_for_selector(".conn[data-state='reconnecting']")
        assert "reconnecting from event" in page.inner_text(".conn")
        time.sleep(1.0)  # the turn goes on without the browser
        proxy.restore()
        page.wait_for_selector(".conn[data-state='open']", timeout=20_000)
        page.wait_for_selector(".turn-end.reason-completed", timeout=30_000)

        events = server.events(s["id"])
        texts: dict[int, str] = {}
        for e in events:
            if e["type"] == "assistant_delta":
                texts[e["step"]] = texts.get(e["step"], "") + e["text"]
        shown = page.locator(".msg.assistant .text").all_inner_texts()
        assert shown == [t.strip() for t in texts.values() if t.strip()]  # every delta once, in order
        started = [e["call_id"] for e in events if e["type"] == "tool_call_started"]
        cards = page.locator(".transcript .card").evaluate_all("cs => cs.map(c => c.dataset.callId)")
        assert cards == started
        result = next(e for e in events if e["type"] == "tool_result" and e["call_id"] == "t1s1c2")
        assert page.locator(".card[data-call-id='t1s1c2'] .card-output").inner_text().rstrip() == result["output"].rstrip()
        assert proxy.cuts == 1
        page.console.assert_clean(*RECONNECT_NOISE)
    finally:
        proxy.close()


def test_interrupt_a_running_command(page: Any, server: harness.WebServer) -> None:
    from agent.parser import encode_call

    s = server.create_session(["Running the long suite.\n\n" + encode_call("run_command", {"command": "sleep 30"})],
                              title="interrupt")
    open_chat(page, server.url, server.user, s["id"])
    send(page, "Run the slow tests.")
    page.wait_for_selector(".card.status-running")
    page.click("button:has-text('Interrupt')")
    page.wait_for_selector(".turn-end.reason-interrupted", timeout=15_000)
    assert page.locator(".card.status-cancelled").count() == 1
    assert page.locator(".composer button:has-text('Send')").count() == 1
    page.console.assert_clean()


def test_approval_prompt_allows_a_command(page: Any, server: harness.WebServer) -> None:
    from agent.parser import encode_call

    s = server.create_session(["Checking.\n\n" + encode_call("run_command", {"command": "echo approved-run"}), "Ran it."],
                              approval_mode="ask-commands", title="approval")
    open_chat(page, server.url, server.user, s["id"])
    send(page, "Run a check.")
    page.wait_for_selector(".card.status-approval .approval")
    assert page.locator(".card.status-approval .card-time .elapsed").count() == 1
    harness.screenshot(page, "approval")
    page.focus(".approval input")  # keyboard only: the reason field, Tab to Allow, Enter
    page.keyboard.type("fine")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Allow"
    page.keyboard.press("Enter")
    page.wait_for_selector(".turn-end.reason-completed")
    card = page.locator(".card[data-call-id='t1s1c0']")
    assert "approved-run" in card.inner_text() and "allowed by user: fine" in card.inner_text()
    page.console.assert_clean()
