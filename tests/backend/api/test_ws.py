"""The session WebSocket's contract: approvals in both directions, limits, and close codes
that clients actually receive."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

from agent.parser import encode_call as call
from backend.api.ws import MAX_MESSAGE_BYTES
from tools.workspace import remove_store
from tests.backend.conftest import Api, make_api


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with make_api(f"sqlite:///{tmp_path / 'fw.db'}", tmp_path, semantic_search=False) as a:
        yield a


def hub(api: Api) -> Any:
    return api.client.app.state.flywheel.hub  # type: ignore[attr-defined]


def create(api: Api, outputs: list[str], approval_mode: str = "auto", who: str = "alice") -> str:
    """A session created through the hub (the route that passes approval_mode is not this module's)."""
    state = api.client.app.state.flywheel  # type: ignore[attr-defined]
    ws = state.store.from_dir(api.src)
    info = api.client.portal.call(functools.partial(  # type: ignore[union-attr]
        state.hub.create, owner=who, workspace=ws, title="", source={"kind": "dir", "path": str(api.src)},
        policy={"kind": "scripted", "outputs": outputs}, approval_mode=approval_mode))
    return info.id


def until(ws: Any, kind: str) -> list[dict]:
    got = []
    while not got or got[-1].get("type") != kind:
        got.append(ws.receive_json())
    return got


def denied(api: Api, url: str, **kw: Any) -> int:
    with pytest.raises(WebSocketDenialResponse) as info:
        with api.client.websocket_connect(url, **kw):
            pass
    return info.value.status_code


def test_an_approval_request_is_answered_over_the_socket(api: Api) -> None:
    sid = create(api, [call("write_file", {"path": "new.txt", "content": "x\n"}) + call("read_file", {"path": "app.py"}),
                       "understood"], approval_mode="ask-edits")
    info = api.client.get(f"/v1/sessions/{sid}", headers=api.h("alice")).json()
    assert info["source"]["approval_mode"] == "ask-edits"
    with api.client.websocket_connect(f"/v1/sessions/{sid}/ws", headers=api.h("alice")) as ws:
        ws.send_json({"type": "user_message", "text": "write it"})
        request = until(ws, "approval_requested")[-1]
        assert (request["call_id"], request["kind"], request["name"]) == ("t1s1c0", "edit", "write_file")
        assert request["args"] == {"path": "new.txt", "content": "x\n"}
        ws.send_json({"type": "approval", "call_id": "t1s1c0", "approved": False, "reason": "not that file"})
        rest = until(ws, "turn_end")
        ws.send_json({"type": "approval", "call_id": "t1s1c0", "approved": True})  # too late: answered
        late = ws.receive_json()
        ws.send_json({"type": "approval", "call_id": "t1s1c0"})  # not a valid message
        bad = ws.receive_json()
    resolved = next(e for e in rest if e["type"] == "approval_resolved")
    assert (resolved["approved"], resolved["reason"], resolved["by"]) == (False, "not that file", "user")
    result = next(e for e in rest if e["type"] == "tool_result" and e["call_id"] == "t1s1c0")
    assert not result["ok"] and "the user declined this write_file call" in result["output"]
    assert not (Path(api.client.app.state.flywheel.store.root) / "x").exists()  # type: ignore[attr-defined]
    assert late == {"type": "request_error", "status": 409,
                    "message": "no approval request is open for call 't1s1c0'"}
    assert bad["type"] == "request_error" and bad["status"] == 400 and '"approval"' in bad["message"]
    assert rest[-1]["reason"] == "completed"


def test_a_session_refuses_an_unknown_approval_mode(api: Api) -> None:
    from backend.hub import HubError

    with pytest.raises(HubError) as exc:
        create(api, [], approval_mode="sometimes")
    assert exc.value.status == 400 and "use one of auto, ask-commands, ask-edits" in str(exc.value)


def test_after_out_of_range_is_a_400(api: Api) -> None:
    sid = create(api, ["hi"])
    for after in (2**63, 10**30, -1):
        assert denied(api, f"/v1/sessions/{sid}/ws?after={after}", headers=api.h("alice")) == 400
    with api.client.websocket_connect(f"/v1/sessions/{sid}/ws?after={2**63 - 1}", headers=api.h("alice")) as ws:
        ws.send_json({"type": "interrupt"})  # accepted, and nothing comes back for a huge after


def test_sockets_per_token_are_capped(api: Api) -> None:
    sid = create(api, ["hi"])
    hub(api).sockets.per_token = 2
    url = f"/v1/sessions/{sid}/ws"
    with api.client.websocket_connect(url, headers=api.h("alice")), \
            api.client.websocket_connect(url, headers=api.h("alice")):
        assert denied(api, url, headers=api.h("alice")) == 429
        with api.client.websocket_connect(url, headers=api.h("sue")):  # another token has its own allowance
            pass
    with api.client.websocket_connect(url, headers=api.h("alice")):  # closed ones are given back
        pass
    assert hub(api).sockets.open("alice") == 0


def test_two_sockets_receive_the_lines_the_log_holds(api: Api) -> None:
    sid = create(api, ["Looking. " + call("read_file", {"path": "app.py"}), "done"])
    url = f"/v1/sessions/{sid}/ws"
    with api.client.websocket_connect(url, headers=api.h("alice")) as a, \
            api.client.websocket_connect(url, headers=api.h("alice")) as b:
        a.send_json({"type": "user_message", "text": "go"})
        texts = []
        for ws in (a, b):
            got = [ws.receive_text()]
            while json.loads(got[-1])["type"] != "turn_end":
                got.append(ws.receive_text())
            texts.append(got)
    log = api.client.app.state.flywheel.log  # type: ignore[attr-defined]
    assert texts[0] == texts[1] == [s.json for s in log.events_stored(sid)]  # byte for byte


def close_code(ws: Any) -> tuple[int, str]:
    with pytest.raises(WebSocketDisconnect) as exc:
        while True:
            ws.receive_json()
    return exc.value.code, exc.value.reason


def test_a_binary_or_oversized_message_closes_with_its_code(api: Api) -> None:
    sid = create(api, ["hi"])
    url = f"/v1/sessions/{sid}/ws"
    with api.client.websocket_connect(url, headers=api.h("alice")) as ws:
        ws.send_bytes(b"\x00\x01")
        assert close_code(ws) == (1003, "binary messages are not supported; send JSON text")
    with api.client.websocket_connect(url, headers=api.h("alice")) as ws:
        ws.send_text(json.dumps({"type": "user_message", "text": "é" * (MAX_MESSAGE_BYTES // 2)}))
        assert close_code(ws) == (1009, f"message larger than {MAX_MESSAGE_BYTES} bytes")
    events = api.client.get(f"/v1/sessions/{sid}/events", headers=api.h("alice")).json()["events"]
    assert events == []  # the oversized message never became a turn


def test_server_shutdown_closes_with_1001(api: Api) -> None:
    sid = create(api, ["hi"])
    with api.client.websocket_connect(f"/v1/sessions/{sid}/ws", headers=api.h("alice")) as ws:
        ws.send_json({"type": "user_message", "text": "go"})
        until(ws, "turn_end")
        api.client.portal.call(hub(api).shutdown)  # type: ignore[union-attr]
        code, reason = close_code(ws)
    assert code == 1001 and reason.startswith("the server is shutting down; reconnect with after=")


def test_a_session_whose_workspace_is_gone_is_a_410_not_a_500(api: Api) -> None:
    sid = create(api, ["hi"])
    state = api.client.app.state.flywheel  # type: ignore[attr-defined]
    info = api.client.get(f"/v1/sessions/{sid}", headers=api.h("alice")).json()
    assert sid not in hub(api).live  # not loaded yet
    remove_store(state.store.root / "ws" / info["workspace_id"])  # unmounts first (overlays)
    assert denied(api, f"/v1/sessions/{sid}/ws", headers=api.h("alice")) == 410
    r = api.client.post(f"/v1/sessions/{sid}/messages", json={"text": "go"}, headers=api.h("alice"))
    assert r.status_code == 410 and "workspace is gone" in r.json()["detail"]
    assert hub(api).sockets.open("alice") == 0


# -- a real server: TCP backpressure ----------------------------------------------------------------


@pytest.fixture
def server(api: Api) -> Iterator[str]:
    """The same app behind a real uvicorn (as `flywheel serve` runs it), in a thread."""
    import uvicorn

    from backend.app import create_app

    srv = uvicorn.Server(uvicorn.Config(create_app(api.settings), host="127.0.0.1", port=0,
                                        ws="websockets-sansio", log_level="warning", lifespan="on"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.started
    srv.config.app.state.flywheel.hub.send_stall_s = 1.0  # type: ignore[attr-defined]
    port = srv.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"ws://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(20)


class RawClient:
    """A WebSocket client that really stops reading when it is not called: the sans-io
    protocol over a blocking socket with a small receive buffer (library clients keep
    reading into memory in the background)."""

    def __init__(self, url: str, headers: dict[str, str], rcvbuf: int = 1 << 16) -> None:
        import socket

        from websockets.client import ClientProtocol
        from websockets.protocol import State
        from websockets.uri import parse_uri

        u = parse_uri(url)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect((u.host, u.port))
        self.proto = ClientProtocol(u, max_size=None)
        request = self.proto.connect()
        for k, v in headers.items():
            request.headers[k] = v
        self.proto.send_request(request)
        self._flush()
        self.messages: list[dict] = []
        while self.proto.state is State.CONNECTING:
            self._read(10)

    def _flush(self) -> None:
        for chunk in self.proto.data_to_send():
            if chunk:
                self.sock.sendall(chunk)

    def _read(self, timeout: float) -> bool:
        from websockets.frames import Opcode

        self.sock.settimeout(timeout)
        data = self.sock.recv(1 << 16)
        if data:
            self.proto.receive_data(data)
        else:
            self.proto.receive_eof()
        for frame in self.proto.events_received():
            if getattr(frame, "opcode", None) is Opcode.TEXT:
                self.messages.append(json.loads(frame.data))
        self._flush()  # pongs, the close echo
        return bool(data)

    def send(self, msg: dict) -> None:
        self.proto.send_text(json.dumps(msg).encode())
        self._flush()

    def read_until_closed(self, timeout: float = 60) -> tuple[int | None, str]:
        deadline = time.monotonic() + timeout
        while self.proto.close_rcvd is None and time.monotonic() < deadline:
            if not self._read(max(0.1, deadline - time.monotonic())):
                break
        self.sock.close()
        rcvd = self.proto.close_rcvd
        return (rcvd.code, rcvd.reason) if rcvd is not None else (None, "")


def test_a_client_that_stops_reading_gets_4408_and_resumes_losslessly(api: Api, server: str) -> None:
    import httpx
    from websockets.asyncio.client import connect

    # 40 results of 256 KiB: far more than the socket buffers between server and client hold
    (api.src / "big.txt").write_text("".join(f"line {i:07d} {'y' * 80}\n" for i in range(30_000)))
    outputs = ["".join(call("read_file", {"path": "big.txt"}) for _ in range(40)), "done"]
    r = httpx.post(server.replace("ws://", "http://") + "/v1/sessions", headers=api.h("alice"), timeout=30,
                   json={"workspace": {"path": str(api.src)}, "policy": {"kind": "scripted", "outputs": outputs}})
    assert r.status_code == 201, r.text
    url = f"{server}/v1/sessions/{r.json()['id']}/ws"

    client = RawClient(url, api.h("alice"))
    client.send({"type": "user_message", "text": "go"})
    time.sleep(4)  # reads nothing: the server's sends block, and after send_stall_s it gives up on us
    code, reason = client.read_until_closed()
    first = [m["seq"] for m in client.messages]
    assert code == 4408, (code, reason, len(first))
    assert first and reason == f"client fell too far behind; reconnect with after={first[-1]}"

    async def resume() -> list[int]:
        seqs = []
        async with connect(f"{url}?after={first[-1]}", additional_headers=api.h("alice"), max_size=1 << 24) as ws:
            while not seqs or last["type"] != "turn_end":
                last = json.loads(await asyncio.wait_for(ws.recv(), 60))
                seqs.append(last["seq"])
        return seqs

    seqs = first + asyncio.run(resume())
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) > 80  # nothing lost, nothing twice
