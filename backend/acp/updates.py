"""Flywheel events as ACP session updates (``session/update`` notifications).

One :class:`UpdateMapper` per ACP session turns the session's event stream
(:mod:`agent.events`, the same stream the log, the WebSocket and replay carry)
into ACP updates:

* ``assistant_delta`` -> ``agent_message_chunk``; ``user_message`` ->
  ``user_message_chunk`` (only when a recorded session is replayed: live, the
  editor already shows what the user typed);
* ``tool_call_started`` -> ``tool_call`` at once, with its kind (``read``,
  ``edit``, ``search``, ``execute``, ``other``) and the file locations it touches;
* held, queued, running, live output and the result -> ``tool_call_update``
  with the status (``pending``, ``in_progress``, ``completed``, ``failed``)
  and the content so far (the output as text);
* ``file_edit`` -> a ``diff`` content item (absolute path, old text, new text)
  on the call that made it; a command's result also carries a ``diff`` for each
  file it changed that was written back to the editor, and a notice of what was
  and was not (``notes``, :mod:`backend.acp.command_sync`; live only).

The kind comes from the tool's declared resources (:meth:`tools.base.Tool.resources`),
as approval kinds do, not from a list of names: a process that may write is
``execute``, a direct write ``edit``, a read of the whole tree ``search``, a
read of named paths ``read``; a tool this module does not know is ``other``.

Diff texts: an :class:`EditTexts` (the in-process file bridge records every
write, :mod:`backend.acp.fs_bridge`) gives the whole old and new file; without
one (replay, the thin bridge to a server) the diff's hunks are used, so the
old and new texts are the changed lines with their context, not whole files.

Not guaranteed: live output shown in an update is capped (the last
:data:`MAX_SHOWN_OUTPUT` characters); a diff rebuilt from hunks of a
"large file, not shown" note carries the note, not the text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from acp import (
    start_tool_call,
    text_block,
    tool_content,
    tool_diff_content,
    update_agent_message_text,
    update_tool_call,
    update_user_message_text,
)
from acp.schema import ToolCallLocation, ToolKind

from agent.events import (
    ApprovalRequested,
    AssistantDelta,
    ErrorEvent,
    Event,
    FileEditEvent,
    ToolCallQueued,
    ToolCallRunning,
    ToolCallStarted,
    ToolOutputDelta,
    ToolResultEvent,
    TurnEnd,
    UserMessage,
)
from tools.base import WHOLE_TREE, Tool
from tools.registry import default_tools

MAX_SHOWN_OUTPUT = 64 << 10
"""Characters of a call's live output or result shown in an update (the tail)."""

_PATH_PARAMS = ("path",)


class WrittenBack(Protocol):
    path: str
    old: str | None
    new: str


class CommandNotes(Protocol):
    """What a command's write-back did (:class:`backend.acp.command_sync.CommandReports`)."""

    def take(self, call_id: str) -> Any:
        """The report for ``call_id`` (``written``: :class:`WrittenBack` items, ``notice()``), or None."""
        ...


class EditTexts(Protocol):
    """Whole-file texts of the writes a session made, oldest first per path."""

    def take(self, path: str) -> tuple[str | None, str] | None:
        """The (old, new) text of the oldest write to ``path`` not taken yet; None if unknown."""
        ...


@dataclass(slots=True)
class _Call:
    name: str
    args: dict[str, Any]
    kind: ToolKind
    output: str = ""
    diffs: list[Any] = field(default_factory=list)
    result: str | None = None
    status: Any = "in_progress"
    notice: str = ""


def tool_kind(tool: Tool | None, args: Mapping[str, Any]) -> ToolKind:
    """The ACP kind of a call: from the tool's declared resources (``other`` for an unknown tool)."""
    if tool is None:
        return "other"
    try:
        res = tool.resources(args)
    except Exception:  # a tool that cannot say: do not guess
        return "other"
    if res.process_writes:
        return "execute"
    if res.writes:
        return "edit"
    if WHOLE_TREE in res.reads:
        return "search"
    return "read" if res.reads else "other"


def hunk_texts(diff: str) -> tuple[str, str]:
    """The old and new text of a unified diff's hunks (context lines in both), read by
    the hunk headers' line counts, so a removed line that starts with ``--`` is not a header."""
    old: list[str] = []
    new: list[str] = []
    left = right = 0
    for line in diff.splitlines(keepends=True):
        if left <= 0 and right <= 0:
            m = _HUNK.match(line)
            if m:
                left = int(m.group(1)) if m.group(1) is not None else 1
                right = int(m.group(2)) if m.group(2) is not None else 1
            continue
        tag, body = line[:1], line[1:]
        if tag == " ":
            old.append(body)
            new.append(body)
            left, right = left - 1, right - 1
        elif tag == "-":
            old.append(body)
            left -= 1
        elif tag == "+":
            new.append(body)
            right -= 1
    return "".join(old), "".join(new)


_HUNK = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


class UpdateMapper:
    """Maps one session's events to ACP updates; keeps each call's content so far.

    ``cwd`` is the editor's project directory: locations and diff paths are
    absolute paths beneath it (ACP requires absolute paths). ``texts`` gives
    whole-file diff texts (see the module docstring).
    """

    def __init__(self, cwd: Path, *, texts: EditTexts | None = None, tools: list[Tool] | None = None,
                 notes: CommandNotes | None = None) -> None:
        self.cwd = Path(cwd)
        self.texts = texts
        self.notes = notes
        self.tools = {t.spec.name: t for t in (tools if tools is not None else default_tools(semantic_search=True))}
        self.calls: dict[str, _Call] = {}

    def map(self, event: Event, *, replaying: bool = False) -> list[Any]:
        """The updates for ``event`` (often none). ``replaying``: the event comes from the
        log (``session/load``), so user messages are shown too."""
        if isinstance(event, AssistantDelta):
            return [update_agent_message_text(event.text)] if event.text else []
        if isinstance(event, UserMessage):
            return [update_user_message_text(event.text)] if replaying else []
        if isinstance(event, ToolCallStarted):
            return [self._started(event)]
        if isinstance(event, ApprovalRequested | ToolCallQueued):
            return [update_tool_call(event.call_id, status="pending")] if event.call_id in self.calls else []
        if isinstance(event, ToolCallRunning):
            return [update_tool_call(event.call_id, status="in_progress")] if event.call_id in self.calls else []
        if isinstance(event, ToolOutputDelta):
            return self._output(event)
        if isinstance(event, ToolResultEvent):
            return self._result(event)
        if isinstance(event, FileEditEvent):
            return self._edit(event)
        if isinstance(event, ErrorEvent):
            return [update_agent_message_text(f"\n\n[{event.source} error: {event.message}]\n")]
        if isinstance(event, TurnEnd) and event.reason in ("timeout", "max_steps", "max_tokens") and event.detail:
            return [update_agent_message_text(f"\n\n[stopped: {event.detail}]\n")]
        return []

    # -- calls ------------------------------------------------------------------

    def locations(self, name: str, args: Mapping[str, Any], line: int | None = None) -> list[ToolCallLocation]:
        """The files a call touches, as absolute paths beneath ``cwd`` (none for a path that leaves it)."""
        out = []
        for key in _PATH_PARAMS:
            value = args.get(key)
            if not isinstance(value, str) or not value.strip():
                continue
            path = self.absolute(value.strip())
            if path is None:
                continue
            if line is None and name == "read_file" and isinstance(args.get("start_line"), int):
                line = args["start_line"]
            out.append(ToolCallLocation(path=path, line=line))
        return out

    def absolute(self, rel: str) -> str | None:
        """``rel`` (workspace-relative) as an absolute path beneath ``cwd``; None if it would leave it."""
        base = self.cwd.resolve()
        path = (base / rel.lstrip("/")).resolve() if not rel.startswith("/") else Path(rel).resolve()
        return str(path) if path == base or path.is_relative_to(base) else None

    def _started(self, e: ToolCallStarted) -> Any:
        tool = self.tools.get(e.name)
        kind = tool_kind(tool, e.args) if e.valid else "other"
        self.calls[e.call_id] = _Call(e.name, dict(e.args), kind)
        return start_tool_call(
            e.call_id, _title(e.name, e.args), kind=kind, status="in_progress" if e.valid else "pending",
            locations=self.locations(e.name, e.args), raw_input=dict(e.args),
        )

    def _output(self, e: ToolOutputDelta) -> list[Any]:
        call = self.calls.get(e.call_id)
        if call is None:
            return []
        call.output = (call.output + e.text)[-MAX_SHOWN_OUTPUT:]
        return [update_tool_call(e.call_id, status="in_progress", content=self._content(call))]

    def _result(self, e: ToolResultEvent) -> list[Any]:
        call = self.calls.get(e.call_id)
        if call is None:  # a result for a call we never saw (a page boundary): show it anyway
            call = self.calls[e.call_id] = _Call(e.name, {}, "other")
        call.result = e.output[-MAX_SHOWN_OUTPUT:]
        call.status = "completed" if e.ok else "failed"
        report = self.notes.take(e.call_id) if self.notes is not None and call.kind == "execute" else None
        if report is not None:
            for w in report.written:
                path = self.absolute(w.path)
                if path is not None:
                    call.diffs.append(tool_diff_content(path, w.new, w.old))
            call.notice = report.notice()
        line = e.data.get("line") if isinstance(e.data.get("line"), int) else None
        return [update_tool_call(
            e.call_id, status=call.status, content=self._content(call),
            locations=self.locations(call.name, call.args, line) if line is not None else None,
            raw_output={"ok": e.ok, "output": call.result, "data": e.data},
        )]

    def _edit(self, e: FileEditEvent) -> list[Any]:
        call = self.calls.get(e.call_id)
        path = self.absolute(e.path)
        if call is None or path is None:
            return []
        texts = self.texts.take(e.path) if self.texts is not None else None
        old, new = texts if texts is not None else hunk_texts(e.diff)
        if e.created and texts is None:
            old = None  # type: ignore[assignment]
        call.diffs.append(tool_diff_content(path, "" if e.deleted else new, old))
        return [update_tool_call(e.call_id, status=call.status, content=self._content(call))]

    @staticmethod
    def _content(call: _Call) -> list[Any]:
        shown = call.result if call.result is not None else call.output
        items: list[Any] = list(call.diffs)
        if shown:
            fence = "```" if call.kind == "execute" else ""
            body = f"{fence}\n{shown.rstrip()}\n{fence}" if fence else shown
            items.append(tool_content(text_block(body)))
        if call.notice:
            items.append(tool_content(text_block(call.notice)))
        return items


def _title(name: str, args: Mapping[str, Any]) -> str:
    """A one-line title: the command for a command, else the tool and its main argument."""
    for key in ("command", "path", "pattern", "query"):
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            first = value.strip().splitlines()[0]
            short = first if len(first) <= 120 else first[:117] + "..."
            return short if key == "command" else f"{name} {short}"
    return name
