"""``edit_file``: replace one exact occurrence of a block of text in a file."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tools.base import (
    ParamSpec,
    ParamType,
    Resources,
    ToolContext,
    ToolError,
    ToolResult,
    ToolSpec,
    complete_in_thread,
)
from tools.paths import resource_key
from tools.workspace import Workspace

MAX_LOCATIONS = 10
MAX_EDIT_FILE_BYTES = 32 << 20
"""Largest file edit_file reads (it holds the old and the new content in memory)."""


class EditFile:
    """Not guaranteed: the read-modify-write is atomic per file only against other
    tool calls (the executor serialises writes to one path), not against commands.
    Files over 32 MiB are refused before they are read; the diff of a file over
    1 MiB is a one-line "large file, not shown" note."""

    spec = ToolSpec(
        name="edit_file",
        description=(
            "Replace text in an existing file. `search` must match the file's current content "
            "exactly once, byte for byte, including indentation and blank lines (read the file "
            "first); include enough surrounding lines to make it unique. `replace` is written in "
            "its place (it may be empty to delete). Returns the diff. Use write_file to create "
            "a file or rewrite it completely."
        ),
        params=(
            ParamSpec("path", ParamType.STRING, "File path relative to the workspace root."),
            ParamSpec("search", ParamType.TEXT, "Exact text to find (must occur exactly once)."),
            ParamSpec("replace", ParamType.TEXT, "Text to put in its place."),
        ),
    )

    def resources(self, args: Mapping[str, Any]) -> Resources:
        return Resources(writes=frozenset({resource_key(str(args.get("path", "")))}))

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        path: str = args["path"]
        search: str = args["search"]
        replace: str = args.get("replace") or ""
        if search == "":
            raise ToolError("search must not be empty; use write_file to create or overwrite a whole file")
        if search == replace:
            raise ToolError("search and replace are identical; nothing would change")
        return await complete_in_thread(_edit, ctx.workspace, path, search, replace)


def _edit(ws: Workspace, path: str, search: str, replace: str) -> ToolResult:
    size = ws.file_size(path)
    if size > MAX_EDIT_FILE_BYTES:
        raise ToolError(f"{path} is {size} bytes; edit_file edits files up to {MAX_EDIT_FILE_BYTES >> 20} MiB "
                        "(use run_command with a stream editor such as sed for larger files)")
    data = ws.read_bytes(path, limit=MAX_EDIT_FILE_BYTES + 1)
    if len(data) > MAX_EDIT_FILE_BYTES:
        raise ToolError(f"{path} grew past {MAX_EDIT_FILE_BYTES >> 20} MiB while it was read; edit_file "
                        "edits files up to that size")
    old, new = search.encode(), replace.encode()
    note = ""
    starts = _find_all(data, old)
    if not starts and b"\r\n" in data and b"\n" in old and b"\r" not in old:
        crlf_old = old.replace(b"\n", b"\r\n")
        if len(crlf_starts := _find_all(data, crlf_old)) == 1:
            old, new, starts = crlf_old, new.replace(b"\n", b"\r\n"), crlf_starts
            note = "(the file uses CRLF line endings; search and replace were converted to match)\n"
    if not starts:
        raise ToolError(_no_match_message(path, data, old))
    if len(starts) > 1:
        lines = [data.count(b"\n", 0, s) + 1 for s in starts]
        where = ", ".join(map(str, lines[:MAX_LOCATIONS])) + (", ..." if len(lines) > MAX_LOCATIONS else "")
        raise ToolError(
            f"search text occurs {len(starts)} times in {path} (starting at lines {where}); "
            "include more surrounding lines so that it matches exactly once"
        )
    i = starts[0]
    edit = ws.write_bytes(path, data[:i] + new + data[i + len(old):])
    return ToolResult(True, note + edit.diff, data={"path": edit.path, "line": data.count(b"\n", 0, i) + 1},
                      edits=[edit])


def _find_all(data: bytes, needle: bytes) -> list[int]:
    out, i = [], data.find(needle)
    while i >= 0:
        out.append(i)
        i = data.find(needle, i + len(needle))
    return out


def _no_match_message(path: str, data: bytes, needle: bytes) -> str:
    msg = f"search text not found in {path} (it must match the current content exactly)"
    tokens = needle.split()
    if tokens:
        loose = re.compile(rb"\s+".join(re.escape(t) for t in tokens))
        hits = [m.start() for m in loose.finditer(data)]
        if hits:
            lines = ", ".join(str(data.count(b"\n", 0, h) + 1) for h in hits[:MAX_LOCATIONS])
            msg += (f"; text matching except for whitespace/indentation exists at line(s) {lines}: "
                    "read_file those lines and copy them exactly")
            return msg
    return msg + "; read_file it again to see its current content"
