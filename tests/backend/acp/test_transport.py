"""Hostile input on ``flywheel acp``'s stdin: every bad line gets a JSON-RPC error and
the process stays up (raw bytes on a real subprocess, no SDK in between)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.backend.acp.conftest import agent_command, agent_env, script

pytestmark = pytest.mark.timeout(60)


class Raw:
    """``flywheel acp`` on pipes; one JSON-RPC line in, the next answer out."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        cmd = agent_command(tmp_path / "data", "--policy", f"scripted:{script(tmp_path, ['hi'])}", *args)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=agent_env())

    def send(self, raw: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(raw if raw.endswith(b"\n") else raw + b"\n")
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the agent closed stdout; stderr: {self.proc.stderr.read().decode() if self.proc.stderr else ''}"
        return json.loads(line)  # type: ignore[no-any-return]

    def request(self, id_: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.send(json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}).encode())
        return self.answer()

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(20)

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def raw(tmp_path: Path):
    agent = Raw(tmp_path, "--max-message-bytes", "65536")
    yield agent
    agent.release()


def test_bad_lines_get_errors_and_the_agent_stays_up(raw: Raw, tmp_path: Path) -> None:
    raw.send(b"{not json")
    assert raw.answer()["error"]["code"] == -32700
    raw.send(b"\xff\xfe garbage")
    assert raw.answer()["error"]["code"] == -32700
    raw.send(b"[1, 2, 3]")
    err = raw.answer()
    assert err["error"]["code"] == -32600 and "batches" in err["error"]["message"] and err["id"] is None
    raw.send(b'{"jsonrpc": "2.0", "id": 7, "method": 12}')
    assert raw.answer() == {"jsonrpc": "2.0", "id": 7,
                            "error": {"code": -32600, "message": 'invalid request: "method" must be a string'}}
    raw.send(b'{"jsonrpc": "1.0", "id": 8, "method": "initialize"}')
    assert raw.answer()["error"]["code"] == -32600
    raw.send(b'"just a string"')
    assert raw.answer()["error"]["code"] == -32600
    # unknown methods and bad params: the SDK's router answers
    assert raw.request(9, "no/such_method", {})["error"]["code"] == -32601
    bad = raw.request(10, "session/new", {"mcpServers": []})  # no cwd
    assert bad["error"]["code"] == -32602 and bad["error"]["data"]["errors"][0]["loc"] == ["cwd"]
    # and the agent still works
    ok = raw.request(11, "initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    assert ok["id"] == 11 and ok["result"]["protocolVersion"] == 1
    assert ok["result"]["agentCapabilities"]["loadSession"] is True
    assert raw.close() == 0


def test_a_huge_message_is_refused_with_its_id_and_the_agent_goes_on(raw: Raw, tmp_path: Path) -> None:
    assert raw.request(1, "initialize", {"protocolVersion": 1})["id"] == 1
    project = tmp_path / "p"
    project.mkdir()
    sid = raw.request(2, "session/new", {"cwd": str(project), "mcpServers": []})["result"]["sessionId"]
    huge = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
                       "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "x" * 300_000}]}})
    raw.send(huge.encode())
    err = raw.answer()
    assert err["id"] == 3 and err["error"]["code"] == -32600 and "too large" in err["error"]["message"]
    resp = raw.request(4, "session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]})
    updates: list[dict[str, Any]] = []
    while "method" in resp:  # session/update notifications come before the answer
        updates.append(resp)
        resp = raw.answer()
    assert resp == {"jsonrpc": "2.0", "id": 4, "result": {"stopReason": "end_turn"}}
    assert updates[0]["params"]["update"] == {"sessionUpdate": "agent_message_chunk",
                                              "content": {"type": "text", "text": "hi"}}
    assert raw.close() == 0


def test_stdout_carries_only_the_protocol(tmp_path: Path) -> None:
    """A stray print in the agent's process goes to stderr, not into the JSON-RPC stream."""
    agent = Raw(tmp_path)
    try:
        assert agent.request(1, "initialize", {"protocolVersion": 1})["id"] == 1
        agent.proc.stdin.close()  # type: ignore[union-attr]
        rest = agent.proc.stdout.read()  # type: ignore[union-attr]
        assert rest == b""
        assert agent.proc.wait(20) == 0
    finally:
        agent.release()


def test_a_bad_policy_is_refused_at_start_in_one_line(tmp_path: Path) -> None:
    cmd = agent_command(tmp_path / "data", "--policy", "openai")
    env = agent_env()
    env.pop("FLYWHEEL_OPENAI_BASE_URL", None)
    done = subprocess.run(cmd, input=b"", capture_output=True, env=env, timeout=30)
    assert done.returncode == 1 and done.stdout == b""
    assert "no model server configured" in done.stderr.decode()
