"""tools.mcp_server_config: the config shapes servers are read from, and what is refused."""

from __future__ import annotations

import pytest

from tools.mcp_server_config import McpConfigError, parse_mcp_servers


def test_config_shapes() -> None:
    servers = parse_mcp_servers({"mcpServers": {
        "fs": {"command": "npx", "args": ["-y", "server"], "env": {"A": "1"}, "timeout": 5},
        "web": {"type": "http", "url": "https://example.org/mcp", "headers": [{"name": "X", "value": "y"}]},
        "files": {"command": "srv", "writes_workspace": True, "connect_timeout": 3},
    }})
    fs, web, files = servers
    assert (fs.kind, fs.args, dict(fs.env), fs.call_timeout_s) == ("stdio", ("-y", "server"), {"A": "1"}, 5.0)
    assert (web.kind, dict(web.headers)) == ("http", {"X": "y"})
    assert files.writes_workspace and files.connect_timeout_s == 3.0
    assert "A" not in str(fs.describe()) and "y" not in str(web.describe().values())
    assert parse_mcp_servers({"mcp_servers": {"a": {"url": "http://h/mcp"}}})[0].url == "http://h/mcp"


@pytest.mark.parametrize(("obj", "message"), [
    ({"bad name": {"command": "x"}}, "use 1-64 letters"),
    ({"a": {"command": "x", "url": "http://h"}}, "either a command"),
    ({"a": {}}, "either a command"),
    ({"a": {"url": "ftp://h"}}, "must start with http"),
    ({"a": {"command": "x", "args": "-v"}}, "args must be a list"),
    ({"a": {"command": "x", "colour": "red"}}, "unknown key(s) 'colour'"),
    ({"a": {"command": "x", "timeout": 0}}, "between 0 and 3600"),
    ({"a": {"command": "x", "timeout": "5"}}, "timeout must be a number"),
    ({"a": {"command": "x", "type": "ws"}}, "use stdio, http or sse"),
    ({"a": {"command": "x", "type": "http"}}, "does not fit a command"),
    ({"a": {"command": "x", "env": {"A": 1}}}, "env must map names to string values"),
    ([1, 2], "must be an object"),
])
def test_bad_configs_are_refused_with_the_reason(obj: object, message: str) -> None:
    with pytest.raises(McpConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_mcp_servers(obj)
