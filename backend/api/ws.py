"""The per-session WebSocket: user messages, interrupts and approval answers in, events out.

Authentication happens before the socket is accepted: a bearer token in the
``Authorization`` header, or (for browsers, which cannot set headers) the
subprotocol ``flywheel.token.<TOKEN>``. A browser's ``Origin`` must be the
server's own (same scheme, host and port as the handshake's ``Host``: the app
this server serves) or match the allowed origins; clients that send no Origin
(editor plugins, the terminal client) are not browsers and are judged by their
token alone. A token in the query string is refused (400): URLs end up in logs.

Refused handshakes get an HTTP response: 400 ``after`` out of range, 401
no/invalid token, 403 other user's session or bad origin, 404 no such
session, 410 the session's workspace is gone, 429 the token already holds
``max_sockets_per_token`` sockets (servers without the denial-response
extension close with 4000 + that status instead).

After accept the server closes with one of the codes in :data:`CLOSE_CODES`
(``docs/protocol.md`` lists them): 4408 the client fell too far behind (its
queue overflowed, or one send blocked for ``send_stall_s``; reconnect with
``?after=<last seq>``), 1009 a message over :data:`MAX_MESSAGE_BYTES`, 1003 a
binary message, 1001 the server is shutting down, 4410 the workspace went
away, 1011 an internal error. 1000 is used only when the client closed first.

Each event is sent as the JSON line the log stores (``backend.db.log.StoredEvent``),
encoded once when it was committed: every subscriber of a session gets the same
text. Messages are not compressed (the server offers no permessage-deflate:
events are small, and compressing each one cost more CPU than it saved).

Not guaranteed: the close reaches a client that has stopped reading. TCP
delivers it after everything already buffered for that client, so a client
that reads nothing sees the connection end only when the server's keepalive
gives up (uvicorn: about 20 s after an unanswered ping). A client that pings
(the ``websockets`` library does by default) may time its own ping out behind
a deep backlog and report 1006 on its side; clients that read slowly should
ping less eagerly. A blocked send is noticed up to a tenth of
``send_stall_s`` late (one timer per socket, not one per send). The
message-size limit is checked here, after the server has read the message:
the ASGI server's own limit (uvicorn ``ws_max_size``, which the CLI sets to
:data:`MAX_MESSAGE_BYTES`) is what bounds memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.abc

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketState

from backend.api.deps import AppState, can_access
from backend.errors import code_for_status, error_body
from backend.api.security import credential_params, token_in_url_detail
from backend.hub import HubError, SlowClient

router = APIRouter()
log = logging.getLogger(__name__)
TOKEN_PROTOCOL = "flywheel.token."

MAX_MESSAGE_BYTES = 1 << 20
"""The largest message a client may send (UTF-8 bytes); larger ones close the socket with 1009."""
MAX_AFTER = (1 << 63) - 1
"""The largest ``after`` the log can compare against (a signed 64-bit integer)."""

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED = 1003
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011
CLOSE_SLOW = 4408
CLOSE_GONE = 4410
CLOSE_CODES: dict[int, str] = {
    CLOSE_NORMAL: "the client closed the connection",
    CLOSE_GOING_AWAY: "the server is shutting down; reconnect with ?after=<last seq>",
    CLOSE_UNSUPPORTED: "a binary message: send JSON text",
    CLOSE_TOO_BIG: f"a message larger than {MAX_MESSAGE_BYTES} bytes",
    CLOSE_INTERNAL: "an internal error",
    CLOSE_SLOW: "the client fell too far behind; reconnect with ?after=<last seq>",
    CLOSE_GONE: "the session's workspace is gone",
}
"""Every close code the server sends after accepting a socket, and what it means."""

_USAGE = ('expected {"type": "user_message", "text": "..."}, {"type": "interrupt"} or '
          '{"type": "approval", "call_id": "...", "approved": true|false, "reason"?: "..."}')


def same_origin(origin: str, ws: WebSocket) -> bool:
    """Whether ``origin`` is the server's own (the page was served by this server): same host
    and port as the handshake's ``Host``, and ``http``/``https`` for ``ws``/``wss``."""
    o = urlsplit(origin)
    scheme = {"ws": "http", "wss": "https"}.get(ws.url.scheme, ws.url.scheme)
    default = {"http": 80, "https": 443}
    try:
        o_port = o.port or default.get(o.scheme)
    except ValueError:
        return False
    return (o.scheme == scheme and o.hostname is not None and o.hostname == ws.url.hostname
            and o_port == (ws.url.port or default.get(scheme)))


def origin_allowed(origin: str, allowed: list[str]) -> bool:
    """Whether ``origin`` matches one of ``allowed`` (scheme and host; any port when the allowed
    origin names none)."""
    try:
        o = urlsplit(origin)
        o.port  # noqa: B018 -- a malformed port raises here
    except ValueError:
        return False
    for a in allowed:
        p = urlsplit(a)
        if o.scheme == p.scheme and o.hostname == p.hostname and (p.port is None or p.port == o.port):
            return True
    return False


async def _deny(ws: WebSocket, status: int, reason: str) -> None:
    """Refuse the handshake: an HTTP status where the server supports denial
    responses (uvicorn does), else a close with code 4000 + status."""
    try:
        body = error_body(reason, code_for_status(status))
        await ws.send_denial_response(JSONResponse(body, status_code=status))
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


def _reason(text: str) -> str:
    """A close reason within the protocol's 123 bytes."""
    raw = text.encode("utf-8")
    if len(raw) <= 123:
        return text
    return raw[:120].decode("utf-8", "ignore") + "..."


class _Closing(Exception):
    """Ends the connection with ``code`` (raised by either side of the socket)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _too_big(text: str) -> bool:
    return len(text) * 4 > MAX_MESSAGE_BYTES and len(text.encode("utf-8", "surrogatepass")) > MAX_MESSAGE_BYTES


@router.websocket("/v1/sessions/{session_id}/ws")
async def session_socket(ws: WebSocket, session_id: str, after: int = 0) -> None:
    state: AppState = ws.app.state.flywheel
    hub = state.hub
    origin = ws.headers.get("origin")
    if origin is not None and not (same_origin(origin, ws) or origin_allowed(origin, state.settings.allowed_origins)):
        return await _deny(ws, 403, "origin not allowed")
    refused = credential_params(ws.scope.get("query_string", b""))
    if refused:
        return await _deny(ws, 400, token_in_url_detail(refused))
    token, proto = _token(ws)
    user = await asyncio.to_thread(state.log.verify_token, token) if token else None
    if user is None:
        return await _deny(ws, 401, "missing or invalid token")
    if not 0 <= after <= MAX_AFTER:
        return await _deny(ws, 400, f"after must be between 0 and {MAX_AFTER}")
    info = await asyncio.to_thread(state.log.get_session, session_id)
    if info is None:
        return await _deny(ws, 404, "no such session")
    if not can_access(user, info):
        return await _deny(ws, 403, "this session belongs to another user")
    if not hub.sockets.acquire(user.name):
        return await _deny(ws, 429, f"this token already has {hub.sockets.per_token} WebSockets open; "
                                    "close one first")
    try:
        try:
            await hub.get_live(info)  # a session whose workspace is gone is refused here, not after accept
        except HubError as exc:
            return await _deny(ws, exc.status, str(exc))
        await ws.accept(subprotocol=proto)
        await _serve(ws, state, info, after)
    finally:
        hub.sockets.release(user.name)


async def _serve(ws: WebSocket, state: AppState, info: Any, after: int) -> None:
    hub = state.hub
    session_id = info.id
    send_lock = asyncio.Lock()
    sent = after  # the last seq this client was sent in full
    sending_since: float | None = None  # loop time the send in progress began
    loop = asyncio.get_running_loop()
    background: set[asyncio.Task[Any]] = set()
    ending: list[_Closing] = []

    async def send(text: str) -> None:
        nonlocal sending_since
        async with send_lock:
            sending_since = loop.time()
            try:
                await ws.send_text(text)
            finally:
                sending_since = None

    async def pump_events() -> None:
        nonlocal sent
        try:
            # the JSON line the log holds, encoded once for every subscriber
            async for event in hub.stream_stored(info, after):
                await send(event.json)
                sent = event.seq
        except SlowClient:
            raise _Closing(CLOSE_SLOW, f"client fell too far behind; reconnect with after={sent}") from None
        except HubError as exc:
            raise _Closing(CLOSE_GONE if exc.status == 410 else CLOSE_INTERNAL, str(exc)) from None
        raise _Closing(CLOSE_GOING_AWAY, f"the server is shutting down; reconnect with after={sent}")

    async def watch_sends() -> None:
        # One timer per socket instead of one per send: a send blocked for send_stall_s
        # (noticed within a tenth of it) ends the connection as too slow.
        stall = hub.send_stall_s
        while True:
            await asyncio.sleep(stall / 10)
            since = sending_since
            if since is not None and loop.time() - since >= stall:
                raise _Closing(CLOSE_SLOW, f"client fell too far behind; reconnect with after={sent}")

    async def handle(msg: Any) -> None:
        kind = msg.get("type") if isinstance(msg, dict) else None
        # A live session's hub state is current (a cancel marks it); otherwise read the log.
        live = hub.live.get(session_id)
        current = live.info if live is not None else await asyncio.to_thread(state.log.get_session, session_id) or info
        if kind == "user_message" and isinstance(msg.get("text"), str) and msg["text"]:
            await hub.send(current, msg["text"])
        elif kind == "interrupt":
            task = asyncio.create_task(hub.interrupt(current))
            background.add(task)
            task.add_done_callback(background.discard)
        elif (kind == "approval" and isinstance(msg.get("call_id"), str) and isinstance(msg.get("approved"), bool)
              and isinstance(msg.get("reason", ""), str)):
            await hub.answer_approval(current, msg["call_id"], approved=msg["approved"], reason=msg.get("reason", ""))
        else:
            raise HubError(400, _USAGE)

    async def read_commands() -> None:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", CLOSE_NORMAL))
            raw = message.get("text")
            if raw is None:
                raise _Closing(CLOSE_UNSUPPORTED, "binary messages are not supported; send JSON text")
            if _too_big(raw):
                raise _Closing(CLOSE_TOO_BIG, f"message larger than {MAX_MESSAGE_BYTES} bytes")
            try:
                msg = json.loads(raw)
            except json.JSONDecodeError:
                msg = None
            try:
                await handle(msg)
            except HubError as exc:
                await send(json.dumps({"type": "request_error", "status": exc.status, "message": str(exc)}))

    async def until_done(part: Callable[[], Awaitable[None]], group: anyio.abc.TaskGroup) -> None:
        try:
            await part()
        except WebSocketDisconnect:
            pass
        except _Closing as exc:
            ending.append(exc)
        except Exception as exc:  # logged; the socket closes with 1011 below
            log.warning("websocket %s: %r", session_id, exc)
            ending.append(_Closing(CLOSE_INTERNAL, "internal error"))
        finally:
            group.cancel_scope.cancel()  # either side ending ends the connection

    # anyio (as Starlette uses) so cancellation by the server is handled right.
    async with anyio.create_task_group() as group:
        group.start_soon(until_done, pump_events, group)
        group.start_soon(until_done, read_commands, group)
        group.start_soon(until_done, watch_sends, group)
    if ws.application_state is WebSocketState.CONNECTED and ws.client_state is WebSocketState.CONNECTED:
        end = ending[0] if ending else _Closing(CLOSE_NORMAL, "")
        with contextlib.suppress(RuntimeError):
            await ws.close(code=end.code, reason=_reason(end.reason))
