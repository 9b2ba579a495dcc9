"""``flywheel mcp`` over stdio with the official ``mcp`` Python client: every tool gives byte for
byte what the agent's own call gives; hostile input gets JSON-RPC errors and the process stays up."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from agent.events import ListSink, ToolResultEvent
from agent.parser import encode_call
from agent.policies.scripted import ScriptedPolicy
from agent.runtime import SessionParts, build_session
from agent.session import Limits
from agent.tool_runner import raw_params
from backend.mcp_server import MAX_LINE_BYTES, call_result
from backend.server_process import REPO
from tests.backend.mcp_procs import child_env, flywheel_mcp_argv, stdio_params
from tools.base import FileEdit, ToolResult
from tools.sandbox import make_sandbox
from tools.workspace import WorkspaceStore

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

APP = 'def add(a, b):\n    """Add two numbers."""\n    return a - b\n\n\ndef mean(xs):\n    return sum(xs) / len(xs)\n'

# One sequence of calls, run in this order on both sides (edits change what later calls see).
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("read_file", {"path": "src/app.py", "start_line": 2, "end_line": 3}),
    ("list_dir", {"path": "."}),
    ("glob", {"pattern": "**/*.py"}),
    ("grep", {"pattern": "def (add|mean)", "context": 1}),
    ("semantic_search", {"query": "average of a list of numbers", "k": 2}),
    ("edit_file", {"path": "src/app.py", "search": "a - b", "replace": "a + b"}),
    ("write_file", {"path": "notes/todo.md", "content": "  keep the spaces  \n<b>&amp;</b>\n"}),
    ("read_file", {"path": "notes/todo.md"}),
    ("run_command", {"command": "pwd; ls; python3 -c 'import sys; sys.path.insert(0, \"src\"); import app; "
                                "print(app.add(2, 3))'; echo oops >&2; exit 3"}),
    # errors, worded as the model reads them
    ("read_file", {"path": "../outside.txt"}),
    ("read_file", {"path": "missing.py"}),
    ("read_file", {"path": "src/app.py", "start_line": "x"}),
    ("grep", {"pattern": "a", "colour": True}),
    ("edit_file", {"path": "src/app.py", "search": "not there", "replace": "y"}),
    ("no_such_tool", {}),
]


def make_src(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text(APP)
    (root / "README.md").write_text("# demo\n\nAdds & averages <numbers>.\n")
    return root


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("index")


async def agent_results(tmp_path: Path, index_dir: Path) -> list[tuple[bool, str]]:
    """The same calls made by the scripted policy in a session, as the model reads the results."""
    from embeddings.index import WorkspaceIndex

    workspace = WorkspaceStore(tmp_path / "store").from_dir(make_src(tmp_path / "agent-src"))
    index = WorkspaceIndex(workspace.root, data_dir=index_dir)
    index.refresh()
    outputs = [encode_call(name, list(raw_params(args))) for name, args in CALLS] + ["done"]
    sink = ListSink()
    session = build_session(SessionParts(workspace, make_sandbox(), index), policy=ScriptedPolicy(outputs),
                            sink=sink, limits=Limits(max_steps=40))
    assert (await session.run_turn("go")).reason == "completed"
    index.close()
    return [(e.ok, e.output) for e in sink.events if isinstance(e, ToolResultEvent)]


@pytest.mark.timeout(300)
async def test_every_tool_over_stdio_gives_what_the_agent_gets(tmp_path: Path, index_dir: Path) -> None:
    expected = await agent_results(tmp_path, index_dir)
    served = make_src(tmp_path / "served")
    got: list[tuple[bool, str]] = []
    async with Client(stdio_params(served, "--semantic-search", "--approval-mode", "auto", FLYWHEEL_INDEX_DIR=str(index_dir)),
                      mode="legacy") as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert set(listed) == {"read_file", "list_dir", "glob", "grep", "edit_file", "write_file", "run_command",
                               "semantic_search"}
        assert listed["write_file"].input_schema["properties"]["content"] == {
            "type": "string", "contentMediaType": "text/plain", "description": "The complete new content of the file."}
        for name, args in CALLS:
            result = await client.call_tool(name, args)
            assert len(result.content) == 1 and result.content[0].type == "text"
            got.append((not result.is_error, result.content[0].text))
    assert len(got) == len(expected) == len(CALLS)
    for (name, args), mine, theirs in zip(CALLS, got, expected, strict=True):
        assert mine == theirs, f"{name} {args}"
    by_call = dict(zip((n for n, _ in CALLS), got, strict=False))
    assert "exit code 3" in got[8][1] and "/workspace" in got[8][1] and "5\n" in got[8][1] and not got[8][0]
    assert not by_call["no_such_tool"][0] and "unknown tool 'no_such_tool'" in by_call["no_such_tool"][1]
    assert (served / "src" / "app.py").read_text() == APP.replace("a - b", "a + b")  # edits land in place
    assert (served / "notes" / "todo.md").read_text() == "  keep the spaces  \n<b>&amp;</b>\n"


def test_call_result_carries_the_text_the_error_flag_and_the_edits() -> None:
    edit = FileEdit("a.py", "diff --git a/a.py b/a.py\n", created=True)
    result = call_result(ToolResult(False, "no", {"exit_code": 1}, [edit]))
    assert result.is_error and result.content[0].text == "no"
    assert result.structured_content == {"ok": False, "data": {"exit_code": 1}, "edits": [
        {"path": "a.py", "diff": "diff --git a/a.py b/a.py\n", "created": True, "deleted": False}]}


class RawStdio:
    """``flywheel mcp`` with our own pipes: write any bytes, read JSON lines."""

    def __init__(self, workspace: Path) -> None:
        self.proc = subprocess.Popen(flywheel_mcp_argv(workspace, "--approval-mode", "auto"), cwd=REPO, env={**os.environ, **child_env()},
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def request(self, obj: object) -> None:
        self.send(json.dumps(obj).encode() + b"\n")

    async def answer(self, timeout: float = 30) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), timeout)
        assert line, f"flywheel mcp closed stdout (exit {self.proc.poll()})"
        return json.loads(line)

    def close(self) -> int:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        code = self.proc.wait(30)
        self.proc.stdout.close()
        return code


@pytest.mark.timeout(120)
async def test_hostile_stdio_input_gets_json_rpc_errors_and_the_server_stays_up(tmp_path: Path) -> None:
    served = make_src(tmp_path / "served")
    (tmp_path / "secret.txt").write_text("do not leak\n")
    raw = RawStdio(served)
    try:
        raw.request({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        assert (await raw.answer())["result"]["serverInfo"]["name"] == "flywheel"
        raw.request({"jsonrpc": "2.0", "method": "notifications/initialized"})
        cases: list[tuple[bytes, object, int]] = [
            (b"this is not json\n", None, -32700),
            (b'{"jsonrpc": "2.0", "id": 5, "method": \n', None, -32700),  # cut off
            (b"[" * 100_000 + b"\n", None, -32700),  # nesting that would blow a recursive parser
            (json.dumps([{"jsonrpc": "2.0", "id": 6, "method": "ping"}]).encode() + b"\n", None, -32600),  # batch
            (json.dumps({"id": 7, "method": "ping"}).encode() + b"\n", 7, -32600),  # no "jsonrpc"
            (json.dumps({"jsonrpc": "2.0", "id": 8, "method": "no/such/method"}).encode() + b"\n", 8, -32601),
            (json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": 3}}).encode()
             + b"\n", 9, -32602),
            (b'{"jsonrpc": "2.0", "id": 10, "method": "ping", "pad": "' + b"x" * (MAX_LINE_BYTES + 10) + b'"}\n',
             None, -32700),  # too long: dropped unread
        ]
        for data, request_id, code in cases:
            raw.send(data)
            reply = await raw.answer()
            assert reply.get("id") == request_id and reply["error"]["code"] == code, (data[:60], reply)
        tools = {"read_file": {"path": str(tmp_path / "secret.txt")}, "list_dir": {"path": "../"},
                 "write_file": {"path": "../escape.txt", "content": "x"},
                 "run_command": {"command": f"cat {tmp_path / 'secret.txt'} /etc/shadow"}}
        for n, (name, args) in enumerate(tools.items(), start=20):
            raw.request({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": name, "arguments": args}})
            reply = await raw.answer()
            assert reply["id"] == n and reply["result"]["isError"] is True, reply
            assert "do not leak" not in json.dumps(reply)
        assert not (tmp_path / "escape.txt").exists()
        big = "y" * (3 << 20)  # a large but allowed message goes through whole
        raw.request({"jsonrpc": "2.0", "id": 30, "method": "tools/call",
                     "params": {"name": "write_file", "arguments": {"path": "big.txt", "content": big}}})
        assert (await raw.answer())["result"]["isError"] is False
        assert (served / "big.txt").read_text() == big
        raw.request({"jsonrpc": "2.0", "id": 31, "method": "ping"})
        assert await raw.answer() == {"jsonrpc": "2.0", "id": 31, "result": {}}
    finally:
        assert raw.close() == 0


@pytest.mark.timeout(120)
async def test_a_call_the_client_gives_up_on_is_cancelled_and_its_command_killed(tmp_path: Path) -> None:
    from mcp import MCPError

    served = make_src(tmp_path / "served")
    async with Client(stdio_params(served, "--approval-mode", "auto"), mode="legacy") as client:
        with pytest.raises(MCPError, match="timed out"):
            await client.call_tool("run_command", {"command": "sleep 3 && touch late.txt"}, read_timeout_seconds=1)
        await asyncio.sleep(3.5)
        assert not (served / "late.txt").exists()  # the sandboxed process tree was killed with the call
        assert (await client.call_tool("list_dir", {})).content[0].text.splitlines() == ["README.md", "src/"]
