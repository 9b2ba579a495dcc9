"""backend.mcp_config: --mcp flags, config files, the config file's [mcp_servers] tables; and
``flywheel run --mcp`` end to end (the scripted policy calls an external tool)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.parser import encode_call as call
from backend.mcp_config import config_file_servers, load_mcp_file, parse_mcp_flag
from backend.server_process import REPO
from backend.settings import ClientSettings, load_settings
from tools.mcp_client import McpConfigError

TINY = Path(__file__).parents[1] / "tools" / "mcp_servers" / "tiny.py"


def test_flags() -> None:
    stdio = parse_mcp_flag("fs=npx -y '@scope/server' --root 'my dir'")
    assert (stdio.name, stdio.command, stdio.args) == ("fs", "npx", ("-y", "@scope/server", "--root", "my dir"))
    http = parse_mcp_flag("web=https://example.org/mcp")
    assert (http.kind, http.url) == ("http", "https://example.org/mcp")
    for bad, message in (("nothing", "write NAME=COMMAND"), ("x=", "write NAME=COMMAND"),
                         ("x=a 'unclosed", "No closing quotation"), ("b d=cmd", "use 1-64 letters")):
        with pytest.raises(McpConfigError, match=message):
            parse_mcp_flag(bad)


def test_files_in_json_and_toml(tmp_path: Path) -> None:
    j = tmp_path / "mcp.json"
    j.write_text(json.dumps({"mcpServers": {"a": {"command": "srv", "args": ["-v"]}}}))
    assert [(c.name, c.args) for c in load_mcp_file(j)] == [("a", ("-v",))]
    t = tmp_path / "mcp.toml"
    t.write_text('[mcp_servers.b]\nurl = "http://127.0.0.1:9/mcp"\nheaders = { Authorization = "Bearer x" }\n')
    assert [(c.name, c.url) for c in load_mcp_file(t)] == [("b", "http://127.0.0.1:9/mcp")]
    for content, suffix, message in (("{", ".json", "not valid JSON"), ("[x", ".toml", "not valid TOML"),
                                     ('a = 1\n', ".toml", r"no \[mcp_servers.NAME\] tables"),
                                     ('{"mcpServers": {"a": {}}}', ".json", "MCP server 'a': give either")):
        f = tmp_path / f"bad{suffix}"
        f.write_text(content)
        with pytest.raises(McpConfigError, match=message):
            load_mcp_file(f)
    with pytest.raises(McpConfigError, match="cannot read"):
        load_mcp_file(tmp_path / "missing.json")


def test_the_config_files_table_is_serves_and_the_other_settings_still_load(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "flywheel").mkdir()
    (tmp_path / "flywheel" / "config.toml").write_text(
        'approval_mode = "ask-edits"\n\n[mcp_servers.tiny]\ncommand = "python3"\nargs = ["tiny.py"]\ntimeout = 9\n')
    assert [(c.name, c.call_timeout_s) for c in config_file_servers()] == [("tiny", 9.0)]
    assert load_settings(ClientSettings).approval_mode == "ask-edits"  # the table is not a setting, nor an error


def flywheel(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "backend.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env={**os.environ, "NO_COLOR": "1", "XDG_CONFIG_HOME": str(cwd / ".cfg"),
                                                        "PYTHONPATH": str(REPO)})


@pytest.mark.timeout(120)
def test_flywheel_run_gives_the_agent_an_external_servers_tools(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a\n")
    script = tmp_path / "script.json"
    script.write_text(json.dumps([call("mcp__tiny__add", {"a": "20", "b": "22"})
                                  + call("mcp__down__anything", {}), "The sum is 42."]))
    done = flywheel("run", "--workspace", str(src), "--policy", f"scripted:{script}", "--json", "--discard",
                    "--unsafe-no-sandbox", "--mcp", f"tiny={sys.executable} {TINY}", "--mcp",
                    "down=/nonexistent/server", "add them", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "MCP server tiny: 8 tool(s)" in done.stderr
    assert "MCP server down is left out: FileNotFoundError" in done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    results = {e["name"]: e for e in events if e["type"] == "tool_result"}
    assert results["mcp__tiny__add"]["ok"] and results["mcp__tiny__add"]["output"] == "42"
    assert not results["mcp__down__anything"]["ok"]
    assert "unknown tool 'mcp__down__anything'" in results["mcp__down__anything"]["output"]
    bad = flywheel("run", "--workspace", str(src), "--policy", f"scripted:{script}", "--mcp", "oops", "x", cwd=tmp_path)
    assert bad.returncode == 1 and "flywheel run: --mcp 'oops': write NAME=COMMAND ARGS… or NAME=URL" in bad.stderr
