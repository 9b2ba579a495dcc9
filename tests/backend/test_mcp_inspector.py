"""The MCP Inspector's CLI mode (``@modelcontextprotocol/inspector --cli``), an outside client
nobody here wrote, against ``flywheel mcp`` over stdio and over HTTP. It is installed from
tests/clients/mcp/package-lock.json by ``scripts/setup.sh --test`` (``npm ci``); nothing is
downloaded when the tests run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from backend.server_process import REPO
from tests.backend.mcp_procs import TOKEN, child_env, http_server

INSPECTOR = REPO / "tests" / "clients" / "mcp" / "node_modules" / ".bin" / "mcp-inspector"
pytestmark = [
    pytest.mark.skipif(not INSPECTOR.exists(), reason="the MCP Inspector is not installed: run scripts/setup.sh "
                       "--test (npm ci in tests/clients/mcp)"),
    pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed (scripts/setup.sh --test)"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
    pytest.mark.timeout(180),
]


def inspector(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MCP_CATALOG_PATH": str(tmp_path / "catalog.json"), "NO_COLOR": "1"}
    return subprocess.run([str(INSPECTOR), "--cli", *args], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path)


def stdio_target(served: Path, mode: str = "auto") -> list[str]:
    env = [x for k, v in child_env().items() for x in ("-e", f"{k}={v}")]
    return [*env, "--cwd", str(REPO), sys.executable, "-m", "backend.cli", "mcp", "--workspace", str(served),
            "--approval-mode", mode]


def output(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout)


@pytest.fixture
def served(tmp_path: Path) -> Path:
    d = tmp_path / "served"
    d.mkdir()
    (d / "app.py").write_text("def add(a, b):\n    return a - b\n")
    return d


def test_inspector_over_stdio_lists_calls_and_sees_errors(tmp_path: Path, served: Path) -> None:
    listed = inspector(tmp_path, *stdio_target(served), "--method", "tools/list")
    assert listed.returncode == 0, listed.stderr
    tools = {t["name"]: t for t in output(listed)["tools"]}
    assert set(tools) == {"read_file", "list_dir", "glob", "grep", "edit_file", "write_file", "run_command"}
    assert tools["read_file"]["inputSchema"]["required"] == ["path"]
    read = inspector(tmp_path, *stdio_target(served), "--method", "tools/call", "--tool-name", "read_file",
                     "--tool-arg", "path=app.py", "--tool-arg", "start_line=2")
    assert read.returncode == 0, read.stderr
    result = output(read)
    assert result["isError"] is False and result["content"] == [{"type": "text", "text": "    2\t    return a - b\n"}]
    assert result["structuredContent"]["data"]["start_line"] == 2
    edit_args = ("--method", "tools/call", "--tool-name", "edit_file", "--tool-arg", "path=app.py",
                 "--tool-arg", "search=a - b", "--tool-arg", "replace=a + b")
    # The Inspector's CLI does not take elicitation: in the default mode (ask-edits) the edit is
    # refused with a result that says how to let the client decide, and nothing is written.
    asked = inspector(tmp_path, *stdio_target(served, "ask-edits"), *edit_args)
    assert asked.returncode != 0 and '"isError": true' in asked.stdout, asked.stdout
    assert "does not support elicitation" in asked.stdout and "--approval-mode auto" in asked.stdout
    assert (served / "app.py").read_text() == "def add(a, b):\n    return a - b\n"
    edit = inspector(tmp_path, *stdio_target(served), *edit_args)
    assert edit.returncode == 0, edit.stderr
    assert (served / "app.py").read_text() == "def add(a, b):\n    return a + b\n"
    outside = inspector(tmp_path, *stdio_target(served), "--method", "tools/call", "--tool-name", "read_file",
                        "--tool-arg", "path=../../etc/passwd")
    assert outside.returncode != 0  # the Inspector exits non-zero on an error result, and prints it
    assert '"isError": true' in outside.stdout and "escapes the workspace" in outside.stdout
    assert "root:" not in outside.stdout


def test_inspector_over_http_needs_the_token(tmp_path: Path, served: Path) -> None:
    with http_server(served, "--approval-mode", "ask-commands") as srv:
        refused = inspector(tmp_path, srv.url, "--transport", "http", "--header", f"Authorization: Bearer {TOKEN}",
                            "--method", "tools/call", "--tool-name", "run_command", "--tool-arg", "command=echo hi")
        assert refused.returncode != 0 and "does not support elicitation" in refused.stdout, refused.stdout
    with http_server(served, "--approval-mode", "auto") as srv:
        ok = inspector(tmp_path, srv.url, "--transport", "http", "--header", f"Authorization: Bearer {TOKEN}",
                       "--method", "tools/call", "--tool-name", "run_command", "--tool-arg", "command=echo hi; pwd")
        assert ok.returncode == 0, ok.stderr
        assert output(ok)["content"][0]["text"] == "exit code 0\nhi\n/workspace\n"
        refused = inspector(tmp_path, srv.url, "--transport", "http", "--method", "tools/list")
        assert refused.returncode != 0 and "read_file" not in refused.stdout
        said = refused.stdout + refused.stderr  # it reads the 401's WWW-Authenticate as "authorization needed"
        assert "401" in said or '"code":"auth_required"' in said, said
