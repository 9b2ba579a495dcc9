"""backend/api/security.py and the WebSocket's origin rule: headers on every response, no credentials
in URLs or logs, foreign origins refused."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.staticfiles import StaticFiles
from starlette.testclient import WebSocketDenialResponse

from backend.api.security import APP_CSP, DOCS_CSP, RedactTokens, redact
from backend.server_process import ServerProcess
from tests.backend.conftest import Api, make_api
from tests.backend.test_contracts import assert_error


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with make_api(f"sqlite:///{tmp_path / 'fw.db'}", tmp_path, semantic_search=False) as a:
        yield a


def test_the_app_policy_allows_no_inline_script_and_nothing_from_elsewhere() -> None:
    directives = dict(d.strip().split(" ", 1) for d in APP_CSP.split(";"))
    assert directives["script-src"] == "'self'" and directives["default-src"] == "'self'"
    assert directives["object-src"] == "'none'" and directives["frame-ancestors"] == "'none'"
    assert "unsafe" not in APP_CSP and "http" not in APP_CSP


def test_every_response_carries_the_headers(api: Api, tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<!doctype html><title>x</title><script src='/app.js'></script>")
    api.client.app.mount("/static-test", StaticFiles(directory=site, html=True))  # type: ignore[attr-defined]
    h = api.h("alice")
    for path, headers in [("/health", {}), ("/v1/me", h), ("/openapi.json", {}), ("/nothing", {}),
                          ("/static-test/", {}), ("/v1/sessions", {})]:
        r = api.client.get(path, headers=headers)
        assert r.headers["content-security-policy"] == APP_CSP, path
        assert r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "no-referrer"
        assert r.headers["x-frame-options"] == "DENY"
    assert api.client.get("/static-test/").headers["content-type"].startswith("text/html")
    assert api.client.get("/v1/me", headers=h).headers["cache-control"] == "no-store"
    assert "cache-control" not in api.client.get("/health").headers
    for path in ("/docs", "/redoc"):  # FastAPI's pages, with their CDN assets
        assert api.client.get(path).headers["content-security-policy"] == DOCS_CSP


def test_me_names_the_caller(api: Api) -> None:
    assert api.client.get("/v1/me", headers=api.h("alice")).json() == {"name": "alice", "role": "user",
                                                                       "is_staff": False}
    assert api.client.get("/v1/me", headers=api.h("sue")).json()["is_staff"] is True
    assert_error(api.client.get("/v1/me"), 401, "unauthorized")


@pytest.mark.parametrize("param", ["token", "access_token", "API_KEY"])
def test_a_credential_in_the_query_string_is_refused(api: Api, param: str) -> None:
    token = api.tokens["alice"]
    r = api.client.get(f"/v1/me?{param}={token}", headers=api.h("alice"))
    body = assert_error(r, 400, "token_in_url")
    assert token not in r.text and "Authorization" in body["detail"]
    s = api.create("alice")
    with pytest.raises(WebSocketDenialResponse) as denied:
        with api.client.websocket_connect(f"/v1/sessions/{s['id']}/ws?{param}={token}", headers=api.h("alice")):
            pass
    assert denied.value.status_code == 400
    assert api.client.get("/v1/me?q=token", headers=api.h("alice")).status_code == 200  # only names count


def status_of_socket(api: Api, sid: str, headers: dict[str, str]) -> int:
    try:
        with api.client.websocket_connect(f"/v1/sessions/{sid}/ws", headers=headers) as ws:
            ws.close()
            return 101
    except WebSocketDenialResponse as exc:
        return exc.status_code


def test_the_websocket_refuses_foreign_origins(api: Api) -> None:
    sid = api.create("alice")["id"]
    h = api.h("alice")
    assert status_of_socket(api, sid, h) == 101  # no Origin: not a browser, the token decides
    assert status_of_socket(api, sid, {**h, "Origin": "http://testserver"}) == 101  # the server's own page
    assert status_of_socket(api, sid, {**h, "Origin": "http://localhost:5173"}) == 101  # an allowed origin
    for foreign in ("https://evil.example", "http://testserver.evil.example", "https://testserver",
                    "http://testserver:8080", "null", "http://testserver:notaport", "file://"):
        assert status_of_socket(api, sid, {**h, "Origin": foreign}) == 403, foreign
    with pytest.raises(WebSocketDenialResponse) as denied:
        with api.client.websocket_connect(f"/v1/sessions/{sid}/ws", headers={**h, "Origin": "https://evil.example"}):
            pass
    assert denied.value.json()["code"] == "forbidden"  # the one error shape, also for handshakes


def test_redaction_hides_tokens_and_credential_values() -> None:
    token = "fw_" + "A1b2-_" * 7
    assert redact(f"GET /v1/me?token={token} 400") == "GET /v1/me?token=[redacted] 400"
    assert redact(f"bearer {token} seen") == "bearer [redacted] seen"
    assert redact("GET /v1/me?access_token=abc&q=1") == "GET /v1/me?access_token=[redacted]&q=1"
    assert redact("nothing to hide fw_short") == "nothing to hide fw_short"
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "%s - %s", ("GET", f"/x?api_key={token}"), None)
    assert RedactTokens().filter(record) and record.getMessage() == "GET - /x?api_key=[redacted]"


def test_a_real_server_logs_no_token(tmp_path: Path) -> None:
    """``flywheel serve`` with its access log on: a token sent in a URL is refused and never written to the logs."""
    with ServerProcess(data_dir=tmp_path / "data", extra_args=["--log-level", "info"]) as srv:
        token = srv.token
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            assert c.get("/v1/me", headers={"Authorization": f"Bearer {token}"}).status_code == 200
            assert c.get(f"/v1/me?token={token}").status_code == 400
            assert c.get(f"/v1/sessions?access_token={token}&limit=1").status_code == 400
    out = srv.stdout_path.read_text()
    startup, _, access = out.partition("database: ")  # serve prints its first staff token once, for its operator
    assert token in startup and "/v1/me?token=[redacted]" in access  # the access log saw the request
    for logged in (access, srv.stderr_path.read_text()):
        assert token not in logged, logged[-2000:]
