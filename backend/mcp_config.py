"""Where external MCP servers come from: ``--mcp`` flags, a config file, the config file's table.

* ``flywheel run --mcp NAME=COMMAND ARGS…`` (stdio) or ``--mcp NAME=URL`` (streamable
  HTTP), repeatable: :func:`parse_mcp_flag`;
* a file, ``flywheel run --mcp-config FILE`` or ``flywheel serve --mcp-config FILE``
  (``FLYWHEEL_MCP_CONFIG``): JSON in the common ``{"mcpServers": {NAME: {...}}}`` shape,
  or TOML with ``[mcp_servers.NAME]`` tables (:func:`load_mcp_file`);
* ``flywheel serve`` without a file: the ``[mcp_servers.NAME]`` tables of the config file
  (:func:`backend.settings.config_path`; :func:`config_file_servers`).

Every problem is a :class:`tools.mcp_client.McpConfigError` naming the file and the server.
"""

from __future__ import annotations

import json
import shlex
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

from backend.settings import MCP_SERVERS_TABLE, config_path
from tools.mcp_client import McpConfigError, McpServerConfig, McpToolset, connect_mcp_servers, parse_mcp_servers


def parse_mcp_flag(value: str) -> McpServerConfig:
    """``NAME=http(s)://…`` (streamable HTTP) or ``NAME=COMMAND ARG…`` (stdio, split like a shell)."""
    name, sep, rest = value.partition("=")
    if not sep or not rest.strip():
        raise McpConfigError(f"--mcp {value!r}: write NAME=COMMAND ARGS… or NAME=URL")
    rest = rest.strip()
    if rest.startswith(("http://", "https://")):
        return McpServerConfig(name=name.strip(), url=rest)
    try:
        argv = shlex.split(rest)
    except ValueError as exc:
        raise McpConfigError(f"--mcp {value!r}: {exc}") from None
    return McpServerConfig(name=name.strip(), command=argv[0], args=tuple(argv[1:]))


def load_mcp_file(path: Path) -> list[McpServerConfig]:
    """The servers a JSON (``.json``) or TOML file lists."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise McpConfigError(f"cannot read the MCP config {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
        obj = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
        raise McpConfigError(f"the MCP config {path} is not valid {kind}: {exc}") from None
    if isinstance(obj, dict) and path.suffix.lower() != ".json" and MCP_SERVERS_TABLE not in obj:
        raise McpConfigError(f"the MCP config {path} has no [{MCP_SERVERS_TABLE}.NAME] tables")
    try:
        return parse_mcp_servers(obj)
    except McpConfigError as exc:
        raise McpConfigError(f"{path}: {exc}") from None


def config_file_servers() -> list[McpServerConfig]:
    """The ``[mcp_servers.NAME]`` tables of the config file (none if it has none, or no file)."""
    path = config_path()
    if not path.exists():
        return []
    try:
        obj = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return []  # the settings loader reports a broken config file in its own words
    if MCP_SERVERS_TABLE not in obj:
        return []
    try:
        return parse_mcp_servers({MCP_SERVERS_TABLE: obj[MCP_SERVERS_TABLE]})
    except McpConfigError as exc:
        raise McpConfigError(f"{path}: {exc}") from None


async def open_toolset(configs: Sequence[McpServerConfig], say: Callable[[str], None],
                       warn: Callable[[str], None] | None = None) -> McpToolset:
    """Connect to ``configs``, telling ``say`` what connected and ``warn`` (default ``say``) what did not."""
    warn = warn or say
    toolset = await connect_mcp_servers(list(configs))
    for server in toolset.describe():
        say(f"MCP server {server['name']}: {len(server['tools'])} tool(s)")
    for name, why in toolset.failures.items():
        warn(f"MCP server {name} is left out: {why}")
    for tool, why in toolset.skipped.items():
        warn(f"MCP tool {tool} is left out: {why}")
    return toolset
