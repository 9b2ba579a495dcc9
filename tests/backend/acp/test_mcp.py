"""The editor's ``mcpServers`` as the session's tools: a real MCP server subprocess (the
tiny server of the MCP client tests), named in ``session/new`` / ``session/load`` by the
Python SDK's client side, called by the scripted model, recorded so a re-execution answers
from the recording, and stopped when the editor goes away."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
import uuid
from pathlib import Path

import pytest
from acp import text_block
from acp.schema import McpServerStdio
from sqlalchemy import create_engine, text

from tests.backend.acp.conftest import EditorClient, call, running_agent, script
from tests.backend.acp.test_agent import _host_processes_with

pytestmark = pytest.mark.timeout(300)

TINY = Path(__file__).parents[2] / "tools" / "mcp_servers" / "tiny.py"


def tiny_server(tmp_path: Path, name: str = "tiny") -> tuple[McpServerStdio, str]:
    """The tiny server under a path no other process has (to find its process)."""
    path = tmp_path / f"tiny_{uuid.uuid4().hex[:12]}.py"
    shutil.copy(TINY, path)
    return McpServerStdio(name=name, command=sys.executable, args=[str(path)],
                          env=[{"name": "TINY_SECRET", "value": "s3cr3t"}]), str(path)


def _source(data: Path, sid: str) -> dict:
    engine = create_engine(f"sqlite:///{data / 'flywheel.db'}")
    with engine.connect() as db:
        raw = db.execute(text("select source from sessions where id = :i"), {"i": sid}).scalar_one()
    engine.dispose()
    return raw if isinstance(raw, dict) else json.loads(raw)


async def _prompt(conn, sid: str, what: str = "go"):
    return await asyncio.wait_for(conn.prompt(session_id=sid, prompt=[text_block(what)]), 60)


def _final(client: EditorClient, call_id: str) -> dict:
    return client.call_updates(call_id)[-1]


async def test_a_session_calls_its_clients_mcp_server_records_it_and_stops_it(tmp_path: Path, project: Path) -> None:
    server, marker = tiny_server(tmp_path)
    outputs = [call("mcp__tiny__add", a="2", b="3") + call("mcp__tiny__counter"), "added"]
    client = EditorClient()
    data = tmp_path / "data"
    policy = f"scripted:{script(tmp_path, outputs)}"
    async with running_agent(client, data, "--mode", "auto", "--policy", policy) as conn:
        resp = await asyncio.wait_for(conn.new_session(cwd=str(project), mcp_servers=[server]), 120)
        (status,) = resp.field_meta["flywheel"]["mcpServers"]
        assert status["connected"] is True and status["name"] == "tiny"
        assert {"mcp__tiny__add", "mcp__tiny__counter"} <= set(status["tools"])
        assert _host_processes_with(marker), "the server should be running"
        assert (await _prompt(conn, resp.session_id)).stop_reason == "end_turn"
    added, counted = _final(client, "t1s1c0"), _final(client, "t1s1c1")
    assert added["status"] == "completed" and added["content"][0]["content"]["text"] == "5"
    assert counted["status"] == "completed" and counted["content"][0]["content"]["text"] == "call 1"
    deadline = time.monotonic() + 10
    while _host_processes_with(marker) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not _host_processes_with(marker), "the server should stop with the editor's connection"
    source = _source(data, resp.session_id)
    assert {"mcp__tiny__add", "mcp__tiny__counter"} <= {t["name"] for t in source["external_tools"]}
    assert source["mcp_servers"][0]["command"] == sys.executable
    assert "s3cr3t" not in json.dumps(source)  # the server's environment is never recorded

    # a re-execution answers the MCP calls from the recording: the server is not running now
    from tests.backend.conftest import make_api

    with make_api(f"sqlite:///{data / 'flywheel.db'}", tmp_path, semantic_search=False, sandbox=False) as api:
        report = api.client.post(f"/v1/sessions/{resp.session_id}/reexecute", headers=api.h("sue")).json()
    assert {c["name"]: c["status"] for c in report["calls"]} == {"mcp__tiny__add": "recorded",
                                                                 "mcp__tiny__counter": "recorded"}, report


async def test_a_server_that_is_down_does_not_fail_session_new_and_the_user_is_told(
        tmp_path: Path, project: Path) -> None:
    good, _ = tiny_server(tmp_path)
    down = McpServerStdio(name="docs server", command=str(tmp_path / "no-such-mcp-server"), args=[], env=[])
    outputs = [call("mcp__docs_server__search", q="x") + call("mcp__tiny__add", a="1", b="1"), "ok"]
    client = EditorClient()
    async with running_agent(client, tmp_path / "data", "--mode", "auto", "--policy",
                             f"scripted:{script(tmp_path, outputs)}") as conn:
        resp = await asyncio.wait_for(conn.new_session(cwd=str(project), mcp_servers=[good, down]), 120)
        servers = {s["name"]: s for s in resp.field_meta["flywheel"]["mcpServers"]}
        assert servers["tiny"]["connected"] is True
        assert servers["docs_server"]["connected"] is False  # its name, made fit for tool names
        assert "no-such-mcp-server" in servers["docs_server"]["command"] and servers["docs_server"]["error"]
        assert (await _prompt(conn, resp.session_id)).stop_reason == "end_turn"
    chunks = client.of("agent_message_chunk")
    assert chunks[0]["content"]["text"].startswith("[MCP server 'docs_server' is not connected: ")
    unknown = _final(client, "t1s1c0")
    assert unknown["status"] == "failed" and "mcp__docs_server__search" in unknown["content"][0]["content"]["text"]
    assert _final(client, "t1s1c1")["content"][0]["content"]["text"] == "2"


async def test_session_load_connects_the_servers_it_is_given(tmp_path: Path, project: Path) -> None:
    server, marker = tiny_server(tmp_path)
    outputs = ["first, without tools", call("mcp__tiny__echo", text="hello"), "echoed"]
    policy = f"scripted:{script(tmp_path, outputs)}"
    data = tmp_path / "data"
    first = EditorClient()
    async with running_agent(first, data, "--mode", "auto", "--policy", policy) as conn:
        sid = (await conn.new_session(cwd=str(project), mcp_servers=[])).session_id
        await _prompt(conn, sid)
    assert "external_tools" not in _source(data, sid)
    again = EditorClient()
    async with running_agent(again, data, "--mode", "auto", "--policy", policy) as conn:
        resp = await asyncio.wait_for(conn.load_session(cwd=str(project), session_id=sid, mcp_servers=[server]), 120)
        assert resp.field_meta["flywheel"]["mcpServers"][0]["connected"] is True
        assert (await _prompt(conn, sid, "echo")).stop_reason == "end_turn"
    assert _final(again, "t2s1c0")["content"][0]["content"]["text"] == "hello"
    assert "mcp__tiny__echo" in {t["name"] for t in _source(data, sid)["external_tools"]}
    assert not _host_processes_with(marker)
