"""Sessions over REST and WebSocket, on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from fastapi.testclient import TestClient

from agent.parser import encode_call as call
from backend.app import create_app
from tests.backend.conftest import Api


def wait_turn_end(api: Api, sid: str, who: str = "alice", turns: int = 1, timeout: float = 20) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = api.client.get(f"/v1/sessions/{sid}/events?limit=5000", headers=api.h(who)).json()["events"]
        if sum(e["type"] == "turn_end" for e in events) >= turns:
            return events
        time.sleep(0.05)
    raise AssertionError(f"turn did not end: {events[-3:]}")


def test_create_refuses_paths_outside_allowed_roots(api: Api, tmp_path: Path) -> None:
    for path in ["/etc", str(tmp_path), str(api.src / ".." / ".."), "/proc/self/root"]:
        r = api.client.post("/v1/sessions", json={"workspace": {"path": path}, "policy": {"kind": "scripted", "outputs": []}},
                            headers=api.h("alice"))
        assert r.status_code == 403, (path, r.text)
    link = api.src / "escape"
    link.symlink_to("/etc")
    r = api.client.post("/v1/sessions", json={"workspace": {"path": str(link)}, "policy": {"kind": "scripted", "outputs": []}},
                        headers=api.h("alice"))
    assert r.status_code == 403


def test_create_validates_policy_and_body(api: Api) -> None:
    base = {"workspace": {"path": str(api.src)}}
    cases = [
        ({**base, "policy": {"kind": "gpt5"}}, "unknown policy kind"),
        ({**base, "policy": {"kind": "openai"}}, "no model server configured"),
        ({**base, "policy": {"kind": "scripted", "outputs": [1]}}, "list of strings"),
        ({"workspace": {"path": str(api.src), "git": str(api.src)}, "policy": {"kind": "scripted", "outputs": []}},
         "exactly one"),
    ]
    for body, message in cases:
        r = api.client.post("/v1/sessions", json=body, headers=api.h("alice"))
        assert r.status_code in (400, 422) and message in r.text, (body, r.text)


def test_turn_over_rest_then_events_diff_and_listing(api: Api) -> None:
    s = api.create("alice", [
        "Reading. " + call("read_file", {"path": "app.py"}),
        call("edit_file", {"path": "app.py", "search": "a - b", "replace": "a + b"}),
        "Fixed.",
    ])
    assert api.client.post(f"/v1/sessions/{s['id']}/messages", json={"text": "fix"}, headers=api.h("alice")).status_code == 202
    events = wait_turn_end(api, s["id"])
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["reason"] == "completed"
    diff = api.client.get(f"/v1/sessions/{s['id']}/diff", headers=api.h("alice")).json()
    assert "+    return a + b" in diff["diff"] and diff["files"] == [{"path": "app.py", "kind": "modified"}]
    assert (api.src / "app.py").read_text().endswith("a - b\n")  # the source is never touched
    info = api.client.get(f"/v1/sessions/{s['id']}", headers=api.h("alice")).json()
    assert info["status"] == "idle" and info["last_seq"] == len(events) and info["turns"] == 1
    page = api.client.get(f"/v1/sessions/{s['id']}/events?after=2&limit=3", headers=api.h("alice")).json()
    assert [e["seq"] for e in page["events"]] == [3, 4, 5] and page["more"] and page["next_after"] == 5


def test_second_message_while_running_is_409_and_interrupt_works(api: Api) -> None:
    s = api.create("alice", ["slow " * 400], chunk_chars=2, delay_s=0.01)
    h = api.h("alice")
    assert api.client.post(f"/v1/sessions/{s['id']}/messages", json={"text": "go"}, headers=h).status_code == 202
    r = api.client.post(f"/v1/sessions/{s['id']}/messages", json={"text": "again"}, headers=h)
    assert r.status_code == 409 and "already running" in r.text
    assert api.client.post(f"/v1/sessions/{s['id']}/interrupt", headers=h).json() == {"interrupted": True}
    events = wait_turn_end(api, s["id"])
    assert events[-1]["reason"] == "interrupted"
    assert api.client.post(f"/v1/sessions/{s['id']}/cancel", headers=h).json() == {"cancelled": True}
    r = api.client.post(f"/v1/sessions/{s['id']}/messages", json={"text": "more"}, headers=h)
    assert r.status_code == 409 and "cancelled" in r.text


def test_websocket_turn_and_lossless_reconnect(api: Api) -> None:
    s = api.create("alice", ["Hi " + call("list_dir", {}), "done"])
    url = f"/v1/sessions/{s['id']}/ws"
    seen = []
    with api.client.websocket_connect(url, headers=api.h("alice")) as ws:
        ws.send_json({"type": "user_message", "text": "hello"})
        while True:
            e = ws.receive_json()
            seen.append(e)
            if e["type"] == "turn_end":
                break
        ws.send_json({"type": "nonsense"})
        assert ws.receive_json()["type"] == "request_error"
    with api.client.websocket_connect(f"{url}?after=3", headers=api.h("alice")) as ws:
        again = [ws.receive_json() for _ in range(len(seen) - 3)]
    assert again == seen[3:]


def test_two_watchers_see_the_same_stream(api: Api) -> None:
    s = api.create("alice", ["one " + call("list_dir", {}), "two"])
    url = f"/v1/sessions/{s['id']}/ws"
    with api.client.websocket_connect(url, headers=api.h("alice")) as a, \
            api.client.websocket_connect(url, headers=api.h("sue")) as b:
        a.send_json({"type": "user_message", "text": "go"})
        got_a, got_b = [], []
        for got, ws in ((got_a, a), (got_b, b)):
            while not got or got[-1]["type"] != "turn_end":
                got.append(ws.receive_json())
    assert got_a == got_b and len(got_a) > 5


def test_reexecute_and_branch(api: Api) -> None:
    s = api.create("alice", [
        call("read_file", {"path": "app.py"}) + call("grep", {"pattern": "return"}),
        call("edit_file", {"path": "app.py", "search": "a - b", "replace": "a + b"}),
        "done",
    ])
    h = api.h("alice")
    api.client.post(f"/v1/sessions/{s['id']}/messages", json={"text": "fix"}, headers=h)
    wait_turn_end(api, s["id"])
    report = api.client.post(f"/v1/sessions/{s['id']}/reexecute", headers=h).json()
    assert report["counts"] == {"same": 3, "differs": 0, "missing": 0, "extra": 0}
    timeline = api.client.get(f"/v1/sessions/{s['id']}/timeline", headers=h).json()
    assert timeline[0]["t"] == 0 and all(b["t"] >= a["t"] for a, b in zip(timeline, timeline[1:], strict=False))
    # branch after step 1 (the reads) with a different continuation
    r = api.client.post(f"/v1/sessions/{s['id']}/branch", headers=h, json={
        "from_step": 1, "policy": {"kind": "scripted", "outputs": ["I would not change anything."]}})
    assert r.status_code == 201, r.text
    branch = r.json()
    assert branch["parent_id"] == s["id"] and branch["branch_step"] == 1
    events = wait_turn_end(api, branch["id"], turns=1)  # the cut turn goes on as one turn
    texts = [e["text"] for e in events if e["type"] == "assistant_message"]
    assert texts[-1] == "I would not change anything." and len(texts) == 2
    diff = api.client.get(f"/v1/sessions/{branch['id']}/diff", headers=h).json()
    assert diff["diff"] == ""  # the branch never made the edit
    bad = api.client.post(f"/v1/sessions/{s['id']}/branch", headers=h,
                          json={"from_step": 99, "policy": {"kind": "scripted", "outputs": []}})
    assert bad.status_code == 400 and "between 0 and 3" in bad.text


def test_git_source_at_commit(api: Api) -> None:
    repo = api.src / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "v.txt").write_text("1\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "1"], check=True)
    (repo / "v.txt").write_text("2\n")
    subprocess.run([*git, "commit", "-qam", "2"], check=True)
    body = {"workspace": {"git": str(repo), "commit": "HEAD~1"},
            "policy": {"kind": "scripted", "outputs": [call("read_file", {"path": "v.txt"}), "ok"]}}
    r = api.client.post("/v1/sessions", json=body, headers=api.h("alice"))
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    api.client.post(f"/v1/sessions/{sid}/messages", json={"text": "read"}, headers=api.h("alice"))
    events = wait_turn_end(api, sid)
    [result] = [e for e in events if e["type"] == "tool_result"]
    assert "1" in result["output"] and "2" not in result["output"].split("\t", 1)[-1]
    bad = api.client.post("/v1/sessions", json={**body, "workspace": {"git": str(repo), "commit": "nope"}},
                          headers=api.h("alice"))
    assert bad.status_code == 400


def test_restart_closes_inflight_turn_and_resumes(api: Api) -> None:
    s = api.create("alice", ["slow " * 300, "resumed fine"], chunk_chars=2, delay_s=0.01)
    h = api.h("alice")
    api.client.post(f"/v1/sessions/{s['id']}/messages", json={"text": "go"}, headers=h)
    time.sleep(0.3)
    # simulate a crash: the row still says running and the turn has no end
    from backend.db.engine import make_engine
    from backend.db.log import SessionLog

    log = SessionLog(make_engine(api.settings.database_url))
    api.client.__exit__(None, None, None)  # stop the first server (its shutdown interrupts the turn)
    # what a kill -9 leaves behind: the status says running and the turn has no end
    from sqlalchemy import delete

    from backend.db.models import EventRow

    with log.engine.begin() as conn:
        last = max(e.seq for e in log.all_events(s["id"]))
        conn.execute(delete(EventRow).where(EventRow.session_id == s["id"], EventRow.seq == last))
    log.set_status(s["id"], "running")
    log.engine.dispose()
    with TestClient(create_app(api.settings)) as client:
        events = client.get(f"/v1/sessions/{s['id']}/events?limit=5000", headers=h).json()["events"]
        ends = [e for e in events if e["type"] == "turn_end"]
        assert len(ends) == 1 and ends[0]["reason"] == "shutdown"  # not "the user interrupted"
        assert "server stopped" in ends[0]["detail"]
        assert client.get(f"/v1/sessions/{s['id']}", headers=h).json()["status"] == "idle"
        assert client.post(f"/v1/sessions/{s['id']}/messages", json={"text": "again"}, headers=h).status_code == 202
        api.client = client
        events = wait_turn_end(api, s["id"], turns=2)
        assert events[-1]["reason"] == "completed"
        assert [e["text"] for e in events if e["type"] == "assistant_message"][-1] == "resumed fine"


def test_create_takes_an_approval_mode_and_refuses_an_unknown_one(api: Api) -> None:
    body = {"workspace": {"path": str(api.src)}, "policy": {"kind": "scripted", "outputs": ["Hi."]}}
    r = api.client.post("/v1/sessions", json={**body, "approval_mode": "ask-commands"}, headers=api.h("alice"))
    assert r.status_code in (200, 201), r.text
    from backend.hub import approval_mode_of

    log = api.client.app.state.flywheel.log
    assert approval_mode_of(log.get_session(r.json()["id"])) == "ask-commands"
    bad = api.client.post("/v1/sessions", json={**body, "approval_mode": "sometimes"}, headers=api.h("alice"))
    assert bad.status_code == 422 and "approval_mode" in bad.text
