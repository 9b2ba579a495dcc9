"""``read_file``: show a text file (or a line range of it) with line numbers."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tools.base import MAX_RESULT_BYTES, ParamSpec, ParamType, Resources, ToolContext, ToolError, ToolResult, ToolSpec
from tools.diffs import is_binary, split_lines
from tools.paths import resource_key

if TYPE_CHECKING:
    from tools.protocols import Workspace

MAX_LINES = 2000
MAX_OUTPUT_BYTES = MAX_RESULT_BYTES - (4 << 10)  # room for the notes under the executor's cap
MAX_LINE_CHARS = 8000
MAX_FILE_BYTES = 64 << 20

_DESCRIPTION = f"""\
Read a file in the workspace. Each line is shown as its 1-based line number, a tab, \
then the line's text. At most {MAX_LINES} lines or {MAX_OUTPUT_BYTES // 1024} KiB are shown per call; \
a marker at the end says which start_line reads the rest. Lines longer than \
{MAX_LINE_CHARS} characters are cut. Binary files are not shown (only their size). \
Use list_dir for directories."""


class ReadFile:
    """Not guaranteed: files over 64 MiB are refused (before any byte is read); non-UTF-8
    text counts as binary."""

    spec = ToolSpec(
        name="read_file",
        description=_DESCRIPTION,
        params=(
            ParamSpec("path", ParamType.STRING, "File path relative to the workspace root."),
            ParamSpec("start_line", ParamType.INTEGER, "First line to show (1-based).", False, 1),
            ParamSpec("end_line", ParamType.INTEGER,
                      "Last line to show (inclusive); default: as many as fit.", False, None),
        ),
    )

    def resources(self, args: Mapping[str, Any]) -> Resources:
        return Resources(reads=frozenset({resource_key(str(args.get("path", "")))}))

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        path: str = args["path"]
        start: int = 1 if args.get("start_line") is None else args["start_line"]
        end: int | None = args.get("end_line")
        if start < 1:
            raise ToolError(f"start_line must be >= 1 (got {start})")
        if end is not None and end < start:
            raise ToolError(f"end_line ({end}) is before start_line ({start})")
        data = await asyncio.to_thread(_read, ctx.workspace, path)  # one thread hop for both steps
        if len(data) > MAX_FILE_BYTES:
            raise ToolError(
                f"{path} is larger than {MAX_FILE_BYTES >> 20} MiB; use grep to find the lines you need"
            )
        if is_binary(data):
            return ToolResult(True, f"{path}: binary file, {len(data)} bytes (not shown)",
                              data={"binary": True, "size": len(data)})
        return _render(path, data.decode("utf-8"), start, end)


def _read(ws: Workspace, path: str) -> bytes:
    size = ws.file_size(path)
    if size > MAX_FILE_BYTES:
        raise ToolError(f"{path} is {size} bytes, larger than read_file's {MAX_FILE_BYTES >> 20} MiB "
                        "limit; use grep to find the lines you need")
    return ws.read_bytes(path, limit=MAX_FILE_BYTES + 1)


def _render(path: str, text: str, start: int, end: int | None) -> ToolResult:
    lines = split_lines(text)
    total = len(lines)
    if total == 0:
        return ToolResult(True, f"{path}: empty file (0 bytes)", data={"total_lines": 0})
    if start > total:
        raise ToolError(f"start_line {start} is past the end of {path} ({total} lines)")
    last = min(end or total, total)
    out: list[str] = []
    size = 0
    shown_last = start - 1
    for n in range(start, last + 1):
        body = lines[n - 1].removesuffix("\n").removesuffix("\r")
        if len(body) > MAX_LINE_CHARS:
            body = f"{body[:MAX_LINE_CHARS]}… [line cut: {len(body)} characters]"
        row = f"{n:>5}\t{body}\n"
        if n - start >= MAX_LINES or size + len(row.encode()) > MAX_OUTPUT_BYTES:
            break
        out.append(row)
        size += len(row.encode())
        shown_last = n
    truncated = shown_last < last
    if truncated:
        out.append(f"[... truncated: showing lines {start}-{shown_last} of {total}; "
                   f"call read_file with start_line={shown_last + 1} to read more]\n")
    if "\r\n" in text:
        out.insert(0, "[this file uses CRLF (\\r\\n) line endings; they are not shown]\n")
    return ToolResult(True, "".join(out), data={
        "path": path, "total_lines": total, "start_line": start, "end_line": shown_last,
        "truncated": truncated,
    })
