"""Newline-delimited JSON-RPC over the process's stdio, hardened against bad input.

The ``agent-client-protocol`` package does the JSON-RPC (routing, validation,
errors for unknown methods and bad params); this is the message transport
it runs on (its ``Transport`` seam: ``send``/``receive``/``close`` of decoded
messages). Unlike the package's own stdio transport, which skips a line it
cannot parse, every bad line gets a JSON-RPC error answer and the agent
goes on:

* not JSON -> ``-32700`` parse error (``id: null``);
* JSON that is not a request, notification or response (an array, a
  number, an object without ``method`` or ``id``, a ``jsonrpc`` other than
  ``"2.0"``) -> ``-32600`` invalid request;
* a line longer than ``max_message_bytes`` -> ``-32600`` ("message too
  large"), answered with the request's ``id`` when it can be read from the
  line's start; the line is read and dropped in pieces, never held whole.

Not guaranteed: a batch (a JSON array) is refused, not processed (ACP does
not use batches); the ``id`` of an oversized message is found only if it
comes in the first 4 KiB.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any

from backend.acp.defaults import DEFAULT_MAX_MESSAGE_BYTES

_ID_RE = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,200}")')


def _error(code: int, message: str, id_: Any = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "error": {"code": code, "message": message}}


class _WriteProtocol(asyncio.Protocol):
    """Flow control for the output pipe: ``drain`` waits while the pipe is full."""

    def __init__(self) -> None:
        self._paused = False
        self._resumed: asyncio.Future[None] | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self.resume_writing()

    async def drain(self) -> None:
        while self._paused and not self.closed.done():
            self._resumed = asyncio.get_running_loop().create_future()
            await self._resumed


class StdioTransport:
    """JSON-RPC messages over two file descriptors (the editor's pipes)."""

    def __init__(self, reader: asyncio.StreamReader, write_transport: asyncio.WriteTransport,
                 protocol: _WriteProtocol, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self._reader = reader
        self._out = write_transport
        self._protocol = protocol
        self._lock = asyncio.Lock()
        self.max_message_bytes = max_message_bytes

    @classmethod
    async def open(cls, in_fd: int, out_fd: int, *,
                   max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> StdioTransport:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=max_message_bytes + 1)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(in_fd, "rb", 0))
        transport, protocol = await loop.connect_write_pipe(_WriteProtocol, os.fdopen(out_fd, "wb", 0))
        return cls(reader, transport, protocol, max_message_bytes=max_message_bytes)  # type: ignore[arg-type]

    async def send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass") + b"\n"
        async with self._lock:
            if self._out.is_closing():
                raise ConnectionError("the editor closed the connection")
            self._out.write(line)
            await self._protocol.drain()

    async def receive(self) -> dict[str, Any] | None:
        while True:
            line = await self._read_line()
            if line is None:
                return None
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except (ValueError, UnicodeDecodeError) as exc:
                await self.send(_error(-32700, f"parse error: not JSON ({exc})"))
                continue
            problem = _invalid(message)
            if problem is not None:
                id_ = message.get("id") if isinstance(message, dict) and _valid_id(message.get("id")) else None
                await self.send(_error(-32600, f"invalid request: {problem}", id_))
                continue
            return message  # type: ignore[no-any-return]

    async def _read_line(self) -> bytes | None:
        try:
            return await self._reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            return exc.partial or None
        except asyncio.LimitOverrunError:
            await self._drop_oversized()
            return b""

    async def _drop_oversized(self) -> None:
        head = b""
        while True:
            try:
                chunk = await self._reader.readuntil(b"\n")
                head = head or chunk[:4096]
                break
            except asyncio.LimitOverrunError as exc:
                chunk = await self._reader.readexactly(exc.consumed)
                head = head or chunk[:4096]
            except asyncio.IncompleteReadError as exc:
                head = head or exc.partial[:4096]
                break
        m = _ID_RE.search(head)
        id_ = json.loads(m.group(1)) if m else None
        await self.send(_error(-32600, f"message too large: more than {self.max_message_bytes} bytes "
                                       "(send less, e.g. a path instead of a file's content)", id_))

    async def close(self) -> None:
        if not self._out.is_closing():
            self._out.close()


def _valid_id(value: Any) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool)


def _invalid(message: Any) -> str | None:
    """Why ``message`` is not a JSON-RPC 2.0 request, notification or response (None if it is)."""
    if not isinstance(message, dict):
        return f"expected a JSON object, got {type(message).__name__}" + (" (batches are not supported)"
                                                                           if isinstance(message, list) else "")
    if message.get("jsonrpc") != "2.0":
        return 'missing "jsonrpc": "2.0"'
    if "method" in message:
        if not isinstance(message["method"], str):
            return '"method" must be a string'
        if "id" in message and not _valid_id(message["id"]) and message["id"] is not None:
            return '"id" must be a string or an integer'
        params = message.get("params")
        if params is not None and not isinstance(params, dict | list):
            return '"params" must be an object'
        return None
    if "id" in message and ("result" in message or "error" in message):
        return None
    return 'neither a request (no "method") nor a response (no "result" or "error")'
