"""End to end: a real server process, a real model server over HTTP, the CLIs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from agent.parser import encode_call as call
from backend.server_process import REPO, ServerProcess
from tests.openai_server import ScriptedChatServer


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    d.mkdir()
    (d / "app.py").write_text("def add(a, b):\n    return a - b\n")
    return d


async def run_turn_over_ws(url: str, token: str, sid: str, text: str) -> list[dict]:
    ws_url = url.replace("http://", "ws://") + f"/v1/sessions/{sid}/ws"
    events = []
    async with connect(ws_url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        await ws.send(json.dumps({"type": "user_message", "text": text}))
        while not events or events[-1]["type"] != "turn_end":
            events.append(json.loads(await asyncio.wait_for(ws.recv(), 20)))
    return events


def test_openai_policy_against_a_real_model_server(tmp_path: Path, src: Path) -> None:
    model = ScriptedChatServer([
        "Let me look. " + call("read_file", {"path": "app.py"}),
        call("edit_file", {"path": "app.py", "search": "a - b", "replace": "a + b"}),
        "It subtracted; now it adds.",
    ])
    with model.running(), ServerProcess(data_dir=tmp_path / "data", allow_roots=[src],
                                        extra_args=["--openai-base-url", model.base_url,
                                                    "--openai-model", "scripted"]) as srv:
        with srv.client() as c:
            r = c.post("/v1/sessions", json={"workspace": {"path": str(src)}, "policy": {"kind": "openai"}})
            assert r.status_code == 201, r.text
            sid = r.json()["id"]
        events = asyncio.run(run_turn_over_ws(srv.url, srv.token, sid, "fix add"))
        assert events[-1]["reason"] == "completed", events[-1]
        assert any(e["type"] == "file_edit" and "+    return a + b" in e["diff"] for e in events)
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        # the model server received the rendered conversation, tool results included
        assert "return a - b" in model.requests[1]["body"]["messages"][-1]["content"]
        assert model.requests[0]["body"]["model"] == "scripted"


def flywheel(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "backend.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, "NO_COLOR": "1", **(env or {})})


def test_replay_cli_view_reexecute_branch(tmp_path: Path, src: Path) -> None:
    outputs = [call("read_file", {"path": "app.py"}) + call("grep", {"pattern": "return"}),
               call("edit_file", {"path": "app.py", "search": "a - b", "replace": "a + b"}), "done"]
    with ServerProcess(data_dir=tmp_path / "data", allow_roots=[src]) as srv:
        with srv.client() as c:
            sid = c.post("/v1/sessions", json={"workspace": {"path": str(src)},
                                               "policy": {"kind": "scripted", "outputs": outputs}}).json()["id"]
        asyncio.run(run_turn_over_ws(srv.url, srv.token, sid, "fix"))
        env = {"FLYWHEEL_SERVER": srv.url, "FLYWHEEL_TOKEN": srv.token}
        view = flywheel("replay", sid, env=env)
        assert view.returncode == 0, view.stderr
        assert "▶ edit_file" in view.stdout and "[+0.000s #1]" in view.stdout
        again = flywheel("replay", sid, "--reexecute", env=env)
        assert again.returncode == 0 and "3 same, 0 differ, 0 missing, 0 extra" in again.stdout
        branch = flywheel("replay", sid, "--from-step", "1", "--policy",
                          json.dumps({"kind": "scripted", "outputs": ["stop here"]}), "--json", env=env)
        assert branch.returncode == 0, branch.stderr
        assert json.loads(branch.stdout)["parent_id"] == sid
        bad = flywheel("replay", sid, "--from-step", "1", env=env)
        assert bad.returncode == 1 and "go together" in bad.stderr
        nope = flywheel("replay", "no-such-session", env=env)
        assert nope.returncode == 1 and "HTTP 404" in nope.stderr and "Traceback" not in nope.stderr


def test_serve_refuses_a_public_address_without_tokens(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "backend.cli", "serve", "--host", "0.0.0.0", "--port", "0",
                        "--data-dir", str(tmp_path / "d")], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 1 and "no API token exists" in r.stderr


def test_token_create_cli(tmp_path: Path) -> None:
    r = flywheel("token", "create", "--name", "carol", "--role", "staff", "--data-dir", str(tmp_path / "d"),
                 "--create-db")
    assert r.returncode == 0 and r.stdout.startswith("fw_")
    dup = flywheel("token", "create", "--name", "carol", "--data-dir", str(tmp_path / "d"))
    assert dup.returncode == 1 and "already exists" in dup.stderr
