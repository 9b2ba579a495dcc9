"""``flywheel acp --server URL --token T``: the thin bridge to a real ``flywheel serve``."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest
from acp import text_block
from acp.schema import McpServerStdio

from tests.backend.acp.conftest import FIX, EditorClient, agent_env, running_agent, script

pytestmark = pytest.mark.timeout(240)  # a server and flywheel acp start (slow on a busy machine)


@pytest.fixture
def server(tmp_path: Path, project: Path):
    cmd = [sys.executable, "-m", "backend.cli", "serve", "--port", "0", "--data-dir", str(tmp_path / "server"),
           "--allow-root", str(project.parent)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=agent_env())
    url = token = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if m := re.search(r"serving at (http://\S+)", line):
            url = m.group(1)
        if m := re.match(r"token: (\S+)", line):
            token = m.group(1)
        if url and token:
            break
    assert url and token, "the server did not start"
    yield url, token
    proc.terminate()
    proc.wait(20)
    proc.stdout.close()


async def test_the_bridge_runs_the_session_on_the_server(tmp_path: Path, project: Path, server) -> None:
    url, token = server
    client = EditorClient()
    async with running_agent(client, tmp_path / "acp-data", "--server", url, "--token", token,
                             "--policy", f"scripted:{script(tmp_path, FIX)}") as conn:
        docs = McpServerStdio(name="docs", command="docs-mcp", args=[], env=[{"name": "K", "value": "s3"}])
        new = await conn.new_session(cwd=str(project), mcp_servers=[docs])
        sid = new.session_id
        resp = await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block("fix add")]), 30)
    assert resp.stop_reason == "end_turn"
    # the editor's MCP servers do not reach the server's sessions, and the user is told
    (status,) = new.field_meta["flywheel"]["mcpServers"]
    assert status["connected"] is False and "sessions run on the server" in status["error"]
    assert client.of("agent_message_chunk")[0]["content"]["text"].startswith("[MCP server 'docs' is not connected")
    assert [u["kind"] for u in client.of("tool_call")] == ["read", "edit", "execute"]
    assert [p["toolCallId"] for p in client.permissions] == ["t1s3c0"]  # asked over the server's WebSocket
    done = [u for u in client.call_updates("t1s3c0") if u.get("status") == "completed"][-1]
    assert "\n5\n" in done["content"][0]["content"]["text"]  # the server's workspace has the fix
    diff = [c for u in client.call_updates("t1s2c0") for c in u.get("content", []) if c["type"] == "diff"][-1]
    assert diff["path"] == str(project / "calc.py")
    assert "return a - b" in diff["oldText"] and "return a + b" in diff["newText"]
    # the edit stayed in the server's workspace: the editor's files are untouched
    assert client.writes == [] and (project / "calc.py").read_text().endswith("a - b\n")
    assert not (tmp_path / "acp-data").exists()  # nothing recorded locally


async def test_a_wrong_token_is_refused_at_start(tmp_path: Path, server) -> None:
    url, _ = server
    cmd = [sys.executable, "-m", "backend.cli", "acp", "--server", url, "--token", "fw_wrong", "--policy", "demo"]
    done = subprocess.run(cmd, input=b"", capture_output=True, env=agent_env(), timeout=30)
    assert done.returncode == 1 and done.stdout == b""
    assert "401" in done.stderr.decode()
