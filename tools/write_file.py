"""``write_file``: create a file or replace its whole content."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tools.base import ParamSpec, ParamType, Resources, ToolContext, ToolResult, ToolSpec, complete_in_thread
from tools.paths import resource_key

MAX_DIFF_IN_OUTPUT = 32 << 10


class WriteFile:
    """Not guaranteed: a new file gets mode 0644; an overwritten file keeps its mode
    but not its owner or hard links (the file is replaced by rename)."""

    spec = ToolSpec(
        name="write_file",
        description=(
            "Create a file, or replace the whole content of an existing one, with `content` "
            "(written exactly as given; missing parent directories are created). Writing through "
            "a symlink writes its target. Returns the diff. Prefer edit_file for small changes "
            "to an existing file."
        ),
        params=(
            ParamSpec("path", ParamType.STRING, "File path relative to the workspace root."),
            ParamSpec("content", ParamType.TEXT, "The complete new content of the file."),
        ),
    )

    def resources(self, args: Mapping[str, Any]) -> Resources:
        return Resources(writes=frozenset({resource_key(str(args.get("path", "")))}))

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        content: str = args.get("content") or ""
        data = content.encode()
        edit = await complete_in_thread(ctx.workspace.write_bytes, args["path"], data)
        verb = "created" if edit.created else "wrote"
        head = f"{verb} {edit.path} ({len(data)} bytes)\n"
        diff = edit.diff or "(content unchanged)\n"
        if len(diff) > MAX_DIFF_IN_OUTPUT:
            diff = diff[:MAX_DIFF_IN_OUTPUT] + f"\n[... diff cut at {MAX_DIFF_IN_OUTPUT} characters]\n"
        return ToolResult(True, head + diff, data={"path": edit.path, "created": edit.created,
                                                   "bytes": len(data)},
                          edits=[edit] if edit.diff or edit.created else [])
