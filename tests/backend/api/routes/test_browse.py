"""GET /v1/browse/sessions and /v1/browse/facets over a real app (SQLite and PostgreSQL)."""

from __future__ import annotations

from agent.parser import encode_call as call
from tests.backend.conftest import Api
from tests.backend.test_contracts import assert_error
from tests.backend.test_sessions_api import wait_turn_end


def run_turn(api: Api, who: str, text: str, outputs: list[str]) -> dict:
    s = api.create(who, outputs)
    assert api.client.post(f"/v1/sessions/{s['id']}/messages", json={"text": text}, headers=api.h(who)).status_code == 202
    wait_turn_end(api, s["id"], who)
    return s


def test_users_browse_their_own_sessions_and_staff_everyone(api: Api) -> None:
    a1 = run_turn(api, "alice", "please fix the parser", ["Looking at parser.py now."])
    a2 = run_turn(api, "alice", "add a README", ["Done."])
    b1 = run_turn(api, "bob", "fix the parser too", ["ok"])
    h = api.h("alice")
    page = api.client.get("/v1/browse/sessions?limit=1", headers=h).json()
    assert [s["id"] for s in page["sessions"]] == [a2["id"]] and page["next_cursor"]
    page2 = api.client.get("/v1/browse/sessions", params={"limit": 1, "cursor": page["next_cursor"]}, headers=h).json()
    assert [s["id"] for s in page2["sessions"]] == [a1["id"]] and page2["next_cursor"] is None
    assert_error(api.client.get("/v1/browse/sessions?owner=bob", headers=h), 403, "forbidden")
    found = api.client.get("/v1/browse/sessions", params={"q": "parser"}, headers=h).json()["sessions"]
    assert [s["id"] for s in found] == [a1["id"]]  # bob's session matches too, but it is not alice's
    match = found[0]["match"]
    assert match["seq"] == 1 and match["type"] == "user_message"
    assert [seg["text"] for seg in match["snippet"] if seg["match"]] == ["parser"]
    staff = api.client.get("/v1/browse/sessions", params={"q": "parser"}, headers=api.h("sue")).json()["sessions"]
    assert [s["id"] for s in staff] == [b1["id"], a1["id"]]
    model_hit = api.client.get("/v1/browse/sessions", params={"q": "parser.py"}, headers=api.h("sue")).json()
    assert model_hit["sessions"][0]["match"]["type"] == "assistant_message"
    assert api.client.get("/v1/browse/facets", headers=h).json() == {"owners": ["alice"], "policies": ["scripted"],
                                                                     "runs": []}
    assert api.client.get("/v1/browse/facets", headers=api.h("sue")).json()["owners"] == ["alice", "bob"]
    one = api.client.get("/v1/browse/sessions", params={"policy": "scripted", "kind": "user", "status": "idle"},
                         headers=api.h("sue")).json()["sessions"]
    assert len(one) == 3 and one[0]["policy_name"] == "scripted" and one[0]["feedback_up"] == 0


def test_bad_browse_requests_are_clear_errors(api: Api) -> None:
    h = api.h("alice")
    assert_error(api.client.get("/v1/browse/sessions?cursor=garbage", headers=h), 400, "bad_request")
    body = assert_error(api.client.get("/v1/browse/sessions", params={"q": "!!! ---"}, headers=h), 400)
    assert "no words" in body["detail"]
    for query in ("limit=0", "limit=201", "feedback=maybe", "order=random", "min_reward=nan", "since=yesterday",
                  "iteration=-1", f"q={'x' * 501}"):
        assert_error(api.client.get(f"/v1/browse/sessions?{query}", headers=h), 422, "invalid_request")
    assert api.client.get("/v1/browse/sessions?q=%20", headers=h).status_code == 200  # blank: no search
    assert_error(api.client.get("/v1/browse/sessions"), 401, "unauthorized")


def test_a_model_output_with_markup_comes_back_as_plain_text(api: Api) -> None:
    s = run_turn(api, "alice", "show me <script>alert(1)</script>", ["<img src=x onerror=alert(2)> " +
                                                                     call("read_file", {"path": "app.py"})])
    found = api.client.get("/v1/browse/sessions", params={"q": "script alert"}, headers=api.h("alice")).json()
    text = "".join(seg["text"] for seg in found["sessions"][0]["match"]["snippet"])
    assert "<script>alert(1)</script>" in text and found["sessions"][0]["id"] == s["id"]  # data, never markup
