"""backend/web_app.py: the built browser app served at /, a clear page when it is not built, and
nothing of the API shadowed by it."""

from __future__ import annotations

from pathlib import Path

import httpx

from backend.server_process import ServerProcess
from tests.backend.conftest import make_api


def build(root: Path) -> Path:
    dist = root / "dist"
    (dist / "assets").mkdir(parents=True)
    (dist / "index.html").write_text('<!doctype html><script type="module" src="/assets/app-1a2b.js"></script>')
    (dist / "assets" / "app-1a2b.js").write_text("console.log('app')\n")
    (dist / "favicon.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
    (root / "secret.txt").write_text("not for the web")
    return dist


def test_serves_the_build(tmp_path: Path) -> None:
    dist = build(tmp_path / "web")
    with make_api(f"sqlite:///{tmp_path / 'fw.db'}", tmp_path, semantic_search=False, web_dist=dist) as api:
        c = api.client
        r = c.get("/")
        assert r.status_code == 200 and r.text.startswith("<!doctype html>")
        assert r.headers["content-type"].startswith("text/html") and r.headers["cache-control"] == "no-cache"
        assert "script-src 'self'" in r.headers["content-security-policy"]
        r = c.get("/assets/app-1a2b.js")
        assert r.status_code == 200 and "immutable" in r.headers["cache-control"]
        assert c.get("/favicon.svg").headers["content-type"].startswith("image/svg")
        assert c.get("/assets/nope.js").status_code == 404
        assert c.get("/assets/..%2f..%2fsecret.txt").status_code == 404
        assert "not for the web" not in c.get("/assets/../../secret.txt").text
        # the API is not shadowed: unknown API routes keep the JSON error shape, the app needs no token
        r = c.get("/v1/nope", headers=api.h("alice"))
        assert r.status_code == 404 and r.json()["code"] == "not_found"
        assert c.get("/v1/me").status_code == 401


def test_missing_build_is_a_clear_page_not_an_error(tmp_path: Path) -> None:
    with make_api(f"sqlite:///{tmp_path / 'fw.db'}", tmp_path, semantic_search=False,
                  web_dist=tmp_path / "nowhere") as api:
        r = api.client.get("/")
        assert r.status_code == 503 and "not built" in r.text and "npm ci" in r.text
        assert "<script" not in r.text
        r = api.client.get("/assets/app.js")
        assert r.status_code == 404 and "not built" in r.text
        assert api.client.get("/favicon.svg").status_code == 404


def test_serve_says_where_the_app_is(tmp_path: Path) -> None:
    dist = build(tmp_path / "web")
    for web_dist, expect in ((dist, "web app: http://127.0.0.1:"), (tmp_path / "nowhere", "web app: not built")):
        env = {"FLYWHEEL_WEB_DIST": str(web_dist), "FLYWHEEL_SEMANTIC_SEARCH": "0"}
        with ServerProcess(data_dir=tmp_path / "data", env=env, log_dir=tmp_path / f"logs-{expect[9:12]}") as srv:
            out = srv.stdout_path.read_text()
            assert expect in out, out
            assert httpx.get(f"{srv.url}/").status_code == (200 if web_dist == dist else 503)
