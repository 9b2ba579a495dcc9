"""``glob``: find files by gitignore-style glob pattern, via ripgrep."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from tools.base import WHOLE_TREE, ParamSpec, ParamType, Resources, ToolContext, ToolError, ToolResult, ToolSpec
from tools.argv import ArgvError, check_arg
from tools.ripgrep import list_files

MAX_RESULTS = 500


class Glob:
    """Not guaranteed: directories themselves are never listed, only files; a
    symlinked search root is reported under its real path."""

    spec = ToolSpec(
        name="glob",
        description=(
            "Find files whose path matches a glob pattern (gitignore syntax: '*.py' matches at any "
            "depth, '**/' spans directories, 'src/**/*.ts', '*.{js,ts}'). Files ignored by "
            ".gitignore are left out; hidden files are included. Returns sorted paths relative "
            f"to the workspace root, at most {MAX_RESULTS}."
        ),
        params=(
            ParamSpec("pattern", ParamType.STRING, "Glob pattern, e.g. '**/*.py'."),
            ParamSpec("path", ParamType.STRING,
                      "Directory to search in, relative to the workspace root.", False, "."),
        ),
    )

    def resources(self, args: Mapping[str, Any]) -> Resources:
        return Resources(reads=frozenset({WHOLE_TREE}))

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        pattern: str = args["pattern"]
        path: str = args.get("path") or "."
        if not pattern:
            raise ToolError("pattern must not be empty (e.g. '**/*.py')")
        try:
            check_arg("pattern", pattern)
        except ArgvError as exc:
            raise ToolError(str(exc)) from None
        ws = ctx.workspace
        real = await asyncio.to_thread(ws.real_path, path)
        if not await asyncio.to_thread(ws.is_dir, real):
            raise ToolError(f"path {path} is not a directory")
        files = await list_files(ws.root, real, pattern)
        if not files:
            return ToolResult(True, f"no files match {pattern!r}", data={"count": 0})
        shown = files[:MAX_RESULTS]
        head = f"{len(files)} files match {pattern!r}"
        if len(files) > MAX_RESULTS:
            head += f" (showing first {MAX_RESULTS}; narrow the pattern or path to see the rest)"
        return ToolResult(True, head + "\n" + "\n".join(shown) + "\n",
                          data={"count": len(files), "truncated": len(files) > MAX_RESULTS})
