"""The contract every tool implements: its schema, its resources, its result.

A tool is one small module exposing a class that satisfies :class:`Tool`. The
same :class:`ToolSpec` drives three things, so they can never disagree:

* the tool description shown to the model (``agent.prompt``),
* validation of a parsed call (``agent.calls``),
* the executor's resource locking (``Tool.resources``).

Nothing here imports the agent package: tools know nothing of XML or events.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from tools.protocols import Sandbox, SearchIndex, Workspace


class ParamType(enum.StrEnum):
    """How a parameter's raw text body is interpreted.

    ``string`` values have surrounding whitespace stripped (paths, patterns);
    ``text`` values are byte-exact (file contents, search/replace blocks);
    ``number`` is a JSON number (``3``, ``-2.5e3``); ``json`` is any JSON value
    (objects and arrays of external tools' schemas, see :mod:`tools.mcp_schema`).
    """

    STRING = "string"
    TEXT = "text"
    INTEGER = "integer"
    BOOLEAN = "boolean"
    NUMBER = "number"
    JSON = "json"


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """One parameter. ``schema``, when set, is a JSON Schema (as canonical JSON text, so
    specs stay hashable) the typed value must also satisfy; ``agent.calls`` checks it
    (external tools' constraints: enums, ranges, object shapes)."""

    name: str
    type: ParamType
    description: str
    required: bool = True
    default: Any = None
    schema: str | None = None


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """Schema of one tool: the single source for prompt text and validation."""

    name: str
    description: str
    params: tuple[ParamSpec, ...]

    def param(self, name: str) -> ParamSpec | None:
        for p in self.params:
            if p.name == name:
                return p
        return None


WHOLE_TREE = "*"
"""Resource key meaning "every path in the workspace" (a shell command, a grep)."""


@dataclass(frozen=True, slots=True)
class Resources:
    """What a call reads and writes, for the executor's ordering.

    Keys are normalised workspace-relative paths, or :data:`WHOLE_TREE`. Two
    calls conflict when one's ``writes`` meet anything the other reads or
    writes. ``process_writes`` are writes by a separate process that runs
    alongside other calls (a shell command): they conflict with ``writes``
    (file-tool edits, in either order) but *not* with reads or with other
    process writes, so commands run concurrently with each other and with
    reads and searches. Paths are compared as strings after normalisation:
    two names for one file through a symlink are *not* detected as the same
    resource.
    """

    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()
    process_writes: frozenset[str] = frozenset()

    def conflicts_with(self, other: Resources) -> bool:
        return _overlap(self.writes, other.reads | other.writes | other.process_writes) or _overlap(
            other.writes, self.reads | self.process_writes
        )

    @property
    def may_write_anywhere(self) -> bool:
        """Whether the call may change any path (a shell command)."""
        return WHOLE_TREE in self.writes or WHOLE_TREE in self.process_writes


def _overlap(a: frozenset[str], b: frozenset[str]) -> bool:
    if not a or not b:
        return False
    if WHOLE_TREE in a or WHOLE_TREE in b:
        return True
    return not a.isdisjoint(b)


@dataclass(frozen=True, slots=True)
class FileEdit:
    """A change a tool made to one file, as a unified diff (``a/`` ``b/`` paths)."""

    path: str
    diff: str
    created: bool = False
    deleted: bool = False


MAX_RESULT_BYTES = 256 << 10
"""Cap on a result's ``output`` (UTF-8 bytes) as the model reads it; the executor enforces it."""
MAX_EDIT_DIFF_BYTES = 256 << 10
"""Cap on each ``FileEdit.diff`` a result carries to clients and the session log."""


def cut_text(text: str, limit: int) -> str | None:
    """``text`` cut to at most ``limit`` UTF-8 bytes, or None if it already fits.

    The cut falls at a line end when one is in the last quarter of the kept
    part, else at a character boundary. Surrogate escapes (from non-UTF-8
    bytes) are measured as three bytes each and kept.
    """
    if len(text) * 4 <= limit:
        return None
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return None
    cut = max(limit, 0)
    while cut > 0 and raw[cut] & 0xC0 == 0x80:  # not inside a multi-byte character
        cut -= 1
    line_end = raw.rfind(b"\n", 0, cut)
    if line_end >= cut * 3 // 4:
        cut = line_end + 1
    return raw[:cut].decode("utf-8", "surrogatepass")


@dataclass(slots=True)
class ToolResult:
    """What a tool returns. ``output`` is what the model reads.

    ``ok`` is False for a failed call (the model is told it failed); ``data``
    carries structured facts for clients (exit code, counts, truncation) and
    must be JSON-serialisable. Every result passes through :meth:`capped` in
    the executor, so a tool's own limits are a courtesy (a better cut), not
    the guarantee.
    """

    ok: bool
    output: str
    data: dict[str, Any] = field(default_factory=dict)
    edits: list[FileEdit] = field(default_factory=list)

    @classmethod
    def error(cls, message: str, **data: Any) -> ToolResult:
        return cls(ok=False, output=message, data=data)

    def capped(self, tool: str, more: str, limit: int = MAX_RESULT_BYTES,
               diff_limit: int = MAX_EDIT_DIFF_BYTES) -> ToolResult:
        """This result with ``output`` cut to ``limit`` bytes and each edit's diff to ``diff_limit``.

        A cut ends with a note naming what was cut and ``more`` (how to see
        the rest); ``data["output_cut"]`` then holds the original size in bytes.
        Returns ``self`` when nothing needs cutting.
        """
        kept = cut_text(self.output, max(limit - 400, 0))
        edits = [_capped_edit(e, diff_limit) for e in self.edits]
        if kept is None and all(a is b for a, b in zip(edits, self.edits, strict=True)):
            return self
        data = dict(self.data)
        output = self.output
        if kept is not None:
            total = len(self.output.encode("utf-8", "surrogatepass"))
            shown = len(kept.encode("utf-8", "surrogatepass"))
            output = (f"{kept}{'' if kept.endswith(chr(10)) else chr(10)}[... output cut: {tool} returned "
                      f"{total} bytes, only the first {shown} are shown (the limit is {limit}). {more}]\n")
            data["output_cut"] = total
        return ToolResult(self.ok, output, data, edits)


def _capped_edit(edit: FileEdit, limit: int) -> FileEdit:
    kept = cut_text(edit.diff, max(limit - 200, 0))
    if kept is None:
        return edit
    note = (f"{kept}{'' if kept.endswith(chr(10)) else chr(10)}[... diff cut: "
            f"{len(edit.diff.encode('utf-8', 'surrogatepass'))} bytes in all; read the file to see the rest]\n")
    return FileEdit(edit.path, note, edit.created, edit.deleted)


class ToolError(Exception):
    """Raised inside a tool for a failure the model should read and fix.

    The executor turns it into ``ToolResult.error(str(exc))``; any other
    exception is reported as an internal error (and logged).
    """


@dataclass(slots=True)
class ToolContext:
    """What a running tool may touch: its workspace, the sandbox, and (optionally)
    the workspace's search index, which the executor tells about every edit."""

    workspace: Workspace  # tools.protocols.Workspace: any implementation, not only tools.workspace's
    sandbox: Sandbox | None = None
    search_index: SearchIndex | None = None

    def after_call(self, resources: Resources, result: ToolResult) -> None:
        """Tell the search index what a finished call changed: its FileEdits, and
        whether it may have written anywhere (a shell command). Cheap; no-op without an index."""
        if self.search_index is not None and (result.edits or resources.may_write_anywhere):
            self.search_index.notify_edits([e.path for e in result.edits],
                                           tree_changed=resources.may_write_anywhere)


@runtime_checkable
class Tool(Protocol):
    """One tool. ``run`` receives arguments already validated and typed."""

    spec: ToolSpec

    def resources(self, args: Mapping[str, Any]) -> Resources: ...

    async def run(self, args: Mapping[str, Any], ctx: ToolContext) -> ToolResult: ...


T = TypeVar("T")


async def complete_in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run blocking ``fn`` in a thread and see it through even if cancelled.

    For writes: a thread cannot be stopped, so on cancellation this waits for
    ``fn`` and returns its result anyway. The write is then reported as done
    (it was), instead of landing after an interrupt that said "cancelled".
    Only for short operations: the cancellation is delayed until ``fn`` ends.
    """
    future = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        return await future
