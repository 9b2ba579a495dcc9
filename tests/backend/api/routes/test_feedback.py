"""Feedback: ratings, keep and revert, in the stream and the table, re-applied by replay (SQLite and PostgreSQL)."""

from __future__ import annotations

import time

from agent.parser import encode_call as call
from backend.rl_log import RLSessionLog
from tests.backend.conftest import Api
from tests.backend.test_contracts import assert_error
from tests.backend.test_sessions_api import wait_turn_end

EDITS = [
    call("edit_file", {"path": "app.py", "search": "a - b", "replace": "a + b"})
    + call("write_file", {"path": "notes.txt", "content": "todo\n"}),
    "Fixed and noted.",
    call("read_file", {"path": "app.py"}),
    "That is the file now.",
]


def edited_session(api: Api, outputs: list[str] = EDITS, **policy: object) -> str:
    sid = api.create("alice", outputs, **policy)["id"]
    api.client.post(f"/v1/sessions/{sid}/messages", json={"text": "fix it"}, headers=api.h("alice"))
    wait_turn_end(api, sid)
    return sid


def fb(api: Api, sid: str, who: str = "alice", **body: object) -> object:
    return api.client.post(f"/v1/sessions/{sid}/feedback", json=body, headers=api.h(who))


def test_a_turn_is_rated_and_a_new_rating_replaces_the_old(api: Api) -> None:
    sid = edited_session(api)
    r = fb(api, sid, turn=1, rating="up", comment="nice")
    assert r.status_code == 201, r.text
    first = r.json()
    assert (first["target"], first["turn"], first["rating"], first["author"], first["comment"]) == \
        ("turn", 1, "up", "alice", "nice")
    events = api.client.get(f"/v1/sessions/{sid}/events", headers=api.h("alice")).json()["events"]
    assert events[-1]["type"] == "feedback" and events[-1]["seq"] == first["seq"] and events[-1]["turn"] == 1
    assert (events[-1]["of_turn"], events[-1]["rating"], events[-1]["by"]) == (1, "up", "alice")
    again = fb(api, sid, turn=1, rating="down").json()
    assert again["id"] == first["id"] and again["seq"] > first["seq"]
    staff = fb(api, sid, "sue", turn=1, rating="up").json()
    assert staff["author"] == "sue"
    session = api.client.get(f"/v1/sessions/{sid}", headers=api.h("alice")).json()
    assert (session["feedback_up"], session["feedback_down"]) == (1, 1)
    listed = api.client.get(f"/v1/sessions/{sid}/feedback", headers=api.h("alice")).json()
    assert [(f["author"], f["rating"]) for f in listed["feedback"]] == [("alice", "down"), ("sue", "up")]
    assert listed["summary"] == {"up": 1, "down": 1, "kept": 0, "reverted": 0}
    timeline = api.client.get(f"/v1/sessions/{sid}/timeline", headers=api.h("sue")).json()
    assert [e["rating"] for e in timeline if e["type"] == "feedback"] == ["up", "down", "up"]  # every change of mind
    down = api.client.get("/v1/browse/sessions?feedback=down", headers=api.h("sue")).json()["sessions"]
    assert [s["id"] for s in down] == [sid]
    assert_error(fb(api, sid, "bob", turn=1, rating="up"), 403, "forbidden")
    assert_error(fb(api, sid, turn=2, rating="up"), 400, "bad_request")
    for bad in ({"turn": 0, "rating": "up"}, {"turn": 1}, {"turn": 1, "rating": "meh"},
                {"turn": 1, "rating": "up", "path": "app.py"}, {"path": "app.py", "rating": "up"},
                {"turn": 1, "rating": "up", "comment": "x" * 4001}, {}):
        assert_error(fb(api, sid, **bad), 422, "invalid_request")


def test_keep_and_revert_change_what_the_session_hands_back(api: Api) -> None:
    sid = edited_session(api, EDITS[:2])
    h = api.h("alice")
    kept = fb(api, sid, path="notes.txt", verdict="keep").json()
    assert kept["verdict"] == "keep" and kept["diff"] == ""
    r = fb(api, sid, path="app.py", verdict="revert", comment="wrong fix")
    assert r.status_code == 201, r.text
    reverted = r.json()
    assert "-    return a + b" in reverted["diff"] and "+    return a - b" in reverted["diff"]
    diff = api.client.get(f"/v1/sessions/{sid}/diff", headers=h).json()
    assert [f["path"] for f in diff["files"]] == ["notes.txt"]  # app.py is back as it was
    event = api.client.get(f"/v1/sessions/{sid}/events", headers=h).json()["events"][-1]
    assert (event["type"], event["verdict"], event["path"], event["diff"]) == ("feedback", "revert", "app.py",
                                                                                reverted["diff"])
    session = api.client.get(f"/v1/sessions/{sid}", headers=h).json()
    assert (session["files_kept"], session["files_reverted"]) == (1, 1)
    assert_error(fb(api, sid, path="app.py", verdict="revert"), 409, "conflict")  # nothing left to revert
    assert_error(fb(api, sid, path="README", verdict="keep"), 409, "conflict")
    assert_error(fb(api, sid, "sue", path="notes.txt", verdict="revert"), 403, "forbidden")  # the owner's call
    assert (api.src / "app.py").read_text().endswith("a - b\n")  # the source directory is never touched


def test_a_revert_waits_for_no_turn_and_is_refused_while_one_runs(api: Api) -> None:
    # ~3 s of streaming (63 chunks, 50 ms apart): the checks below run while the turn does
    sid = edited_session(api, EDITS[:2] + ["slow " * 300], delay_s=0.05)
    h = api.h("alice")
    api.client.post(f"/v1/sessions/{sid}/messages", json={"text": "more"}, headers=h)
    deadline = time.monotonic() + 10
    while api.client.get(f"/v1/sessions/{sid}", headers=h).json()["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    state = api.client.app.state.flywheel  # type: ignore[attr-defined]
    live = state.hub.live[sid]
    assert live.running
    assert_error(fb(api, sid, path="app.py", verdict="revert"), 409, "conflict")
    assert_error(fb(api, sid, turn=2, rating="up"), 409, "conflict")  # the running turn cannot be rated yet
    api.client.post(f"/v1/sessions/{sid}/interrupt", headers=h)
    wait_turn_end(api, sid, turns=2)
    assert fb(api, sid, path="app.py", verdict="revert").status_code == 201


def test_watchers_see_feedback_live(api: Api) -> None:
    sid = edited_session(api, EDITS[:2])
    with api.client.websocket_connect(f"/v1/sessions/{sid}/ws", headers=api.h("alice")) as ws:
        seen = []
        while not seen or seen[-1]["type"] != "turn_end":
            seen.append(ws.receive_json())
        fb(api, sid, path="app.py", verdict="revert")
        got = ws.receive_json()
        assert (got["type"], got["verdict"], got["seq"]) == ("feedback", "revert", seen[-1]["seq"] + 1)


def test_replay_and_branches_revert_again(api: Api) -> None:
    sid = api.create("alice", EDITS)["id"]
    h = api.h("alice")
    api.client.post(f"/v1/sessions/{sid}/messages", json={"text": "fix it"}, headers=h)
    wait_turn_end(api, sid)
    assert fb(api, sid, path="app.py", verdict="revert").status_code == 201
    api.client.post(f"/v1/sessions/{sid}/messages", json={"text": "show app.py"}, headers=h)
    events = wait_turn_end(api, sid, turns=2)
    read = next(e for e in events if e["type"] == "tool_result" and e["call_id"] == "t2s1c0")
    assert "a - b" in read["output"]  # turn 2 read the reverted file
    report = api.client.post(f"/v1/sessions/{sid}/reexecute", headers=api.h("sue")).json()
    assert report["reverts"] == [{"turn": 1, "path": "app.py", "ok": True, "detail": ""}]
    assert report["counts"] == {"same": 3, "differs": 0, "missing": 0, "extra": 0}, report
    first = report["calls"][0]
    assert (first["turn"], first["step"], first["index"], first["args"]["path"]) == (1, 1, 0, "app.py")
    assert first["recorded_duration_ms"] is not None and first["differs_in"] == []
    branch = api.client.post(f"/v1/sessions/{sid}/branch", headers=h,
                             json={"from_step": 2, "policy": {"kind": "scripted", "outputs": []}}).json()
    files = api.client.get(f"/v1/sessions/{branch['id']}/diff", headers=h).json()["files"]
    assert [f["path"] for f in files] == ["notes.txt"]  # the branch re-executed turn 1 and its revert
    branch_events = api.client.get(f"/v1/sessions/{branch['id']}/events", headers=h).json()["events"]
    assert [e["path"] for e in branch_events if e["type"] == "feedback"] == ["app.py"]


def test_a_rollout_without_a_workspace_can_be_rated_and_all_feedback_is_exported(api: Api) -> None:
    state = api.client.app.state.flywheel  # type: ignore[attr-defined]
    rl = RLSessionLog(state.log, state.store)
    rl.create_session(session_id="r" * 32, run_id="run", iteration=0, task_id="t", sample=0)
    rl.append_events("r" * 32, [{"type": "user_message", "seq": 1, "session_id": "r" * 32, "turn": 1, "text": "go"},
                                {"type": "turn_end", "seq": 2, "session_id": "r" * 32, "turn": 1,
                                 "reason": "completed", "steps": 0, "output_tokens": 0}])
    r = fb(api, "r" * 32, "sue", turn=1, rating="down", comment="gave up")
    assert r.status_code == 201, r.text
    assert r.json()["seq"] == 3
    sid = edited_session(api, EDITS[:2])
    fb(api, sid, turn=1, rating="up")
    fb(api, sid, path="notes.txt", verdict="keep")
    page = api.client.get("/v1/feedback?limit=2", headers=api.h("sue")).json()
    assert [(f["session_id"], f["kind"], f["owner"]) for f in page["feedback"]] == [
        ("r" * 32, "rl", "rl"), (sid, "user", "alice")]
    rest = api.client.get(f"/v1/feedback?after={page['next_after']}", headers=api.h("sue")).json()
    assert [f["verdict"] for f in rest["feedback"]] == ["keep"] and rest["next_after"] is None
    assert_error(api.client.get("/v1/feedback", headers=api.h("alice")), 403, "forbidden")
