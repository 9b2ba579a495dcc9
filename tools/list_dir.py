"""``list_dir``: the entries of one directory (not recursive)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from tools.base import WHOLE_TREE, ParamSpec, ParamType, Resources, ToolContext, ToolError, ToolResult, ToolSpec

MAX_ENTRIES = 1000


class ListDir:
    """Not guaranteed: ``.gitignore`` is not applied (every entry is listed)."""

    spec = ToolSpec(
        name="list_dir",
        description=(
            "List one directory of the workspace (not recursive), sorted by name. "
            "Directories end with '/', symlinks are shown as 'name -> target'. "
            f"At most {MAX_ENTRIES} entries are shown. Use glob to find files by name pattern."
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
        ws = ctx.workspace
        if await asyncio.to_thread(ws.exists, path) and not await asyncio.to_thread(ws.is_dir, path):
            raise ToolError(f"{path} is a file, not a directory (use read_file)")
        entries = await asyncio.to_thread(ws.listdir, path)
        rows = []
        for e in entries[:MAX_ENTRIES]:
            if e.kind == "dir":
                rows.append(f"{e.name}/")
            elif e.kind == "symlink":
                rows.append(f"{e.name} -> {e.target}")
            else:
                rows.append(e.name)
        if not rows:
            return ToolResult(True, f"{path}: empty directory", data={"count": 0})
        if len(entries) > MAX_ENTRIES:
            rows.append(f"[... {len(entries) - MAX_ENTRIES} more entries not shown "
                        f"({len(entries)} in total); use glob to narrow down]")
        return ToolResult(True, "\n".join(rows) + "\n",
                          data={"count": len(entries), "truncated": len(entries) > MAX_ENTRIES})
