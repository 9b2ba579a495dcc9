"""Which external MCP servers to connect to: :class:`McpServerConfig` and the config shapes it is read from.

A server is a command (stdio) or a URL (streamable HTTP, or the older SSE). The
common JSON shape (Claude Desktop, Cursor, Zed, ACP's ``session/new``) and the
TOML tables of ``flywheel serve``'s config are read by
:meth:`McpServerConfig.from_mapping` / :func:`parse_mcp_servers`; every problem is
an :class:`McpConfigError` naming the server and the key. Connecting is
:func:`tools.mcp_client.connect_mcp_servers`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["McpConfigError", "McpServerConfig", "Transport", "parse_mcp_servers"]

Transport = Literal["stdio", "http", "sse"]
_SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class McpConfigError(ValueError):
    """A server configuration that cannot be used; the message names the server and the key."""


@dataclass(frozen=True)
class McpServerConfig:
    """One external MCP server: a command (stdio) or a URL (``http`` or ``sse``)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    transport: Transport | None = None  # None: stdio with a command, http with a URL
    connect_timeout_s: float = 30.0
    call_timeout_s: float = 60.0
    writes_workspace: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _SERVER_NAME.fullmatch(self.name):
            raise McpConfigError(f"MCP server name {self.name!r}: use 1-64 letters, digits, '_' or '-'")
        if (self.command is None) == (self.url is None):
            raise McpConfigError(f"MCP server {self.name!r}: give either a command (stdio) or a url (http)")
        if self.url is not None and not re.match(r"https?://", self.url):
            raise McpConfigError(f"MCP server {self.name!r}: url must start with http:// or https://")
        if self.kind == "stdio" and self.command is None or self.kind != "stdio" and self.url is None:
            raise McpConfigError(f"MCP server {self.name!r}: transport {self.kind!r} does not fit "
                                 f"{'a command' if self.command else 'a url'}")
        for what in ("connect_timeout_s", "call_timeout_s"):
            value = getattr(self, what)
            if not isinstance(value, int | float) or not 0 < value <= 3600:
                raise McpConfigError(f"MCP server {self.name!r}: {what} must be between 0 and 3600 seconds")

    @property
    def kind(self) -> Transport:
        return self.transport or ("stdio" if self.command is not None else "http")

    def describe(self) -> dict[str, Any]:
        """What the session log keeps: never ``env`` or header values (they may hold secrets)."""
        where = {"command": self.command, "args": list(self.args)} if self.command else {"url": self.url}
        return {"name": self.name, "transport": self.kind, **where, "writes_workspace": self.writes_workspace}

    @classmethod
    def from_mapping(cls, name: str, obj: object) -> McpServerConfig:
        """One server from the common config shape (Claude Desktop, Cursor, Zed, ACP's
        ``session/new``): ``command``/``args``/``env``/``cwd`` or ``url``/``headers``
        (``type`` or ``transport``: stdio, http, sse); ``env``/``headers`` as objects or as
        lists of ``{name, value}``; plus ``timeout`` (seconds per call),
        ``connect_timeout`` and ``writes_workspace``."""
        if not isinstance(obj, Mapping):
            raise McpConfigError(f"MCP server {name!r}: expected a table/object, got {type(obj).__name__}")
        known = {"command", "args", "env", "cwd", "url", "headers", "type", "transport", "timeout",
                 "connect_timeout", "writes_workspace", "name"}
        unknown = sorted(set(obj) - known)
        if unknown:
            raise McpConfigError(f"MCP server {name!r}: unknown key(s) {', '.join(map(repr, unknown))}; "
                                 f"known: {', '.join(sorted(known))}")
        transport = obj.get("transport", obj.get("type"))
        if transport == "streamable-http" or transport == "streamable_http":
            transport = "http"
        if transport is not None and transport not in ("stdio", "http", "sse"):
            raise McpConfigError(f"MCP server {name!r}: transport {transport!r}: use stdio, http or sse")
        args = obj.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise McpConfigError(f"MCP server {name!r}: args must be a list of strings")
        timeouts = {k: float(obj[src]) for k, src in (("call_timeout_s", "timeout"), ("connect_timeout_s",
                                                                                        "connect_timeout"))
                    if isinstance(obj.get(src), int | float) and not isinstance(obj.get(src), bool)}
        for src in ("timeout", "connect_timeout"):
            if src in obj and (isinstance(obj[src], bool) or not isinstance(obj[src], int | float)):
                raise McpConfigError(f"MCP server {name!r}: {src} must be a number of seconds")
        writes = obj.get("writes_workspace", False)
        if not isinstance(writes, bool):
            raise McpConfigError(f"MCP server {name!r}: writes_workspace must be true or false")
        for key in ("command", "cwd", "url"):
            if key in obj and not isinstance(obj[key], str):
                raise McpConfigError(f"MCP server {name!r}: {key} must be a string")
        return cls(name=name, command=obj.get("command"), args=tuple(args), env=_pairs(name, "env", obj.get("env")),
                   cwd=obj.get("cwd"), url=obj.get("url"), headers=_pairs(name, "headers", obj.get("headers")),
                   transport=transport, writes_workspace=writes, **timeouts)


def _pairs(server: str, key: str, value: object) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, list):  # ACP's [{"name": ..., "value": ...}]
        try:
            value = {item["name"]: item["value"] for item in value}
        except (TypeError, KeyError):
            raise McpConfigError(f"MCP server {server!r}: {key} must be an object or a list of "
                                 "{name, value}") from None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise McpConfigError(f"MCP server {server!r}: {key} must map names to string values")
    return dict(value)


def parse_mcp_servers(obj: object) -> list[McpServerConfig]:
    """Servers from a parsed config: ``{"mcpServers": {NAME: {...}}}`` (the common JSON
    shape), ``{"mcp_servers": {...}}`` (the TOML table) or ``{NAME: {...}}``."""
    if isinstance(obj, Mapping) and set(obj) & {"mcpServers", "mcp_servers"}:
        obj = obj.get("mcpServers", obj.get("mcp_servers"))
    if not isinstance(obj, Mapping):
        raise McpConfigError("MCP servers must be an object mapping names to server settings")
    return [McpServerConfig.from_mapping(str(name), value) for name, value in obj.items()]
