"""``list_dir``: the entries of one directory (not recursive)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tools.base import (
    MAX_RESULT_BYTES,
    WHOLE_TREE,
    ParamSpec,
    ParamType,
    Resources,
    ToolContext,
    ToolError,
    ToolResult,
    ToolSpec,
)
from tools.paths import display_path
from tools.treewalk import short_path

if TYPE_CHECKING:
    from tools.protocols import Workspace
    from tools.workspace import DirEntryInfo

MAX_ENTRIES = 1000
MAX_TARGET_CHARS = 200
MAX_OUTPUT_BYTES = MAX_RESULT_BYTES - (4 << 10)


class ListDir:
    """Not guaranteed: ``.gitignore`` is not applied (every entry is listed); a symlink's
    target is shown cut to 200 characters."""

    spec = ToolSpec(
        name="list_dir",
        description=(
            "List one directory of the workspace (not recursive), sorted by name. "
            "Directories end with '/', symlinks are shown as 'name -> target'. "
            f"At most {MAX_ENTRIES} entries are shown. Use glob to find files by name pattern. "
            "Bytes of a name that are not UTF-8 are shown as \\xHH; pass such a name back as shown."
        ),
        params=(
            ParamSpec("path", ParamType.STRING,
                      "Directory relative to the workspace root; '.' is the root.", False, "."),
        ),
    )

    def resources(self, args: Mapping[str, Any]) -> Resources:
        return Resources(reads=frozenset({WHOLE_TREE}))

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        path: str = args.get("path") or "."
        entries = await asyncio.to_thread(_entries, ctx.workspace, path)  # one thread hop for the checks and the listing
        rows: list[str] = []
        size = 0
        for e in entries[:MAX_ENTRIES]:
            name = display_path(e.name)
            if e.kind == "dir":
                row = f"{name}/"
            elif e.kind == "symlink":
                row = f"{name} -> {display_path(short_path(e.target or '', MAX_TARGET_CHARS))}"
            else:
                row = name
            size += len(row.encode()) + 1
            if size > MAX_OUTPUT_BYTES:
                break
            rows.append(row)
        if not entries:
            return ToolResult(True, f"{path}: empty directory", data={"count": 0})
        truncated = len(rows) < len(entries)
        if truncated:
            rows.append(f"[... {len(entries) - len(rows)} more entries not shown "
                        f"({len(entries)} in total); list a subdirectory or use glob to narrow down]")
        return ToolResult(True, "\n".join(rows) + "\n", data={"count": len(entries), "truncated": truncated})


def _entries(ws: Workspace, path: str) -> list[DirEntryInfo]:
    if ws.exists(path) and not ws.is_dir(path):
        raise ToolError(f"{path} is a file, not a directory (use read_file)")
    return ws.listdir(path)
