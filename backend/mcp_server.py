"""``flywheel mcp``: the runtime's tool stack served to other agents over MCP.

The tools are the ones a session over the same parts has
(:func:`agent.runtime.session_tools`: read_file, list_dir, glob, grep,
edit_file, write_file, run_command with a sandbox, semantic_search with an
index), listed with input schemas generated from their ``ToolSpec``
(:func:`tools.mcp_schema.input_schema`) and run by
:class:`agent.tool_runner.ToolRunner` — the session's validator and executor —
so a call over MCP returns byte for byte the text the agent's own call gets
(the ``TextContent``), with ``isError`` for a failed call and the result's
``data`` and file edits as ``structuredContent``.

The workspace is a directory given at start, used in place
(:meth:`tools.workspace.WorkspaceStore.attach`): edits land in it; paths
outside it are refused as in any session; commands run under bubblewrap with
the directory at ``/workspace``.

Transports: stdio (the client starts ``flywheel mcp`` as a subprocess) and
streamable HTTP at ``/mcp``, which binds to 127.0.0.1 by default and answers
401 to any request without ``Authorization: Bearer TOKEN`` (a token is made
and printed when none is given); a request body over 4 MiB is refused (the
SDK's limit), and so is a stdio message line over :data:`MAX_LINE_BYTES`.

Approvals (:mod:`backend.mcp_approval`): in an asking mode (``ask-edits`` by
default) a call that edits or runs a command is first put to the client's user
with MCP elicitation; a client that cannot be asked gets an error result naming
``--approval-mode auto``, and the call does not run.

Not guaranteed: isolation from the user's own edits of the directory; the semantic index sees edits made
through these tools, not edits made by others while it runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import os
import secrets
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server

from agent.runtime import SessionParts
from agent.tool_runner import ToolRunner
from backend.mcp_approval import McpApprovals
from tools.base import ToolResult
from tools.mcp_schema import input_schema

log = logging.getLogger(__name__)

SERVER_NAME = "flywheel"
MCP_PATH = "/mcp"
MAX_LINE_BYTES = 4 << 20
"""The longest stdio message line read; a longer one is discarded unread and answered with a parse error."""
INSTRUCTIONS = (
    "Flywheel's coding tools on one workspace directory. Paths are relative to the workspace root; "
    "run_command runs in a sandbox with the workspace at /workspace and no network."
)

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]], Callable[[dict[str, Any]], Awaitable[None]]],
                   Awaitable[None]]


def call_result(result: ToolResult) -> types.CallToolResult:
    """A tool result as MCP's: the text the model reads, ``isError``, and the structured facts."""
    structured = {"ok": result.ok, "data": result.data, "edits": [dataclasses.asdict(e) for e in result.edits]}
    return types.CallToolResult(content=[types.TextContent(text=result.output)], is_error=not result.ok,
                                structured_content=structured)


def build_server(runner: ToolRunner, *, approvals: McpApprovals | None = None, version: str = "") -> Server[Any]:
    """An MCP server (the SDK's low-level ``Server``) whose tools are ``runner``'s, asking
    before calls as ``approvals`` says (None: :class:`McpApprovals`'s default, ``ask-edits``)."""
    listed = [types.Tool(name=s.name, description=s.description, input_schema=input_schema(s)) for s in runner.specs]
    gate = approvals if approvals is not None else McpApprovals()

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult | \
            types.InputRequiredResult:
        arguments = params.arguments or {}
        request = gate.request_for(runner, params.name, arguments, f"mcp-{ctx.request_id}")
        if request is not None:
            answer = await gate.settle(ctx, request, params)
            if isinstance(answer, types.InputRequiredResult):
                return answer  # 2026-07-28: the client asks its user and sends the call again
            if answer is not None:
                return call_result(answer)  # refused: the tool does not run
        return call_result(await runner.call(params.name, arguments))

    return Server(SERVER_NAME, version=version, instructions=INSTRUCTIONS, on_list_tools=list_tools,
                  on_call_tool=call_tool)


# -- stdio -------------------------------------------------------------------


class _Wire:
    """The stdio wire out: whole lines, one writer at a time (the SDK's and this module's)."""

    def __init__(self, out: Any) -> None:
        self._out = out
        self._lock = anyio.Lock()

    async def write(self, text: str) -> None:
        async with self._lock:
            await self._out.write(text)
            await self._out.flush()

    async def flush(self) -> None:
        pass  # every write is flushed


class _CheckedLines:
    """stdin as the SDK's stdio transport reads it (an async iterator of text lines), where
    a line over ``limit`` bytes is dropped unread and a line that is not one JSON-RPC message
    is answered here with the JSON-RPC error (``-32700`` parse error, ``-32600`` invalid
    request, id as sent when it can be read) instead of reaching the SDK, which would drop
    it without an answer."""

    def __init__(self, raw: Any, wire: _Wire, limit: int = MAX_LINE_BYTES) -> None:
        self._raw = raw
        self._wire = wire
        self._limit = limit
        self._buffer = b""
        self.refused = 0

    def __aiter__(self) -> _CheckedLines:
        return self

    async def __anext__(self) -> str:
        while True:
            line, dropped = await self._line()
            if dropped:
                await self._refuse(None, -32700, f"message too long ({dropped} bytes; at most {self._limit})")
                continue
            if not line.strip():
                continue
            problem = _message_problem(line)
            if problem is None:
                return line.decode("utf-8", "replace")
            await self._refuse(*problem)

    async def _line(self) -> tuple[bytes, int]:
        dropping = 0
        while True:
            cut = self._buffer.find(b"\n")
            if cut >= 0:
                line, self._buffer = self._buffer[:cut + 1], self._buffer[cut + 1:]
                too_long = dropping or len(line) > self._limit
                return (b"", dropping + len(line)) if too_long else (line, 0)
            if len(self._buffer) > self._limit:
                dropping += len(self._buffer)
                self._buffer = b""
            chunk = await anyio.to_thread.run_sync(self._raw.read1, 1 << 16, abandon_on_cancel=True)
            if not chunk:
                line, self._buffer = self._buffer, b""
                if dropping:
                    return b"", dropping + len(line)
                if line:
                    return line, 0
                raise StopAsyncIteration
            self._buffer += chunk

    async def _refuse(self, request_id: object, code: int, message: str) -> None:
        self.refused += 1
        log.warning("refused a stdio message: %s", message)
        await self._wire.write(json.dumps({"jsonrpc": "2.0", "id": request_id,
                                           "error": {"code": code, "message": message}}) + "\n")


def _message_problem(line: bytes) -> tuple[object, int, str] | None:
    """None for one well-formed JSON-RPC message, else (id, code, message) of the error to answer."""
    try:
        types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        return None
    except ValueError:
        pass
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return None, -32700, "parse error: the line is not JSON"
    request_id = obj.get("id") if isinstance(obj, dict) and isinstance(obj.get("id"), str | int) else None
    what = "a batch (JSON array); send one message per line" if isinstance(obj, list) else \
        "not a JSON-RPC 2.0 request, notification or response"
    return request_id, -32600, f"invalid request: {what}"


async def serve_stdio(runner: ToolRunner, *, approvals: McpApprovals | None = None, stdin: Any = None,
                      stdout: Any = None) -> None:
    """Serve ``runner``'s tools on stdin/stdout (or the given binary ``stdin`` and text
    ``stdout`` files) until stdin closes. Anything else in this process that prints to
    fd 1 meanwhile goes to stderr, not onto the wire."""
    from mcp.server.stdio import stdio_server

    server = build_server(runner, approvals=approvals)
    restore: Callable[[], None] | None = None
    if stdout is None:
        sys.stdout.flush()
        wire_fd = os.dup(1)
        os.dup2(2, 1)  # stray prints (a library's progress bar) must not corrupt the protocol
        stdout = open(wire_fd, "w", encoding="utf-8", closefd=True)

        def restore() -> None:
            os.dup2(wire_fd, 1)

    wire = _Wire(anyio.wrap_file(stdout))
    lines = _CheckedLines(stdin if stdin is not None else sys.stdin.buffer, wire)
    try:
        async with stdio_server(stdin=lines, stdout=wire) as (read, write):  # type: ignore[arg-type]
            await server.run(read, write, server.create_initialization_options())
    finally:
        if restore is not None:
            restore()


# -- streamable HTTP ----------------------------------------------------------


def require_token(app: ASGIApp, token: str) -> ASGIApp:
    """``app`` answering 401 to every HTTP request without ``Authorization: Bearer token``
    (compared in constant time); other scopes (lifespan) pass through."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = b""
            for key, value in scope.get("headers", ()):
                if key.lower() == b"authorization":
                    given = value
            if not hmac.compare_digest(given, expected):
                body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {
                    "code": -32001, "message": "missing or wrong bearer token (Authorization: Bearer TOKEN)"}}).encode()
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"), (b"www-authenticate", b'Bearer realm="flywheel-mcp"'),
                    (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


def http_app(runner: ToolRunner, *, token: str, host: str = "127.0.0.1",
             approvals: McpApprovals | None = None) -> ASGIApp:
    """The streamable-HTTP ASGI app at :data:`MCP_PATH`, behind :func:`require_token`.
    On a loopback host the SDK also refuses other Host/Origin headers (DNS rebinding)."""
    if not token:
        raise ValueError("the HTTP transport needs a token")
    server = build_server(runner, approvals=approvals)
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, host=host, json_response=False)
    return require_token(app, token)


def new_token() -> str:
    return "fw_mcp_" + secrets.token_urlsafe(32)


@dataclass
class HttpListening:
    url: str
    token: str


async def serve_http(runner: ToolRunner, *, host: str, port: int, token: str,
                     approvals: McpApprovals | None = None,
                     on_listening: Callable[[HttpListening], None] | None = None) -> None:
    """Serve over streamable HTTP until cancelled (or SIGINT/SIGTERM, which uvicorn handles)."""
    import uvicorn

    from backend.net import bind_socket

    sock = bind_socket(host, port)
    sock.listen(2048)  # before the URL is announced: a client that connects at once queues, not refused
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}{MCP_PATH}"
    app = http_app(runner, token=token, host=host, approvals=approvals)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    if on_listening is not None:
        on_listening(HttpListening(url, token))
    await server.serve(sockets=[sock])


@dataclass
class McpParts:
    """What ``flywheel mcp`` serves: the parts, and what to close at the end."""

    parts: SessionParts
    close: Callable[[], None]


def open_parts(directory: Path, *, commands: bool = True, semantic_search: bool = False,
               allow_unsandboxed: bool = False, extra_ro: list[Path] | None = None,
               index_dir: Path | None = None, store_dir: Path | None = None) -> McpParts:
    """Parts over ``directory`` in place: the sandbox (None without ``commands``) and a search
    index built at its first search. Raises ``WorkspaceError`` or ``SandboxUnavailable``."""
    import tempfile

    from agent.runtime import LazySearchIndex
    from tools.sandbox import make_sandbox
    from tools.workspace import WorkspaceStore

    tmp = tempfile.TemporaryDirectory(prefix="flywheel-mcp-") if store_dir is None else None
    store = WorkspaceStore(Path(tmp.name) if tmp is not None else store_dir)  # type: ignore[arg-type]
    try:
        workspace = store.attach(directory)
        sandbox = make_sandbox(allow_unsandboxed=allow_unsandboxed, hide=[store.root],
                               extra_ro=extra_ro or []) if commands else None
    except BaseException:
        if tmp is not None:
            tmp.cleanup()
        raise
    index = None
    if semantic_search:
        from embeddings.index import WorkspaceIndex

        root, where = workspace.root, index_dir or store.root / "index"

        def build() -> Any:
            built = WorkspaceIndex(root, data_dir=where)
            built.refresh()
            return built

        index = LazySearchIndex(build)

    def close() -> None:
        if index is not None:
            index.close()
        if tmp is not None:
            tmp.cleanup()

    return McpParts(SessionParts(workspace=workspace, sandbox=sandbox, search_index=index), close)

