"""Every route needs a token; users only reach their own sessions."""

from __future__ import annotations

import re

import pytest
from starlette.testclient import WebSocketDenialResponse

from tests.backend.conftest import Api

DUMMY_BODIES = {
    "post /v1/sessions": {"workspace": {"path": "/tmp"}, "policy": {"kind": "scripted", "outputs": []}},
    "post /v1/sessions/{session_id}/messages": {"text": "hi"},
    "post /v1/sessions/{session_id}/branch": {"from_step": 0, "policy": {"kind": "scripted", "outputs": []}},
}


def routes(api: Api) -> list[tuple[str, str]]:
    spec = api.client.get("/openapi.json").json()
    return [(m, p) for p, ops in spec["paths"].items() for m in ops]


def test_openapi_lists_the_api(api: Api) -> None:
    found = routes(api)
    assert ("post", "/v1/sessions") in found and ("get", "/v1/sessions/{session_id}/events") in found
    assert len(found) >= 10


def test_every_route_but_health_requires_a_token(api: Api) -> None:
    alice = api.create("alice")
    for method, path in routes(api):
        url = path.replace("{session_id}", alice["id"])
        body = DUMMY_BODIES.get(f"{method} {path}")
        for headers in ({}, {"Authorization": "Bearer fw_not_a_real_token"}, {"Authorization": "Basic eDp5"}):
            r = api.client.request(method.upper(), url, json=body, headers=headers)
            if path == "/health":
                assert r.status_code == 200
            else:
                assert r.status_code == 401, (method, path, headers, r.status_code, r.text)


def test_users_get_403_on_each_others_sessions(api: Api) -> None:
    alice = api.create("alice")
    session_routes = [(m, p) for m, p in routes(api) if "{session_id}" in p]
    assert len(session_routes) >= 8
    for method, path in session_routes:
        url = path.replace("{session_id}", alice["id"])
        r = api.client.request(method.upper(), url, json=DUMMY_BODIES.get(f"{method} {path}"), headers=api.h("bob"))
        assert r.status_code == 403, (method, path, r.status_code, r.text)
    # staff may look at anyone's session
    assert api.client.get(f"/v1/sessions/{alice['id']}", headers=api.h("sue")).status_code == 200
    assert api.client.get(f"/v1/sessions/{alice['id']}/events", headers=api.h("sue")).status_code == 200


def test_listing_is_scoped_to_the_caller(api: Api) -> None:
    a = api.create("alice")
    b = api.create("bob")
    mine = api.client.get("/v1/sessions", headers=api.h("alice")).json()
    assert [s["id"] for s in mine] == [a["id"]]
    assert api.client.get("/v1/sessions?owner=bob", headers=api.h("alice")).status_code == 403
    everyone = api.client.get("/v1/sessions", headers=api.h("sue")).json()
    assert {s["id"] for s in everyone} == {a["id"], b["id"]}
    only_bob = api.client.get("/v1/sessions?owner=bob", headers=api.h("sue")).json()
    assert [s["id"] for s in only_bob] == [b["id"]]


@pytest.mark.parametrize(
    ("who", "headers", "path", "status"),
    [
        (None, {}, None, 401),
        ("alice", {"Authorization": "Bearer fw_wrong"}, None, 401),
        ("bob", {}, None, 403),
        ("alice", {"origin": "https://evil.example"}, None, 403),
        ("alice", {}, "/v1/sessions/nope/ws", 404),
    ],
)
def test_websocket_is_refused_before_accept(api: Api, who, headers, path, status) -> None:
    alice = api.create("alice")
    if who and "Authorization" not in headers:
        headers = {**headers, "Authorization": f"Bearer {api.tokens[who]}"}
    with pytest.raises(WebSocketDenialResponse) as info:
        with api.client.websocket_connect(path or f"/v1/sessions/{alice['id']}/ws", headers=headers):
            pass
    assert info.value.status_code == status


def test_websocket_accepts_owner_by_header_or_subprotocol_and_allowed_origin(api: Api) -> None:
    alice = api.create("alice")
    url = f"/v1/sessions/{alice['id']}/ws"
    with api.client.websocket_connect(url, headers={**api.h("alice"), "origin": "http://localhost:5173"}) as ws:
        ws.send_json({"type": "user_message", "text": "hi"})
        assert ws.receive_json()["type"] == "user_message"
    proto = f"flywheel.token.{api.tokens['alice']}"
    with api.client.websocket_connect(url, subprotocols=[proto]) as ws:
        assert ws.receive_json()["seq"] == 1


def test_tokens_are_stored_hashed(api: Api, db_url: str) -> None:
    from sqlalchemy import text

    from backend.db.engine import make_engine

    engine = make_engine(db_url)
    with engine.connect() as conn:
        stored = " ".join(str(v) for row in conn.execute(text("SELECT * FROM tokens")) for v in row)
    engine.dispose()
    for token in api.tokens.values():
        assert token not in stored
    assert re.search(r"\b[0-9a-f]{64}\b", stored)
