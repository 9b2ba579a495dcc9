"""read_file: line numbers, ranges, caps and markers, binary detection, errors."""

from __future__ import annotations

import pytest

from tools import read_file as mod
from tools.base import Tool, ToolContext, ToolError
from tools.read_file import ReadFile
from tools.workspace import Workspace


async def read(ctx: ToolContext, **args: object) -> str:
    result = await ReadFile().run(args, ctx)
    assert result.ok
    return result.output


def test_satisfies_tool_protocol() -> None:
    tool = ReadFile()
    assert isinstance(tool, Tool) and tool.spec.name == "read_file"
    assert tool.resources({"path": "./src//main.py"}).reads == frozenset({"src/main.py"})
    assert not tool.resources({"path": "x"}).writes


async def test_line_numbers(ctx: ToolContext) -> None:
    out = await read(ctx, path="src/main.py")
    assert out == "    1\tfrom pkg.core import add\n    2\t\n    3\tprint(add(1, 2))\n"


async def test_line_range(ctx: ToolContext) -> None:
    out = await read(ctx, path="src/pkg/core.py", start_line=2, end_line=3)
    assert out == "    2\t    return a + b\n    3\t\n"
    tail = await read(ctx, path="src/pkg/core.py", start_line=5, end_line=999)
    assert tail == "    5\tdef sub(a, b):\n    6\t    return a - b\n"


async def test_line_cap_marker(workspace: Workspace, ctx: ToolContext) -> None:
    workspace.write_bytes("big.txt", "".join(f"line {i}\n" for i in range(1, 2501)).encode())
    result = await ReadFile().run({"path": "big.txt"}, ctx)
    lines = result.output.splitlines()
    assert lines[0] == "    1\tline 1" and lines[1999] == " 2000\tline 2000"
    assert lines[-1] == ("[... truncated: showing lines 1-2000 of 2500; "
                         "call read_file with start_line=2001 to read more]")
    assert result.data["truncated"] is True and result.data["end_line"] == 2000
    rest = await read(ctx, path="big.txt", start_line=2001)
    assert rest.splitlines()[-1] == " 2500\tline 2500" and "truncated" not in rest


async def test_byte_cap_marker(workspace: Workspace, ctx: ToolContext) -> None:
    workspace.write_bytes("wide.txt", ("x" * 1000 + "\n").encode() * 400)
    result = await ReadFile().run({"path": "wide.txt"}, ctx)
    assert len(result.output.encode()) <= mod.MAX_OUTPUT_BYTES + 200
    last = result.data["end_line"]
    assert last < 400 and f"start_line={last + 1}" in result.output


async def test_long_line_is_cut(workspace: Workspace, ctx: ToolContext) -> None:
    workspace.write_bytes("min.js", b"a" * 20_000 + b"\n")
    out = await read(ctx, path="min.js")
    assert "[line cut: 20000 characters]" in out and len(out) < 9000


@pytest.mark.parametrize("content", [b"\x00\x01\x02binary\xff", b"caf\xe9 latin-1 text\n"])
async def test_binary_is_not_shown(workspace: Workspace, ctx: ToolContext, content: bytes) -> None:
    workspace.write_bytes("blob", content)
    result = await ReadFile().run({"path": "blob"}, ctx)
    assert result.ok and result.output == f"blob: binary file, {len(content)} bytes (not shown)"
    assert result.data == {"binary": True, "size": len(content)}


async def test_empty_file(workspace: Workspace, ctx: ToolContext) -> None:
    workspace.write_bytes("empty.txt", b"")
    assert await read(ctx, path="empty.txt") == "empty.txt: empty file (0 bytes)"


async def test_crlf_is_flagged(workspace: Workspace, ctx: ToolContext) -> None:
    workspace.write_bytes("win.txt", b"a\r\nb\r\n")
    out = await read(ctx, path="win.txt")
    assert out.startswith("[this file uses CRLF") and "    1\ta\n    2\tb\n" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"path": "src"}, r"is a directory, not a file \(use list_dir\)"),
        ({"path": "missing.py"}, r"not found: 'missing.py' does not exist"),
        ({"path": "src/main.py", "start_line": 0}, r"start_line must be >= 1"),
        ({"path": "src/main.py", "start_line": 4}, r"start_line 4 is past the end of src/main.py \(3 lines\)"),
        ({"path": "src/main.py", "start_line": 3, "end_line": 2}, r"end_line \(2\) is before start_line \(3\)"),
    ],
)
async def test_errors(ctx: ToolContext, args: dict[str, object], message: str) -> None:
    with pytest.raises(ToolError, match=message):
        await ReadFile().run(args, ctx)
