"""``flywheel acp --server URL --token T``: a thin bridge to a running ``flywheel serve``.

Sessions live on the server (its hub, log, workspaces and sandbox); this
process only translates. It creates sessions with ``POST /v1/sessions`` on
the editor's directory (which must be under one of the server's
``--allow-root`` directories), starts and interrupts turns over REST, and
reads events and answers approvals over the session's WebSocket
(``docs/protocol.md``), reconnecting with ``?after=<last seq>`` when the
connection drops (nothing is lost or repeated).

Not guaranteed: the editor's ``mcpServers`` are not connected (the server's own
``--mcp-config`` servers are what its sessions get), and the mode is not stored with
the session (a loaded session starts in ``--mode``); the server's workspace is its own copy, so edits stay there
(they show as diffs in the editor; ``flywheel chat --session ID`` or
``flywheel sessions diff ID | git apply`` brings them back); the editor's
unsaved buffers are not seen; after 5 failed reconnects in a row the
stream ends with an error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from agent.events import Event, event_from_json_or_none
from backend.acp.mcp_servers import server_configs
from backend.acp.sessions import EditorLink, NewSession, Opened, SessionError

log = logging.getLogger(__name__)
RECONNECTS = 5
NOT_ON_SERVER = ("not connected: sessions run on the server (--server), which does not start an editor's MCP "
                 "servers; give them to `flywheel serve --mcp-config` there")


def _not_connected(servers: list[Any]) -> tuple[list[dict[str, Any]], list[str]]:
    configs, refused = server_configs(servers)
    described = [{**{k: v for k, v in c.describe().items() if k != "writes_workspace"}, "connected": False,
                  "error": NOT_ON_SERVER} for c in configs] + refused
    return described, [f"MCP server {d['name']!r} is {d['error']}" if d["error"] == NOT_ON_SERVER
                       else f"MCP server {d['name']!r} is not connected: {d['error']}" for d in described]


class RemoteSessions:
    """:class:`backend.acp.sessions.SessionBackend` over a server's REST API and WebSocket."""

    edits_reach_editor = False

    def __init__(self, url: str, token: str, policy: dict[str, Any]) -> None:
        self.url = url.rstrip("/")
        self.policy = policy
        self._headers = {"Authorization": f"Bearer {token}"}
        self._http = httpx.AsyncClient(base_url=self.url, headers=self._headers, timeout=30.0)
        self._sockets: dict[str, ClientConnection] = {}

    async def start(self) -> None:
        """Check that the server answers and takes the token."""
        await self._request("GET", "/v1/sessions", params={"limit": 1})

    def edit_texts(self, session_id: str) -> None:
        return None

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            r = await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise SessionError(f"cannot reach the server at {self.url}: {exc}") from None
        if r.status_code >= 400:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text
            kind = {404: "not_found", 409: "conflict"}.get(r.status_code, "invalid")
            raise SessionError(f"the server refused ({r.status_code}): {detail}", kind)
        return r.json() if r.content else None

    async def create(self, new: NewSession, link: EditorLink | None) -> Opened:
        body = {"workspace": {"path": str(new.cwd)}, "policy": self.policy, "title": new.title,
                "approval_mode": "ask-edits"}
        info = await self._request("POST", "/v1/sessions", json=body)
        servers, notices = _not_connected(new.mcp_servers)
        return Opened(str(info["id"]), int(info.get("last_seq", 0)), None, servers, notices)

    async def open(self, session_id: str, cwd: Path, link: EditorLink | None,
                   mcp_servers: list[Any] | None = None) -> Opened:
        info = await self._request("GET", f"/v1/sessions/{session_id}")
        servers, notices = _not_connected(mcp_servers or [])
        return Opened(session_id, int(info["last_seq"]), None, servers, notices)

    async def set_mode(self, session_id: str, mode: str) -> None:
        return None  # the server keeps no ACP mode; this process remembers it while it holds the session

    async def stream(self, session_id: str, after: int) -> AsyncIterator[Event]:
        ws_url = self.url.replace("http", "ws", 1) + f"/v1/sessions/{session_id}/ws"
        last, failures = after, 0
        while True:
            try:
                async with connect(f"{ws_url}?after={last}", additional_headers=self._headers,
                                   max_size=None, ping_interval=None) as ws:
                    self._sockets[session_id] = ws
                    failures = 0
                    async for raw in ws:
                        event = event_from_json_or_none(raw)
                        if event is None or event.seq <= last:
                            continue  # a request_error, or a type this version does not know
                        last = event.seq
                        yield event
                return  # the server closed normally
            except (ConnectionClosed, OSError, InvalidHandshake) as exc:
                if isinstance(exc, InvalidStatus) and exc.response.status_code in (401, 403, 404, 410):
                    raise SessionError(f"the server refused the session's stream ({exc.response.status_code})")
                failures += 1
                if failures > RECONNECTS:
                    raise SessionError(f"lost the connection to {self.url}: {exc}") from None
                log.warning("session %s: connection lost (%s); reconnecting after seq %d", session_id, exc, last)
                await asyncio.sleep(0.2 * failures)
            finally:
                self._sockets.pop(session_id, None)

    async def send(self, session_id: str, text: str) -> None:
        await self._request("POST", f"/v1/sessions/{session_id}/messages", json={"text": text})

    async def interrupt(self, session_id: str) -> None:
        await self._request("POST", f"/v1/sessions/{session_id}/interrupt")

    async def answer(self, session_id: str, call_id: str, *, approved: bool, reason: str) -> None:
        import json

        ws = self._sockets.get(session_id)
        if ws is None:
            raise SessionError("not connected to the session's stream", "conflict")
        await ws.send(json.dumps({"type": "approval", "call_id": call_id, "approved": approved,
                                  "reason": reason[:2000]}))

    async def release(self, session_id: str) -> None:
        ws = self._sockets.pop(session_id, None)
        if ws is not None:
            await ws.close()

    async def close(self) -> None:
        for sid in list(self._sockets):
            await self.release(sid)
        await self._http.aclose()
