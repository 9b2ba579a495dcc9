"""The replay views: call timings, the conversation as the model saw it, branches (SQLite and PostgreSQL)."""

from __future__ import annotations

from agent.parser import encode_call as call
from tests.backend.conftest import Api
from tests.backend.test_contracts import assert_error
from tests.backend.test_sessions_api import wait_turn_end

SCRIPT = [
    "Reading both. " + call("read_file", {"path": "app.py"}) + call("list_dir", {"path": "."}),
    call("edit_file", {"path": "app.py", "search": "a - b", "replace": "a + b"}),
    "Fixed.",
]


def fixed_session(api: Api) -> dict:
    s = api.create("alice", SCRIPT)
    api.client.post(f"/v1/sessions/{s['id']}/messages", json={"text": "fix add"}, headers=api.h("alice"))
    wait_turn_end(api, s["id"])
    return s


def test_calls_give_bars_per_call_and_per_model_call(api: Api) -> None:
    s = fixed_session(api)
    body = api.client.get(f"/v1/sessions/{s['id']}/calls", headers=api.h("alice")).json()
    calls = {c["call_id"]: c for c in body["calls"]}
    assert list(calls) == ["t1s1c0", "t1s1c1", "t1s2c0"]
    read, ls, edit = calls.values()
    assert read["name"] == "read_file" and read["args"] == {"path": "app.py"} and read["ok"] is True
    for c in calls.values():
        assert 0 <= c["started_t"] <= c["running_t"] <= c["ended_t"] and c["duration_ms"] >= 0
        assert c["result_seq"] > c["started_seq"]
    assert ls["started_t"] <= read["ended_t"] or read["started_t"] <= ls["ended_t"]
    assert "return a - b" in read["output"]
    assert [e["path"] for e in edit["edits"]] == ["app.py"] and "+    return a + b" in edit["edits"][0]["diff"]
    steps = body["steps"]
    assert [(st["step"], st["calls"]) for st in steps] == [(1, ["t1s1c0", "t1s1c1"]), (2, ["t1s2c0"]), (3, [])]
    assert all(st["started_t"] <= st["ended_t"] for st in steps)
    assert steps[1]["started_t"] >= max(read["ended_t"], ls["ended_t"])  # the model is asked after the results
    timeline_t0 = api.client.get(f"/v1/sessions/{s['id']}/timeline", headers=api.h("alice")).json()[0]["ts"]
    assert body["t0"] == timeline_t0
    light = api.client.get(f"/v1/sessions/{s['id']}/calls?outputs=false", headers=api.h("alice")).json()
    assert light["calls"][0]["output"] is None and light["calls"][2]["edits"][0]["diff"] == ""
    assert_error(api.client.get(f"/v1/sessions/{s['id']}/calls", headers=api.h("bob")), 403, "forbidden")
    assert api.client.get(f"/v1/sessions/{s['id']}/calls", headers=api.h("sue")).status_code == 200


def test_the_conversation_is_what_the_model_read(api: Api) -> None:
    s = fixed_session(api)
    body = api.client.get(f"/v1/sessions/{s['id']}/conversation", headers=api.h("alice")).json()
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    system, user, first = body["messages"][:3]
    assert "read_file" in system["content"] and system["seq"] is None
    assert user == {"role": "user", "content": "fix add", "seq": 1}
    assert first["content"] == SCRIPT[0]
    seqs = [m["seq"] for m in body["messages"][1:]]
    assert seqs == sorted(seqs) and body["upto"] == seqs[-1] + 1  # the turn_end comes last
    assert "return a - b" in body["messages"][3]["content"]  # the tool results as the model read them
    part = api.client.get(f"/v1/sessions/{s['id']}/conversation?upto=2", headers=api.h("alice")).json()
    assert [m["role"] for m in part["messages"]] == ["system", "user"] and part["upto"] == 2
    assert_error(api.client.get(f"/v1/sessions/{s['id']}/conversation?upto=-1", headers=api.h("alice")), 422)


def test_branches_link_both_ways(api: Api) -> None:
    s = fixed_session(api)
    h = api.h("alice")
    assert api.client.get(f"/v1/sessions/{s['id']}/branches", headers=h).json() == []
    r = api.client.post(f"/v1/sessions/{s['id']}/branch", headers=h,
                        json={"from_step": 1, "policy": {"kind": "scripted", "outputs": ["Other way."]}})
    assert r.status_code == 201, r.text
    child = r.json()
    assert child["parent_id"] == s["id"] and child["branch_step"] == 1
    listed = api.client.get(f"/v1/sessions/{s['id']}/branches", headers=h).json()
    assert [b["id"] for b in listed] == [child["id"]]
    staff_branch = api.client.post(f"/v1/sessions/{s['id']}/branch", headers=api.h("sue"),
                                   json={"from_step": 0, "policy": {"kind": "scripted", "outputs": []}}).json()
    assert [b["id"] for b in api.client.get(f"/v1/sessions/{s['id']}/branches", headers=h).json()] == [child["id"]]
    both = api.client.get(f"/v1/sessions/{s['id']}/branches", headers=api.h("sue")).json()
    assert [b["id"] for b in both] == [staff_branch["id"], child["id"]]  # staff see the one alice may not
