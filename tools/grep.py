"""``grep``: search file contents by regular expression, via ripgrep's JSON output.

Refused before ripgrep runs: an empty pattern, a pattern or glob with a NUL
byte or over 128 KiB, and a ``path`` naming something other than a regular
file or directory (a FIFO would block the search until the timeout).
"""

from __future__ import annotations

import asyncio
import base64
import json
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tools.base import WHOLE_TREE, ParamSpec, ParamType, Resources, ToolContext, ToolError, ToolResult, ToolSpec
from tools.argv import ArgvError, check_arg
from tools.paths import stat_beneath
from tools.ripgrep import list_files, run_rg

if TYPE_CHECKING:
    from tools.protocols import Workspace

MAX_MATCHES = 200
MAX_OUTPUT_BYTES = 64 << 10
MAX_LINE_CHARS = 500
MAX_CONTEXT = 10


class Grep:
    """Not guaranteed: binary files are skipped (ripgrep's default); lines are cut at
    500 characters; a symlinked search root is reported under its real path; a
    file replaced by a FIFO between the check and the search (by a command
    running alongside) blocks until ripgrep's timeout."""

    spec = ToolSpec(
        name="grep",
        description=(
            "Search file contents with a regular expression (Rust regex syntax: no look-around "
            "or backreferences). Files ignored by .gitignore are skipped; hidden files are "
            "searched. Output lines are 'path:line: text' for matches and 'path-line- text' for "
            f"context, '--' between separate groups. At most {MAX_MATCHES} matching lines are shown."
        ),
        params=(
            ParamSpec("pattern", ParamType.STRING, "Regular expression to search for."),
            ParamSpec("path", ParamType.STRING,
                      "File or directory to search, relative to the workspace root.", False, "."),
            ParamSpec("glob", ParamType.STRING,
                      "Only search files matching this glob (e.g. '*.py'); applies to directories.",
                      False, None),
            ParamSpec("case_insensitive", ParamType.BOOLEAN, "Ignore case.", False, False),
            ParamSpec("context", ParamType.INTEGER,
                      f"Lines of context before and after each match (0-{MAX_CONTEXT}).", False, 0),
        ),
    )

    def resources(self, args: Mapping[str, Any]) -> Resources:
        return Resources(reads=frozenset({WHOLE_TREE}))

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult:
        pattern: str = args["pattern"]
        path: str = args.get("path") or "."
        glob: str | None = args.get("glob") or None
        context: int = args.get("context") or 0
        if not pattern:
            raise ToolError("pattern must not be empty")
        if not 0 <= context <= MAX_CONTEXT:
            raise ToolError(f"context must be between 0 and {MAX_CONTEXT} (got {context})")
        try:
            check_arg("pattern", pattern)
            if glob:
                check_arg("glob", glob)
        except ArgvError as exc:
            raise ToolError(str(exc)) from None
        ws = ctx.workspace
        real, mode = await asyncio.to_thread(_resolve, ws, path)  # one thread hop for both
        is_dir = stat.S_ISDIR(mode)
        if not is_dir and not stat.S_ISREG(mode):
            raise ToolError(f"path {path} is not a regular file or directory (a FIFO, socket or device): "
                            "grep searches only files")
        # Sorted output (single-threaded rg): the same tree gives the same
        # result, which replay and RL rely on.
        flags = ["--json", "--line-number", "--sort", "path"]
        if args.get("case_insensitive"):
            flags.append("--ignore-case")
        if context:
            flags.append(f"--context={context}")
        allowed: set[str] | None = None
        if glob and is_dir:
            flags += ["--glob", glob]
            allowed = set(await list_files(ws.root, real))  # --glob overrides .gitignore
        flags += ["--regexp", pattern]
        if real != ".":
            flags += ["--", real]
        collector = _Collector(allowed)
        res = await run_rg(flags, ws.root, collector.feed)
        if res.returncode == 2 and res.stderr.startswith("No files were searched"):
            return ToolResult(True, "no matches (no file matched the path and glob)",
                              data={"matches": 0, "files": 0, "shown": 0, "truncated": False})
        if res.returncode == 2 and not collector.matches:
            msg = res.stderr or "ripgrep failed"
            if "regex" in msg:
                raise ToolError(f"invalid regex {pattern!r}:\n{msg}")
            raise ToolError(msg)
        return collector.result(res.stderr if res.returncode == 2 else "", res.dropped_lines)


@dataclass
class _Collector:
    """Turns ripgrep's JSON messages into capped, grep-style text."""

    allowed: set[str] | None
    matches: int = 0
    files: set[str] = field(default_factory=set)
    rows: list[str] = field(default_factory=list)
    size: int = 0
    shown: int = 0
    full: bool = False
    _last: tuple[str, int] | None = None

    def feed(self, line: bytes) -> None:
        msg = json.loads(line)
        kind = msg.get("type")
        if kind not in ("match", "context"):
            return
        data = msg["data"]
        path = _text(data["path"])
        if self.allowed is not None and path not in self.allowed:
            return
        number = int(data.get("line_number") or 0)
        if kind == "match":
            self.matches += 1
            self.files.add(path)
        if self.full or (kind == "match" and self.shown >= MAX_MATCHES):
            self.full = True
            return
        text = _text(data["lines"]).removesuffix("\n").removesuffix("\r")
        if len(text) > MAX_LINE_CHARS:
            text = f"{text[:MAX_LINE_CHARS]}… [+{len(text) - MAX_LINE_CHARS} chars]"
        sep = ":" if kind == "match" else "-"
        rows = []
        if self._last is not None and self._last != (path, number - 1):
            rows.append("--\n")
        rows.append(f"{path}{sep}{number}{sep} {text}\n")
        cost = sum(len(r.encode()) for r in rows)
        if self.size + cost > MAX_OUTPUT_BYTES:
            self.full = True
            return
        self.rows += rows
        self.size += cost
        self._last = (path, number)
        if kind == "match":
            self.shown += 1

    def result(self, warning: str, dropped: int) -> ToolResult:
        data = {"matches": self.matches, "files": len(self.files), "shown": self.shown,
                "truncated": self.full}
        if not self.matches:
            return ToolResult(True, "no matches", data=data)
        head = f"{self.matches} matches in {len(self.files)} files"
        if self.full:
            head += f" (showing first {self.shown}; narrow the pattern, path or glob to see the rest)"
        tail = ""
        if dropped:
            tail += f"[{dropped} over-long lines were not shown]\n"
        if warning:
            tail += f"[some files could not be searched: {warning[:500]}]\n"
        return ToolResult(True, head + "\n" + "".join(self.rows) + tail, data=data)


def _text(obj: Mapping[str, Any]) -> str:
    if "text" in obj:
        return str(obj["text"])
    return base64.b64decode(obj.get("bytes", "")).decode("utf-8", "replace")


def _resolve(ws: Workspace, path: str) -> tuple[str, int]:
    """``path``'s real path inside the workspace and its mode (``stat_beneath``: no escaping)."""
    real = ws.real_path(path)
    return real, stat_beneath(ws.root, real).st_mode
