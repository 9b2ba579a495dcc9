"""External MCP servers' tools as tools of a Flywheel session.

:func:`connect_mcp_servers` connects to each configured server (stdio:
a subprocess; ``http``: streamable HTTP; ``sse``: the older SSE transport)
with the official ``mcp`` client, lists its tools and returns a
:class:`McpToolset`: its :attr:`~McpToolset.tools` are ordinary
:class:`tools.base.Tool` objects (spec converted by :mod:`tools.mcp_schema`,
named ``mcp__SERVER__TOOL``) to hand to a session
(``agent.runtime.SessionParts(extra_tools=...)``), so they appear in the
prompt, are validated, approved and run by the executor like built-in tools,
and their calls and results are recorded like any other.

Failure is a result, never a hang: a server that does not start or answer
within ``connect_timeout_s`` is left out (:attr:`McpToolset.failures` says
why); a call that gets no answer within ``call_timeout_s``, a server that
exited (its last stderr lines are quoted), a protocol error or a malformed
result become an error result the model reads. After a lost connection
(the server exited, the stream closed), the next call starts the server again
once, within ``connect_timeout_s``, before it fails.

Ordering and approval (:meth:`McpTool.resources`): an external tool acts
outside the workspace, like a separate process, so it runs in parallel with
every other call and counts as a command for approval modes; a server
configured with ``writes_workspace = true`` is ordered against file edits and
tells the search index the tree may have changed, as ``run_command`` does.

Not guaranteed: what a server does (it is not sandboxed by Flywheel); a stdio
server gets the SDK's short list of inherited variables (``PATH``, ``HOME``,
``USER``, ``SHELL``, ``TERM``, ``LOGNAME``) plus its ``env``, not Flywheel's whole
environment (so no ``FLYWHEEL_*`` token leaks to it); a server's messages are not size-capped on stdio (the result the model
reads is, by the executor).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from tools.base import WHOLE_TREE, Resources, ToolContext, ToolError, ToolResult
from tools.mcp_schema import ExternalSpec, SchemaError, clean_text, spec_from_mcp, tool_name
from tools.mcp_server_config import McpConfigError, McpServerConfig, parse_mcp_servers

if TYPE_CHECKING:
    import mcp_types

__all__ = ["McpConfigError", "McpServerConfig", "McpTool", "McpToolset", "connect_mcp_servers", "parse_mcp_servers"]

log = logging.getLogger(__name__)

MAX_TOOLS_PER_SERVER = 256
MAX_LIST_PAGES = 20
MAX_STRUCTURED_BYTES = 64 << 10
STDERR_TAIL_CHARS = 600


class McpTool:
    """One external tool. ``run`` sends the call with the server's own names and returns its content as text."""

    def __init__(self, connection: _Connection, remote: str, external: ExternalSpec, schema: Mapping[str, Any]):
        self.spec = external.spec
        self.aliases = dict(external.aliases)
        self.server = connection.config.name
        self.remote_name = remote
        self._connection = connection
        self._schema = dict(schema)

    @cached_property
    def _validator(self) -> Any:
        from jsonschema import validators

        return validators.validator_for(self._schema)(self._schema)

    def resources(self, args: Mapping[str, Any]) -> Resources:
        if self._connection.config.writes_workspace:
            return Resources(reads=frozenset({WHOLE_TREE}), process_writes=frozenset({WHOLE_TREE}))
        return Resources(process_writes=frozenset({f"mcp://{self.server}"}))  # no workspace path is ever this

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        arguments = {self.aliases.get(k, k): v for k, v in args.items()}
        from jsonschema import exceptions

        try:
            problem = exceptions.best_match(self._validator.iter_errors(arguments))
        except Exception as exc:  # the server's schema itself is unusable here: send it as it is
            log.debug("mcp %s: cannot check arguments of %s: %s", self.server, self.remote_name, exc)
            problem = None
        if problem is not None:
            raise ToolError(f"invalid call to {self.spec.name}: {problem.message[:300]}")
        result = await self._connection.call(self.remote_name, arguments)
        return _result(self.server, self.remote_name, result)


def _result(server: str, tool: str, result: mcp_types.CallToolResult) -> ToolResult:
    """An MCP result as the model reads it: text blocks as they are, other blocks named."""
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", "?")
        if kind == "text":
            parts.append(block.text)  # type: ignore[union-attr]
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {block.mime_type}, {len(block.data) * 3 // 4} bytes: not shown]")  # type: ignore[union-attr]
        elif kind == "resource":
            res = block.resource  # type: ignore[union-attr]
            text = getattr(res, "text", None)
            parts.append(f"[resource {res.uri}]\n{text}" if text is not None
                         else f"[resource {res.uri} ({res.mime_type or 'binary'}): not shown]")
        elif kind == "resource_link":
            parts.append(f"[resource link {block.uri}" + (f" ({block.name})]" if block.name else "]"))  # type: ignore[union-attr]
        else:
            parts.append(f"[{clean_text(kind, 40)} content: not shown]")
    data: dict[str, Any] = {"mcp_server": server, "mcp_tool": tool}
    structured = result.structured_content
    if structured is not None:
        encoded = json.dumps(structured, ensure_ascii=False, default=str)
        if not parts:
            parts.append(encoded)
        if len(encoded) <= MAX_STRUCTURED_BYTES:
            data["structured"] = json.loads(encoded)
    output = "\n".join(parts) if parts else "(no output)"
    return ToolResult(ok=not result.is_error, output=output, data=data)


class _Connection:
    """One server's live client, held open by a task of its own (the SDK's contexts
    must be entered and left in one task); calls come from any task."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()
        self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
        self.lost: str | None = None  # why the last connection broke

    async def connect(self) -> list[mcp_types.Tool]:
        """Start the client and list the server's tools, within ``connect_timeout_s``
        (raises on failure; the caller closes)."""
        async with asyncio.timeout(self.config.connect_timeout_s):
            await self._start()
            return await self._list_tools()

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._hold(ready), name=f"mcp:{self.config.name}")
        await ready

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        from mcp import Client

        try:
            async with AsyncExitStack() as stack:
                transport = await self._transport(stack)
                client = await stack.enter_async_context(Client(transport, mode="legacy"))  # every server speaks it
                self._client, self.lost = client, None
                if not ready.done():  # else the connect timed out meanwhile: close() ends this task
                    ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ConnectionError("cancelled"))
            elif not isinstance(exc, asyncio.CancelledError):
                self.lost = _describe(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._client = None

    async def _transport(self, stack: AsyncExitStack) -> Any:
        c = self.config
        if c.kind == "stdio":
            from mcp.client.stdio import StdioServerParameters, stdio_client

            assert c.command is not None
            params = StdioServerParameters(command=c.command, args=list(c.args), env=dict(c.env) or None, cwd=c.cwd)
            return stdio_client(params, errlog=self._stderr)
        from mcp.shared._httpx_utils import create_mcp_http_client

        assert c.url is not None
        if c.kind == "sse":
            from mcp.client.sse import sse_client

            return sse_client(c.url, headers=dict(c.headers), timeout=c.connect_timeout_s)
        from mcp.client.streamable_http import streamable_http_client

        http = await stack.enter_async_context(create_mcp_http_client(headers=dict(c.headers)))
        return streamable_http_client(c.url, http_client=http)

    async def _list_tools(self) -> list[mcp_types.Tool]:
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = await self._client.list_tools(cursor=cursor)
            tools += page.tools
            cursor = page.next_cursor
            if cursor is None or len(tools) >= MAX_TOOLS_PER_SERVER:
                break
        return tools[:MAX_TOOLS_PER_SERVER]

    async def call(self, tool: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        """The server's result, or :class:`ToolError` saying what went wrong (never hangs)."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT
        from pydantic import ValidationError

        name, timeout = self.config.name, self.config.call_timeout_s
        client = await self._connected()
        try:
            async with asyncio.timeout(timeout):
                return await client.call_tool(tool, arguments, read_timeout_seconds=timeout)
        except TimeoutError:
            raise ToolError(f"MCP server {name!r} did not answer the call to {tool!r} within {timeout:g} s "
                            "(the call was abandoned)") from None
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self.lost = "the connection closed"
                raise ToolError(self._down(self.lost)) from None
            if exc.code == REQUEST_TIMEOUT:
                raise ToolError(f"MCP server {name!r} did not answer the call to {tool!r} within {timeout:g} s "
                                "(the call was abandoned)") from None
            raise ToolError(f"MCP server {name!r} refused the call to {tool!r}: {clean_text(exc.message, 500)} "
                            f"(error {exc.code})") from None
        except ValidationError as exc:
            raise ToolError(f"MCP server {name!r} returned a malformed result for {tool!r}: "
                            f"{clean_text(str(exc).splitlines()[0], 300)}") from None
        except (OSError, EOFError, RuntimeError) as exc:
            self.lost = _describe(exc)
            raise ToolError(self._down(self.lost)) from None
        except Exception as exc:
            if type(exc).__module__.startswith("anyio"):  # closed or broken streams: the server went away
                self.lost = _describe(exc)
                raise ToolError(self._down(self.lost)) from None
            raise

    async def _connected(self) -> Any:
        """The live client; a lost connection is started again once (within the connect timeout)."""
        async with self._lock:
            if self._client is not None and self.lost is None and self._task is not None and not self._task.done():
                return self._client
            why = self.lost or "it is not running"
            await self.close()
            try:
                async with asyncio.timeout(self.config.connect_timeout_s):
                    await self._start()
            except Exception as exc:  # TimeoutError included
                raise ToolError(self._down(f"{why}; reconnecting failed: {_describe(exc)}")) from None
            return self._client

    def _down(self, why: str) -> str:
        return f"MCP server {self.config.name!r} is not reachable: {why}{self._stderr_tail()}"

    def _stderr_tail(self) -> str:
        try:
            self._stderr.flush()
            self._stderr.seek(0, 2)
            size = self._stderr.tell()
            self._stderr.seek(max(0, size - STDERR_TAIL_CHARS * 2))
            tail = self._stderr.read().strip()[-STDERR_TAIL_CHARS:]
        except (OSError, ValueError):
            return ""
        return f"\nits stderr ends with:\n{clean_text(tail, STDERR_TAIL_CHARS)}" if tail else ""

    async def close(self) -> None:
        task, self._task = self._task, None
        self._stop.set()
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), 10)
            except (TimeoutError, Exception):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        self._client = None


def _describe(exc: BaseException) -> str:
    from pydantic import ValidationError

    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions[:3])
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if isinstance(exc, ValidationError):
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": str(exc)}
        where = ".".join(str(p) for p in first["loc"])
        return clean_text(f"malformed answer from the server ({exc.title}: {where}: {first['msg']})", 300)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return clean_text(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, 300)


@dataclass
class McpToolset:
    """The tools of the servers that connected, and why the others did not."""

    tools: list[McpTool] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)  # server name -> why it is left out
    skipped: dict[str, str] = field(default_factory=dict)  # tool name -> why its schema was refused
    _connections: list[_Connection] = field(default_factory=list, repr=False)

    def describe(self) -> list[dict[str, Any]]:
        """The connected servers and their tools' names, for the session log."""
        return [{**c.config.describe(), "tools": [t.spec.name for t in self.tools if t.server == c.config.name]}
                for c in self._connections]

    async def close(self) -> None:
        """Stop every server (stdio processes end; HTTP sessions are closed). Idempotent."""
        connections, self._connections = self._connections, []
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)
        for c in connections:
            c._stderr.close()

    async def __aenter__(self) -> McpToolset:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def connect_mcp_servers(configs: Sequence[McpServerConfig]) -> McpToolset:
    """Connect to every server in ``configs`` at once and collect their tools.

    Never raises for a server's fault: one that fails to start, to answer within its
    ``connect_timeout_s`` or to list valid tools is left out and named in
    ``failures``; a tool whose schema cannot become a ``ToolSpec`` is named in
    ``skipped``. Tool names are ``mcp__SERVER__TOOL`` (a name met twice gets a
    suffix). The caller closes the toolset (``await toolset.close()``, or
    ``async with``) when its sessions are done; until then the servers stay up.
    """
    names = [c.name for c in configs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise McpConfigError(f"MCP server name(s) given twice: {', '.join(dupes)}")
    toolset = McpToolset()
    connections = [_Connection(c) for c in configs]
    listed = await asyncio.gather(*(c.connect() for c in connections), return_exceptions=True)
    taken: set[str] = set()
    for conn, tools in zip(connections, listed, strict=True):
        if isinstance(tools, BaseException):
            if isinstance(tools, asyncio.CancelledError):
                raise tools
            toolset.failures[conn.config.name] = _describe(tools) + conn._stderr_tail()
            await conn.close()
            conn._stderr.close()
            continue
        toolset._connections.append(conn)
        for remote in tools:
            name = tool_name(conn.config.name, remote.name)
            base, n = name, 2
            while name in taken:
                name, n = f"{base}_{n}", n + 1
            try:
                external = spec_from_mcp(name, remote.description, remote.input_schema)
            except SchemaError as exc:
                toolset.skipped[name] = str(exc)
                continue
            taken.add(name)
            toolset.tools.append(McpTool(conn, remote.name, external, remote.input_schema))
    return toolset
