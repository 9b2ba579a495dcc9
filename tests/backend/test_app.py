"""``flywheel serve``'s workspaces are copy-on-write overlays (``backend/app.py``): unmounted at
shutdown, stale mounts of a killed server cleaned at start, and a killed server's store removable
at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.parser import encode_call as call
from backend.server_process import ServerProcess
from tools.overlay import mounts_under, overlay_unavailable
from tools.workspace import WorkspaceStore, remove_store


@pytest.fixture
def src(tmp_path: Path) -> Path:
    if (reason := overlay_unavailable(tmp_path)) is not None:
        pytest.skip(f"overlays do not work here ({reason})")
    src = tmp_path / "src"
    src.mkdir()
    (src / "app.py").write_text("def add(a, b):\n    return a - b\n")
    return src


def edited_session(srv: ServerProcess, src: Path) -> dict:
    outputs = [call("edit_file", {"path": "app.py", "search": "a - b", "replace": "a + b"}), "done"]
    with srv.client() as c:
        s = c.post("/v1/sessions", json={"workspace": {"path": str(src)},
                                         "policy": {"kind": "scripted", "outputs": outputs}}).json()
        c.post(f"/v1/sessions/{s['id']}/messages", json={"text": "fix"})
        deadline = time.monotonic() + 20
        while c.get(f"/v1/sessions/{s['id']}").json()["status"] != "idle" or not any(
                e["type"] == "turn_end" for e in c.get(f"/v1/sessions/{s['id']}/events").json()["events"]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        return c.get(f"/v1/sessions/{s['id']}").json()


def diff_of(srv: ServerProcess, sid: str) -> str:
    with srv.client() as c:
        return str(c.get(f"/v1/sessions/{sid}/diff").json()["diff"])


def test_mounts_end_with_the_server_and_stale_ones_are_cleaned_at_start(tmp_path: Path, src: Path) -> None:
    data = tmp_path / "data"
    workspaces = data / "workspaces"
    with ServerProcess(data_dir=data, allow_roots=[src]) as srv:
        info = edited_session(srv, src)
        assert mounts_under(workspaces)  # the session's workspace is an overlay
        srv.stop()
        assert mounts_under(workspaces) == []  # unmounted by the shutdown itself
        # A mount a killed server left behind (made here, by this process, so nothing else removes it)
        WorkspaceStore(workspaces).open(info["workspace_id"])
        assert mounts_under(workspaces)
        srv.start()
        assert mounts_under(workspaces) == []  # cleaned at start, before any request
        assert "+    return a + b" in diff_of(srv, info["id"])  # and the workspace mounts again on use
        assert mounts_under(workspaces)


def test_a_killed_servers_store_is_removed_at_once(tmp_path: Path, src: Path) -> None:
    data = tmp_path / "data"
    with ServerProcess(data_dir=data, allow_roots=[src]) as srv:
        info = edited_session(srv, src)
        srv.kill9()  # no shutdown code runs; its reaper unmounts asynchronously, if at all
        srv.start()  # a restarted server goes on with the session
        assert "+    return a + b" in diff_of(srv, info["id"])
        srv.kill9()
        remove_store(data / "workspaces")
    assert not (data / "workspaces").exists() and mounts_under(data) == []


def test_overlays_can_be_turned_off(tmp_path: Path, src: Path) -> None:
    data = tmp_path / "data"
    with ServerProcess(data_dir=data, allow_roots=[src], env={"FLYWHEEL_WORKSPACE_OVERLAY": "off"}) as srv:
        info = edited_session(srv, src)
        assert mounts_under(data) == [] and "+    return a + b" in diff_of(srv, info["id"])
