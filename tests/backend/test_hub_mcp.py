"""``flywheel serve`` with external MCP servers (its --mcp-config file): every session gets their
tools, records their specs, and a re-execution answers their calls from the recording instead of
calling the server again; a branch that goes on calls the live server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agent.parser import encode_call as call
from tests.backend.conftest import make_api
from tests.backend.test_branching import events_of

SERVERS = Path(__file__).parents[1] / "tools" / "mcp_servers"


@pytest.fixture
def api(tmp_path: Path):
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"tiny": {"command": sys.executable,
                                                          "args": [str(SERVERS / "tiny.py")],
                                                          "connect_timeout": 90}}}))
    with make_api(f"sqlite:///{tmp_path / 'fw.db'}", tmp_path, semantic_search=False, sandbox=False,
                  mcp_config=config) as a:
        yield a


@pytest.mark.timeout(240)
def test_sessions_use_replay_and_branch_with_external_tools(api) -> None:
    h = api.h("alice")
    s = api.create("alice", [call("mcp__tiny__counter", {}) + call("read_file", {"path": "app.py"}), "done"])
    recorded = {t["name"] for t in s["source"]["external_tools"]}
    assert {"mcp__tiny__add", "mcp__tiny__counter"} <= recorded
    api.client.post(f"/v1/sessions/{s['id']}/messages", json={"text": "count"}, headers=h)
    events = events_of(api, s["id"], 1)
    results = {e["name"]: e for e in events if e["type"] == "tool_result"}
    assert results["mcp__tiny__counter"]["ok"] and results["mcp__tiny__counter"]["output"] == "call 1"
    report = api.client.post(f"/v1/sessions/{s['id']}/reexecute", headers=h).json()
    assert report["counts"] == {"same": 1, "differs": 0, "missing": 0, "extra": 0, "recorded": 1}, report
    assert {c["name"]: c["status"] for c in report["calls"]} == {"mcp__tiny__counter": "recorded",
                                                                 "read_file": "same"}
    # a branch that calls the tool again reaches the live server, which was not called by the replay
    r = api.client.post(f"/v1/sessions/{s['id']}/branch", headers=h, json={
        "from_step": 0, "policy": {"kind": "scripted", "outputs": [call("mcp__tiny__counter", {}), "ok"]}})
    assert r.status_code == 201, r.text
    api.client.post(f"/v1/sessions/{r.json()['id']}/messages", json={"text": "count again"}, headers=h)
    branch = events_of(api, r.json()["id"], 1)
    (again,) = [e for e in branch if e["type"] == "tool_result"]
    assert again["ok"] and again["output"] == "call 2"


def test_a_bad_mcp_config_stops_serve_with_one_line(tmp_path: Path) -> None:
    import subprocess

    from backend.server_process import REPO

    bad = tmp_path / "mcp.toml"
    bad.write_text('[mcp_servers.x]\ncommand = "a"\nurl = "http://h"\n')
    done = subprocess.run([sys.executable, "-m", "backend.cli", "serve", "--data-dir", str(tmp_path / "d"),
                           "--mcp-config", str(bad)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (f"flywheel serve: {bad}: MCP server 'x': give either a "
                                                    "command (stdio) or a url (http)")
