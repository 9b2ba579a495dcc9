"""What the browser app must never do: put the token in a URL, run what a user or model wrote, or
need anything the server's Content-Security-Policy forbids (every browser test runs under it)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.web import harness


def test_token_never_in_a_url_and_nothing_inline(page: Any, server: harness.WebServer) -> None:
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    page.on("websocket", lambda ws: urls.append(ws.url))
    page.goto(f"{server.url}/")
    page.wait_for_selector("#token")
    harness.screenshot(page, "sign-in")
    page.fill("#token", server.user)
    page.click("form[aria-label='sign in'] button[type=submit]")
    page.wait_for_selector("nav.top")
    s = server.create_session(["Echo: <img src=x onerror=\"window.__pwned=1\"><script>window.__pwned=2</script>"])
    page.goto(f"{server.url}/#/chat/{s['id']}")
    page.wait_for_selector(".conn[data-state='open']")
    page.fill("#prompt", "<b>bold?</b><script>window.__pwned=3</script>")
    page.keyboard.press("Enter")
    page.wait_for_selector(".turn-end.reason-completed")
    assert page.inner_text(".msg.user .text") == "<b>bold?</b><script>window.__pwned=3</script>"
    assert page.evaluate("window.__pwned") is None
    assert page.locator(".transcript b, .transcript img, .transcript script").count() == 0
    assert any("/ws?after=" in u for u in urls)
    leaked = [u for u in urls if server.user in u or "token" in u.lower()]
    assert not leaked, leaked

    index = httpx.get(f"{server.url}/")
    assert "script-src 'self'" in index.headers["content-security-policy"]
    assert "<script>" not in index.text and "<script type=\"module\" crossorigin src=" in index.text
    page.console.assert_clean()


def test_a_revoked_token_signs_the_tab_out(page: Any, server: harness.WebServer) -> None:
    import subprocess
    import sys

    token = server.log.create_token("carol", "user")
    harness.sign_in(page, server.url, token)
    r = subprocess.run([sys.executable, "-m", "backend.cli", "token", "revoke", "carol", "--db", server.db_url],
                       cwd=harness.REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    page.click("nav.top a:has-text('Sessions')")  # the next request is refused
    page.wait_for_selector(".signin .error")
    assert "no longer accepts your token" in page.inner_text(".signin .error")
    assert page.evaluate("sessionStorage.getItem('flywheel.token')") is None
    page.console.assert_clean(r"status of 401 \(Unauthorized\)")
