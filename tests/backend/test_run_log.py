"""``flywheel run`` sessions in the local session log (``backend/run_log.py``): listed, shown,
exported with no server; viewed, re-executed and branched by ``flywheel replay`` through one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.parser import encode_call as call
from backend.server_process import REPO, ServerProcess

OUTPUTS = [call("read_file", {"path": "app.py"}), call("edit_file", {"path": "app.py", "search": "a - b",
                                                                      "replace": "a + b"}), "fixed"]


def flywheel(*args: str, data: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "backend.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO, stdin=subprocess.DEVNULL,
                          env={**os.environ, "NO_COLOR": "1", "FLYWHEEL_DATA_DIR": str(data), **env})


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "proj"
    src.mkdir()
    (src / "app.py").write_text("def add(a, b):\n    return a - b\n")
    script = tmp_path / "s.json"
    script.write_text(json.dumps(OUTPUTS))
    return src, script


def test_a_run_is_listed_shown_and_exported_without_a_server(tmp_path: Path, project: tuple[Path, Path]) -> None:
    src, script = project
    data = tmp_path / "data"
    r = flywheel("run", "--workspace", str(src), "--policy", f"scripted:{script}", "--json", "--discard", "fix add",
                 data=data)
    assert r.returncode == 0, r.stderr
    printed = [json.loads(line) for line in r.stdout.splitlines()]
    sid = r.stderr.split("recorded as session ")[1].split()[0]
    listed = flywheel("sessions", "list", "--json", data=data)
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(s["id"], s["owner"], s["status"], s["turns"], s["title"]) for s in rows] == [
        (sid, "local", "idle", 1, "fix add")]
    assert rows[0]["source"] == {"kind": "dir", "path": str(src.resolve()), "driver": "flywheel run"}
    exported = flywheel("sessions", "export", sid[:8], data=data)
    assert [json.loads(line) for line in exported.stdout.splitlines()] == printed  # every event, as shown
    show = flywheel("sessions", "show", sid[:8], data=data)
    assert "▶ edit_file" in show.stdout and "fixed" in show.stdout
    diff = flywheel("sessions", "diff", sid[:8], data=data)
    assert diff.returncode == 1 and "worked on a temporary copy" in diff.stderr
    none = flywheel("run", "--workspace", str(src), "--policy", f"scripted:{script}", "--no-record", "--discard",
                    "again", data=tmp_path / "other")
    assert none.returncode == 0 and "recorded as" not in none.stdout and not (tmp_path / "other").exists()


def test_replay_reexecutes_and_branches_a_run(tmp_path: Path, project: tuple[Path, Path]) -> None:
    src, script = project
    data = tmp_path / "data"
    kept = tmp_path / "kept"
    r = flywheel("run", "--workspace", str(src), "--policy", f"scripted:{script}", "--data-dir", str(kept),
                 "--discard", "fix add", data=data)
    assert r.returncode == 0, r.stderr
    sid = r.stdout.split("recorded as session ")[1].split()[0]
    diff = flywheel("sessions", "diff", sid, data=data)  # the kept copy is named in the record
    assert diff.returncode == 0 and "+    return a + b" in diff.stdout, diff.stderr
    with ServerProcess(data_dir=data, allow_roots=[src]) as srv:
        env = {"FLYWHEEL_SERVER": srv.url, "FLYWHEEL_TOKEN": srv.token}
        view = flywheel("replay", sid, data=data, **env)
        assert view.returncode == 0 and "▶ edit_file" in view.stdout, view.stderr
        again = flywheel("replay", sid, "--reexecute", data=data, **env)
        assert again.returncode == 0 and "2 same, 0 differ, 0 missing, 0 extra" in again.stdout, again.stdout
        branch = flywheel("replay", sid, "--from-step", "1", "--policy", "demo", "--json", data=data, **env)
        assert branch.returncode == 0 and json.loads(branch.stdout)["parent_id"] == sid, branch.stderr


def test_a_server_leaves_a_run_in_progress_open(tmp_path: Path) -> None:
    from backend.local_log import log_settings
    from backend.run_log import RunRecorder, run_in_progress
    from tools.workspace import WorkspaceStore

    data = tmp_path / "data"
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a\n")
    ws = WorkspaceStore(tmp_path / "store").from_dir(src)
    recorder = RunRecorder.open(log_settings(data_dir=data))
    recorder.start(ws, title="t", source={"kind": "dir", "path": str(src)}, policy={"kind": "scripted", "outputs": []},
                   approval_mode="auto", kept_in=None)
    assert run_in_progress(data, recorder.session_id) and not run_in_progress(data, "0" * 32)
    with ServerProcess(data_dir=data) as srv:  # its restart recovery must not close the running turn
        with srv.client() as c:
            info = c.get(f"/v1/sessions/{recorder.session_id}").json()
    assert info["status"] == "running" and info["last_seq"] == 0
    recorder.release()
    assert not run_in_progress(data, recorder.session_id)
    with ServerProcess(data_dir=data) as srv:  # once the run is gone (killed), its turn is closed
        with srv.client() as c:
            assert c.get(f"/v1/sessions/{recorder.session_id}").json()["status"] == "idle"


@pytest.mark.timeout(240)
def test_a_run_with_external_mcp_tools_reexecutes_them_from_the_recording(
        tmp_path: Path, project: tuple[Path, Path]) -> None:
    """`flywheel run --mcp` keeps the external tools' specs in the session's source, so a
    re-execution (by a server with no MCP server configured) answers their calls from the
    recording: nothing differs, and nothing is reported as an unknown tool."""
    src, _ = project
    tiny = Path(__file__).parents[1] / "tools" / "mcp_servers" / "tiny.py"
    script = tmp_path / "mcp.json"
    script.write_text(json.dumps([call("mcp__tiny__counter", {}) + call("mcp__tiny__add", {"a": "2", "b": "3"})
                                  + call("read_file", {"path": "app.py"}), "done"]))
    data = tmp_path / "data"
    r = flywheel("run", "--workspace", str(src), "--policy", f"scripted:{script}", "--mcp",
                 f"tiny={sys.executable} {tiny}", "--json", "--discard", "count", data=data)
    assert r.returncode == 0, r.stderr
    results = {e["name"]: e for e in map(json.loads, r.stdout.splitlines()) if e["type"] == "tool_result"}
    assert (results["mcp__tiny__counter"]["output"], results["mcp__tiny__add"]["output"]) == ("call 1", "5")
    sid = r.stderr.split("recorded as session ")[1].split()[0]
    (row,) = [json.loads(line) for line in flywheel("sessions", "list", "--json", data=data).stdout.splitlines()]
    recorded = {t["name"]: t for t in row["source"]["external_tools"]}
    assert {"mcp__tiny__counter", "mcp__tiny__add", "mcp__tiny__echo"} <= set(recorded)
    assert [p["name"] for p in recorded["mcp__tiny__add"]["params"]] == ["a", "b"]
    with ServerProcess(data_dir=data, allow_roots=[src]) as srv:  # its tool set has no mcp__tiny__* tools
        with srv.client() as c:
            report = c.post(f"/v1/sessions/{sid}/reexecute").json()
        assert report["counts"] == {"same": 1, "differs": 0, "missing": 0, "extra": 0, "recorded": 2}, report
        assert {x["name"]: x["status"] for x in report["calls"]} == {
            "mcp__tiny__counter": "recorded", "mcp__tiny__add": "recorded", "read_file": "same"}
        again = flywheel("replay", sid, "--reexecute", data=data, FLYWHEEL_SERVER=srv.url, FLYWHEEL_TOKEN=srv.token)
        assert again.returncode == 0, again.stderr
        assert "1 same, 0 differ, 0 missing, 0 extra, 2 from the recording" in again.stdout, again.stdout
