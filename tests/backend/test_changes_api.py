"""The changes and checkpoint routes (backend/api/routes/changes.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import time

from agent.parser import encode_call as call
from backend.apply_back import ChangeSet, apply_changes
from backend.cli import with_change_routes
from tests.backend.conftest import Api
from tests.backend.test_sessions_api import wait_turn_end

EDIT = call("edit_file", {"path": "app.py", "search": "a - b", "replace": "a + b"})


def turn(api: Api, sid: str, text: str, turns: int) -> None:
    r = api.client.post(f"/v1/sessions/{sid}/messages", json={"text": text}, headers=api.h("alice"))
    assert r.status_code == 202, r.text
    wait_turn_end(api, sid, turns=turns)


def test_changes_apply_to_the_original(api: Api) -> None:
    with_change_routes(api.client.app)  # type: ignore[arg-type]
    s = api.create("alice", [EDIT, call("write_file", {"path": "new.txt", "content": "n\n"}), "done"])
    turn(api, s["id"], "fix", 1)
    r = api.client.get(f"/v1/sessions/{s['id']}/changes", headers=api.h("alice"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["source"]["path"] == str(api.src) and [c["kind"] for c in body["changes"]] == ["modified", "added"]
    apply_changes(ChangeSet.from_json(body), api.src)
    assert (api.src / "app.py").read_text() == "def add(a, b):\n    return a + b\n"
    assert (api.src / "new.txt").read_text() == "n\n"
    assert api.client.get(f"/v1/sessions/{s['id']}/changes", headers=api.h("bob")).status_code == 403


def test_checkpoint_and_restore_undo_a_turn(api: Api) -> None:
    with_change_routes(api.client.app)  # type: ignore[arg-type]
    s = api.create("alice", [EDIT, "done"])
    sid = s["id"]
    cp = api.client.post(f"/v1/sessions/{sid}/checkpoints", headers=api.h("alice"))
    assert cp.status_code == 200, cp.text
    turn(api, sid, "fix", 1)
    assert api.client.get(f"/v1/sessions/{sid}/changes", headers=api.h("alice")).json()["changes"]
    other = api.create("alice", ["x"])["id"]
    foreign = api.client.post(f"/v1/sessions/{other}/restore", json=cp.json(), headers=api.h("alice"))
    assert foreign.status_code == 404  # a checkpoint of another session
    bad = api.client.post(f"/v1/sessions/{sid}/restore", json={"snapshot": "../x"}, headers=api.h("alice"))
    assert bad.status_code == 422
    r = api.client.post(f"/v1/sessions/{sid}/restore", json=cp.json(), headers=api.h("alice"))
    assert r.status_code == 200 and r.json()["restored"] == ["app.py"], r.text
    assert api.client.get(f"/v1/sessions/{sid}/changes", headers=api.h("alice")).json()["changes"] == []


def test_checkpoint_is_refused_while_a_turn_runs(api: Api) -> None:
    with_change_routes(api.client.app)  # type: ignore[arg-type]
    s = api.create("alice", ["slow " * 200], chunk_chars=2, delay_s=0.01)
    api.client.post(f"/v1/sessions/{s['id']}/messages", json={"text": "go"}, headers=api.h("alice"))
    deadline = time.monotonic() + 10
    while api.client.get(f"/v1/sessions/{s['id']}", headers=api.h("alice")).json()["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    r = api.client.post(f"/v1/sessions/{s['id']}/checkpoints", headers=api.h("alice"))
    assert r.status_code == 409 and "running" in r.text
    api.client.post(f"/v1/sessions/{s['id']}/interrupt", headers=api.h("alice"))


def test_the_routes_are_added_once(api: Api) -> None:
    app = api.client.app
    with_change_routes(app)  # type: ignore[arg-type]
    n = len(app.routes)  # type: ignore[attr-defined]
    with_change_routes(app)  # type: ignore[arg-type]
    assert len(app.routes) == n  # type: ignore[attr-defined]
