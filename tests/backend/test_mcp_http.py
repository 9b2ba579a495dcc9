"""``flywheel mcp --transport http``: the official client with the token (list, call each tool,
errors), refusals without it, and Flywheel's own MCP client using it inside a session."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from agent.events import ListSink, ToolResultEvent
from agent.parser import encode_call as call
from agent.policies.scripted import ScriptedPolicy
from agent.runtime import SessionParts, build_session
from tests.backend.mcp_procs import TOKEN, flywheel_mcp_argv, http_server
from tools.mcp_client import McpServerConfig, connect_mcp_servers
from tools.workspace import WorkspaceStore

pytestmark = [pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
              pytest.mark.timeout(120)]
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture
def served(tmp_path: Path) -> Path:
    d = tmp_path / "served"
    (d / "src").mkdir(parents=True)
    (d / "src" / "app.py").write_text("def add(a, b):\n    return a - b\n")
    return d


async def test_the_official_client_lists_and_calls_every_tool_with_the_token(served: Path) -> None:
    with http_server(served, "--approval-mode", "auto") as srv:
        assert srv.url.startswith("http://127.0.0.1:") and srv.token == TOKEN
        async with create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"}) as http, \
                Client(streamable_http_client(srv.url, http_client=http), mode="legacy") as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert names == {"read_file", "list_dir", "glob", "grep", "edit_file", "write_file", "run_command"}
            calls = [("read_file", {"path": "src/app.py"}, "    1\tdef add(a, b):\n    2\t    return a - b\n"),
                     ("list_dir", {}, "src/\n"), ("glob", {"pattern": "**/*.py"}, "src/app.py\n"),
                     ("grep", {"pattern": "return"}, "src/app.py:2: "),
                     ("edit_file", {"path": "src/app.py", "search": "a - b", "replace": "a + b"}, "+    return a + b"),
                     ("write_file", {"path": "new.txt", "content": " x \n"}, "+ x "),
                     ("run_command", {"command": "cat new.txt; pwd"}, "exit code 0\n x \n/workspace\n")]
            for name, args, expected in calls:
                result = await client.call_tool(name, args)
                assert not result.is_error, (name, result)
                assert expected in result.content[0].text, (name, result.content[0].text)
            bad = await client.call_tool("read_file", {"path": "/etc/passwd"})
            assert bad.is_error and "root:" not in bad.content[0].text
            unknown = await client.call_tool("read_file", {"path": "src/app.py", "lines": 3})
            assert unknown.is_error and "unknown parameter 'lines'" in unknown.content[0].text
        assert (served / "src" / "app.py").read_text() == "def add(a, b):\n    return a + b\n"


async def test_requests_without_the_right_token_or_from_another_host_are_refused(served: Path) -> None:
    with http_server(served) as srv:
        async with httpx2.AsyncClient(timeout=10) as http:
            for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN}):
                r = await http.post(srv.url, json=INIT, headers={**ACCEPT, **headers})
                assert r.status_code == 401 and "bearer token" in r.json()["error"]["message"]
                assert r.headers["www-authenticate"].startswith("Bearer")
            auth = {"Authorization": f"Bearer {TOKEN}"}
            rebind = await http.post(srv.url, json=INIT, headers={**ACCEPT, **auth, "Host": "evil.example:80"})
            assert rebind.status_code in (403, 421)  # the SDK's DNS-rebinding guard on a loopback host
            huge = await http.post(srv.url, content=b'{"x": "' + b"y" * (5 << 20) + b'"}', headers={**ACCEPT, **auth})
            assert huge.status_code == 413
            ok = await http.post(srv.url, json=INIT, headers={**ACCEPT, **auth})
            assert ok.status_code == 200  # still serving after all that
        toolset = await connect_mcp_servers([McpServerConfig("fw", url=srv.url, connect_timeout_s=10,
                                                             headers={"Authorization": "Bearer nope-0123456789abc"})])
        assert toolset.tools == [] and "fw" in toolset.failures
        await toolset.close()


def test_http_without_a_token_makes_one_and_prints_it(served: Path) -> None:
    with http_server(served, token=None) as srv:
        assert srv.token.startswith("fw_mcp_") and len(srv.token) > 30


def test_bad_flags_are_one_line_errors(served: Path) -> None:
    import subprocess

    from backend.server_process import REPO

    for extra, message in ((["--token", "short"], "at least 16 characters"),
                           (["--transport", "stdio", "--token", TOKEN], "--token is for --transport http"),
                           (["--port", "70000"], "not a port number")):
        argv = flywheel_mcp_argv(served, *extra)
        if "--transport" not in extra:
            argv += ["--transport", "http"]
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr, done.stderr
    done = subprocess.run([sys.executable, "-m", "backend.cli", "mcp", "--workspace", str(served / "nope")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not a directory" in done.stderr


async def test_a_flywheel_session_uses_flywheel_mcp_as_an_external_server(served: Path, tmp_path: Path) -> None:
    """Flywheel's own client (tools.mcp_client) on flywheel mcp: byte-exact text parameters
    survive the round trip, and the scripted policy's calls are recorded like any other."""
    with http_server(served, "--approval-mode", "auto") as srv:
        config = McpServerConfig("fw", url=srv.url, headers={"Authorization": f"Bearer {TOKEN}"})
        async with await connect_mcp_servers([config]) as toolset:
            assert toolset.failures == {}
            write = next(t for t in toolset.tools if t.spec.name == "mcp__fw__write_file")
            assert write.spec.param("content").type.value == "text"  # type: ignore[union-attr]
            own = WorkspaceStore(tmp_path / "store").from_dir(tmp_path / "served")
            outputs = [call("mcp__fw__write_file", {"path": "out.txt", "content": "\n  spaced  \n"})
                       + call("mcp__fw__read_file", {"path": "src/app.py"}), "done"]
            sink = ListSink()
            session = build_session(SessionParts(own, extra_tools=tuple(toolset.tools)),
                                    policy=ScriptedPolicy(outputs), sink=sink)
            assert (await session.run_turn("write it")).reason == "completed"
            results = sorted((e.call_id, e.ok, e.output) for e in sink.events if isinstance(e, ToolResultEvent))
            assert [r[1] for r in results] == [True, True]
            assert "    2\t    return a - b\n" in results[1][2]
        assert (served / "out.txt").read_text() == "\n  spaced  \n"  # written by the server, in its directory
        assert not (own.root / "out.txt").exists()  # not in the session's own workspace
        own.delete()
