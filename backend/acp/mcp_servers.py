"""The MCP servers an editor names in ``session/new`` / ``session/load``, as the session's tools.

ACP clients pass ``mcpServers`` (stdio: ``command``, ``args``, ``env``; ``http`` and
``sse``: ``url``, ``headers``). :func:`server_configs` turns them into
:class:`tools.mcp_client.McpServerConfig` (a name the tool names cannot carry --
``mcp__SERVER__TOOL`` takes letters, digits, ``_`` and ``-`` -- is rewritten, e.g.
``My Docs`` -> ``My_Docs``); :func:`connect` connects them with
:func:`tools.mcp_client.connect_mcp_servers` (the same client ``flywheel run --mcp`` and
``flywheel serve --mcp-config`` use), and :class:`McpStatus` says what connected.

A server that is down never fails ``session/new``: the session starts with the
tools of the servers that did connect, the response's ``_meta.flywheel.mcpServers``
lists every server with ``connected`` and, for one that is not, ``error``; the
same reason is logged on stderr and shown in the editor as a message before the
session's next turn (ACP has no warning channel for a request that succeeded).
A server the protocol describes but this agent cannot reach (the unstable ``acp``
transport) is reported the same way.

Not guaranteed: what a server does (it runs with the editor's ``env`` for it, outside
Flywheel's sandbox, as in ``flywheel run --mcp``); a server that starts but never
answers holds ``session/new`` for up to :data:`CONNECT_TIMEOUT_S`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tools.mcp_client import McpConfigError, McpServerConfig, McpToolset, connect_mcp_servers

CONNECT_TIMEOUT_S = 30.0
"""How long one server may take to start and list its tools."""

_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass
class McpStatus:
    """What became of the servers a client named: ``servers`` in the order given, each
    ``{name, transport, command|url, connected, tools | error}`` (never ``env`` or header
    values), and the toolset of the connected ones (its owner closes it)."""

    servers: list[dict[str, Any]] = field(default_factory=list)
    toolset: McpToolset = field(default_factory=McpToolset)

    @property
    def problems(self) -> list[str]:
        """One line per server that is not connected (or tool that was left out)."""
        lines = [f"MCP server {s['name']!r} is not connected: {s['error']}" for s in self.servers
                 if not s["connected"]]
        lines += [f"MCP tool {name} is left out: {why}" for name, why in self.toolset.skipped.items()]
        return lines


def _name(raw: str, taken: set[str]) -> str:
    base = _BAD_NAME_CHARS.sub("_", raw.strip()).strip("_")[:60] or "server"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


def _as_mapping(server: Any) -> dict[str, Any]:
    if hasattr(server, "model_dump"):
        return dict(server.model_dump(by_alias=True, exclude_none=True, mode="json"))
    if isinstance(server, dict):
        return dict(server)
    raise McpConfigError(f"not an MCP server description: {type(server).__name__}")


def server_configs(servers: Sequence[Any]) -> tuple[list[McpServerConfig], list[dict[str, Any]]]:
    """The configs to connect, and the servers that cannot be (with ``error``), from ACP's
    ``mcpServers`` (the SDK's models or plain mappings)."""
    configs: list[McpServerConfig] = []
    refused: list[dict[str, Any]] = []
    taken: set[str] = set()
    for server in servers:
        try:
            raw = _as_mapping(server)
        except McpConfigError as exc:
            refused.append({"name": "?", "connected": False, "error": str(exc)})
            continue
        given = str(raw.pop("name", "") or "server")
        raw.pop("_meta", None)
        name = _name(given, taken)
        if raw.get("type") == "acp" or "serverId" in raw:
            refused.append({"name": name, "transport": "acp", "connected": False,
                            "error": "the acp transport (MCP over the ACP connection) is not supported; "
                                     "use stdio or http"})
            continue
        try:
            config = McpServerConfig.from_mapping(name, raw)
        except McpConfigError as exc:
            refused.append({"name": name, "connected": False, "error": str(exc)})
            continue
        configs.append(dataclasses.replace(config, connect_timeout_s=min(config.connect_timeout_s,
                                                                         CONNECT_TIMEOUT_S)))
    return configs, refused


async def connect(servers: Sequence[Any]) -> McpStatus:
    """Connect to the servers a client named (none: an empty status at once). Never raises
    for a server's fault; see :class:`McpStatus`."""
    configs, refused = server_configs(servers)
    if not configs:
        return McpStatus(servers=refused)
    toolset = await connect_mcp_servers(configs)
    connected = {d["name"]: d for d in toolset.describe()}
    status = McpStatus(toolset=toolset)
    for config in configs:
        entry = dict(config.describe())
        entry.pop("writes_workspace", None)
        if config.name in connected:
            entry.update(connected=True, tools=connected[config.name]["tools"])
        else:
            entry.update(connected=False, error=toolset.failures.get(config.name, "it did not connect"))
        status.servers.append(entry)
    status.servers += refused
    return status
