"""The per-session WebSocket: user messages and interrupts in, events out.

Authentication happens before the socket is accepted: a bearer token in the
``Authorization`` header, or (for browsers, which cannot set headers) the
subprotocol ``flywheel.token.<TOKEN>``. A browser's ``Origin`` must match the
allowed origins; clients that send no Origin (editor plugins, the terminal
client) are not browsers and are judged by their token alone.

Refused handshakes get an HTTP response: 401 no/invalid token, 403 other
user's session or bad origin, 404 no such session (servers without the
denial-response extension close with 4401/4403/4404 instead). After accept:
close code 4408 means the client fell too far behind (reconnect with
``?after=<last seq>``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import anyio
import anyio.abc

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketState

from agent.events import event_to_json
from backend.api.deps import AppState, can_access
from backend.hub import HubError, SlowClient

router = APIRouter()
log = logging.getLogger(__name__)
TOKEN_PROTOCOL = "flywheel.token."


def origin_allowed(origin: str, allowed: list[str]) -> bool:
    o = urlsplit(origin)
    for a in allowed:
        p = urlsplit(a)
        if o.scheme == p.scheme and o.hostname == p.hostname and (p.port is None or p.port == o.port):
            return True
    return False


async def _deny(ws: WebSocket, status: int, reason: str) -> None:
    """Refuse the handshake: an HTTP status where the server supports denial
    responses (uvicorn does), else a close with code 4000 + status."""
    try:
        await ws.send_denial_response(JSONResponse({"detail": reason}, status_code=status))
    except RuntimeError:
        await ws.close(code=4000 + status, reason=reason)


def _token(ws: WebSocket) -> tuple[str | None, str | None]:
    auth = ws.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip(), None
    for proto in ws.scope.get("subprotocols", []):
        if proto.startswith(TOKEN_PROTOCOL):
            return proto[len(TOKEN_PROTOCOL):], proto
    return None, None


@router.websocket("/v1/sessions/{session_id}/ws")
async def session_socket(ws: WebSocket, session_id: str, after: int = 0) -> None:
    state: AppState = ws.app.state.flywheel
    origin = ws.headers.get("origin")
    if origin is not None and not origin_allowed(origin, state.settings.allowed_origins):
        return await _deny(ws, 403, "origin not allowed")
    token, proto = _token(ws)
    user = await asyncio.to_thread(state.log.verify_token, token) if token else None
    if user is None:
        return await _deny(ws, 401, "missing or invalid token")
    info = await asyncio.to_thread(state.log.get_session, session_id)
    if info is None:
        return await _deny(ws, 404, "no such session")
    if not can_access(user, info):
        return await _deny(ws, 403, "this session belongs to another user")
    await ws.accept(subprotocol=proto)
    send_lock = asyncio.Lock()

    async def send(text: str) -> None:
        async with send_lock:
            await ws.send_text(text)

    async def pump_events() -> None:
        try:
            async for event in state.hub.stream(info, max(0, after)):
                await send(event_to_json(event))
        except SlowClient as exc:
            await ws.close(code=4408, reason=str(exc)[:120])

    async def read_commands() -> None:
        while True:
            raw = await ws.receive_text()
            try:
                msg = json.loads(raw)
                kind = msg.get("type") if isinstance(msg, dict) else None
            except json.JSONDecodeError:
                kind, msg = None, {}
            current = await asyncio.to_thread(state.log.get_session, session_id)
            try:
                if kind == "user_message" and isinstance(msg.get("text"), str) and msg["text"]:
                    await state.hub.send(current or info, msg["text"])
                elif kind == "interrupt":
                    asyncio.create_task(state.hub.interrupt(current or info))
                else:
                    raise HubError(400, 'expected {"type": "user_message", "text": "..."} or {"type": "interrupt"}')
            except HubError as exc:
                await send(json.dumps({"type": "request_error", "status": exc.status, "message": str(exc)}))

    async def until_done(part: Callable[[], Awaitable[None]], group: anyio.abc.TaskGroup) -> None:
        try:
            await part()
        except WebSocketDisconnect:
            pass
        except Exception as exc:  # logged; the socket closes below
            log.warning("websocket %s: %r", session_id, exc)
        finally:
            group.cancel_scope.cancel()  # either side ending ends the connection

    # anyio (as Starlette uses) so cancellation by the server is handled right.
    async with anyio.create_task_group() as group:
        group.start_soon(until_done, pump_events, group)
        group.start_soon(until_done, read_commands, group)
    if ws.application_state is WebSocketState.CONNECTED and ws.client_state is WebSocketState.CONNECTED:
        with contextlib.suppress(RuntimeError):
            await ws.close()
