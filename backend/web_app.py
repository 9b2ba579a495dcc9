"""The browser app (``web/``, built by Vite into ``web/dist``) served by the API server at ``/``.

* ``GET /``: the app's ``index.html`` (``Cache-Control: no-cache``: a rebuilt app is picked up at
  the next load). Without a build, a plain HTML page (503) that says how to build it.
* ``GET /assets/...``: the built, content-hashed scripts and styles (cached for a year).
* ``GET /favicon.svg``: the icon (the page names it, so browsers do not ask for ``/favicon.ico``).

The app is a static client of the documented API (``docs/protocol.md``): it holds no secrets and
the server gives it nothing it would not give any client. Its routes are hash routes (``#/chat/ID``),
so nothing else needs serving. Not guaranteed: a build made while the server runs is served (the
files are looked up per request), but a build that removes old asset files breaks tabs still
running the old one until they reload.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

NOT_BUILT = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Flywheel: the web app is not built</title></head>
<body><main>
<h1>The Flywheel web app is not built</h1>
<p>The API is running (<a href="/docs">API docs</a>), but <code>{dist}</code> holds no build.</p>
<p>Build it with <code>scripts/setup.sh</code> (it needs Node.js 18 or newer and npm), or by hand:
<code>cd web &amp;&amp; npm ci &amp;&amp; npm run build</code>. Then reload this page.</p>
</main></body></html>
"""


def is_built(dist: Path) -> bool:
    """Whether ``dist`` holds a build (its ``index.html``)."""
    return (dist / "index.html").is_file()


class _Assets(StaticFiles):
    """StaticFiles that answers 404 (not a 500) while the build is missing, and lets browsers keep
    the content-hashed files for a year."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not Path(str(self.directory)).is_dir():
            await Response("the web app is not built", status_code=404, media_type="text/plain")(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def file_response(self, *args, **kwargs) -> Response:  # type: ignore[no-untyped-def]
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = "public, max-age=31536000, immutable"
        return response


def mount_web_app(app: FastAPI, dist: Path) -> None:
    """Serve the built app from ``dist`` at ``/`` (see the module docstring)."""

    @app.get("/", include_in_schema=False)
    async def web_index() -> Response:
        index = dist / "index.html"
        if index.is_file():
            return FileResponse(index, media_type="text/html", headers={"Cache-Control": "no-cache"})
        return HTMLResponse(NOT_BUILT.format(dist=dist), status_code=503, headers={"Cache-Control": "no-cache"})

    @app.get("/favicon.svg", include_in_schema=False)
    async def web_icon() -> Response:
        icon = dist / "favicon.svg"
        if icon.is_file():
            return FileResponse(icon, media_type="image/svg+xml")
        return Response(status_code=404)

    app.mount("/assets", _Assets(directory=dist / "assets", check_dir=False), name="web-assets")
