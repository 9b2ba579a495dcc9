"""Human-readable live transcript of the event stream (``flywheel run``, ``flywheel chat``).

Colour is used only on a terminal and never when ``NO_COLOR`` is set.
Long tool outputs are shortened to their first lines; ``--json`` gives the
full events.

What a call is doing is shown as it happens: ``▶`` when it is dispatched
(a command line in full, every line of it, up to :data:`COMMAND_LINES`),
``⏸`` while it waits for earlier calls, ``?`` while it waits for the user's
approval and the answer, its output line by line as it streams
(``tool_output_delta``; up to ``max_live_lines`` per call, with a header
naming the call when several calls print at once), then ``✓``/``✗`` with
its call id and duration. A call whose output was shown live is not shown
again with its result: only the result's first line (a command's exit
status; a cancelled call's "cancelled … after running N s"), and the end of
the output when the live view stopped early.

Every string that comes from an event (model text, tool names and
arguments, command output, file names, diffs, error messages) is untrusted
and passes through :func:`agent.text_safety.inert` before it is written, so
escape sequences in it are shown (``^[]0;title^G``), never acted on; the
colour codes are added afterwards. Not guaranteed: a line is cut at 200
characters of the *original* text, so an escaped line may be longer (command
lines are not cut: they are shown in full and wrap on the terminal).
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from dataclasses import dataclass

from agent.events import (
    ApprovalRequested,
    ApprovalResolved,
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
from agent.text_safety import inert

_EDITING_TOOLS = {"edit_file", "write_file"}
_CODES = {"dim": "2", "bold": "1", "red": "31", "green": "32", "yellow": "33", "blue": "34", "cyan": "36"}
COMMAND_LINES = 40
"""A command of more lines than this shows its first ones and how many more there are."""


@dataclass(slots=True)
class _Live:
    """One call's streamed output as shown so far."""

    name: str
    partial: str = ""  # the last line, until its newline arrives
    shown: int = 0  # lines printed
    stopped: bool = False  # max_live_lines reached, or the server's cap


class Transcript:
    def __init__(self, out: TextIO = sys.stdout, *, color: bool | None = None, max_lines: int = 12,
                 max_live_lines: int = 200):
        self.out = out
        if color is None:
            color = out.isatty() and "NO_COLOR" not in os.environ
        self.color = color
        self.max_lines = max_lines
        self.max_live_lines = max_live_lines
        self._mid_line = False
        self._after_tool = False  # swallow the newlines the model writes between calls
        self._names: dict[str, str] = {}  # call id -> tool name
        self._live: dict[str, _Live] = {}  # call id -> its streamed output
        self._last_live: str | None = None  # the call whose output was printed last

    def _c(self, style: str, text: str) -> str:
        if not self.color:
            return text
        codes = ";".join(_CODES[s] for s in style.split())
        return f"\x1b[{codes}m{text}\x1b[0m"

    def _line(self, text: str) -> None:
        if self._mid_line:
            self.out.write("\n")
            self._mid_line = False
        self.out.write(text + "\n")
        self.out.flush()
        self._after_tool = True

    def __call__(self, event: Event) -> None:
        if isinstance(event, UserMessage):
            self._line(self._c("bold blue", "you › ") + inert(event.text))
        elif isinstance(event, AssistantDelta):
            text = event.text.lstrip("\n") if self._after_tool else event.text
            if not text:
                return  # blank lines between tool calls
            self._after_tool = False
            text = inert(text)
            self.out.write(text)
            self.out.flush()
            self._mid_line = not text.endswith("\n")
        elif isinstance(event, ToolCallStarted):
            self._names[event.call_id] = event.name or "call"
            self._started(event)
        elif isinstance(event, ToolCallQueued):
            waiting = ", ".join(event.waiting_for) or "earlier calls"
            self._line(self._c("yellow", f"⏸ {inert(self._name(event.call_id))} ") + self._id(event.call_id)
                       + self._c("yellow", f" queued: waiting for {inert(waiting)}"))
        elif isinstance(event, ToolCallRunning):
            self._line(self._c("dim", f"▷ {inert(self._name(event.call_id))} {inert(event.call_id)} running"))
        elif isinstance(event, ApprovalRequested):
            what = "this command" if event.kind == "command" else "this edit"
            self._line(self._c("bold yellow", f"? {inert(event.name or 'call')} ") + self._id(event.call_id)
                       + self._c("bold yellow", f" needs your approval to run {what}"))
        elif isinstance(event, ApprovalResolved):
            who = " (as recorded)" if event.by == "recording" else ""
            if event.approved:
                self._line(self._c("green", f"  approved{who}"))
            else:
                why = f": {inert(event.reason)}" if event.reason else ""
                self._line(self._c("red", f"  declined{who}{why}"))
        elif isinstance(event, ToolOutputDelta):
            self._output(event)
        elif isinstance(event, ToolResultEvent):
            self._result(event)
        elif isinstance(event, FileEditEvent):
            self._line(self._c("bold", f"✎ {inert(event.path)}" + (" (new file)" if event.created else "")))
            for line in _lines(event.diff):
                style = "green" if line.startswith("+") else "red" if line.startswith("-") else "dim"
                if line.startswith(("+++", "---")):
                    style = "bold"
                self._line("  " + self._c(style, inert(line)))
        elif isinstance(event, TurnEnd):
            detail = f": {inert(event.detail)}" if event.detail and event.reason != "completed" else ""
            self._line(
                self._c("dim", f"— turn ended: {event.reason}{detail} "
                        f"({event.steps} model call{'' if event.steps == 1 else 's'}, ~{event.output_tokens} output tokens)")
            )
        elif isinstance(event, ErrorEvent):
            self._line(self._c("red", f"error ({inert(event.source)}): {inert(event.message)}"))


    # -- tool calls ----------------------------------------------------------

    def _name(self, call_id: str) -> str:
        return self._names.get(call_id, "call")

    def _id(self, call_id: str) -> str:
        return self._c("dim", inert(call_id))

    def _started(self, event: ToolCallStarted) -> None:
        if not event.valid:
            self._line(self._c("yellow", f"▶ {inert(event.name or '(unreadable call)')} — rejected"))
            return
        args = dict(event.args)
        command = args.pop("command", None) if event.name == "run_command" else None
        rest = _summarise_args(args)
        self._line(self._c("cyan", f"▶ {inert(str(event.name))}") + (" " + inert(rest) if rest else "")
                   + " " + self._c("dim", "· " + inert(event.call_id)))
        if isinstance(command, str):
            lines = _lines(command) or [""]
            for i, line in enumerate(lines[:COMMAND_LINES]):
                self._line(("  $ " if i == 0 else "  > ") + inert(line))
            if len(lines) > COMMAND_LINES:
                self._line(self._c("dim", f"  … {len(lines) - COMMAND_LINES} more lines of this command "
                                          "(--json shows all of it)"))

    def _output(self, event: ToolOutputDelta) -> None:
        live = self._live.get(event.call_id)
        if live is None:
            live = self._live[event.call_id] = _Live(self._name(event.call_id))
        if live.stopped:
            return
        text = live.partial + event.text
        *complete, live.partial = text.split("\n")
        for line in complete:
            self._live_line(event.call_id, live, line.removesuffix("\r"))
            if live.stopped:
                return
        if event.cut and not live.stopped:
            self._flush_live(event.call_id, live)
            live.stopped = True
            self._line(self._c("dim", "  │ … the live output stops here (the server's limit); the result shows the end"))

    def _live_line(self, call_id: str, live: _Live, line: str) -> None:
        if self._last_live != call_id and len(self._live) > 1:
            self._line(self._c("dim", f"  ┄ {inert(live.name)} {inert(call_id)}"))
        self._last_live = call_id
        if live.shown >= self.max_live_lines:
            live.stopped = True
            self._line(self._c("dim", f"  │ … more output (shown: the first {self.max_live_lines} lines; "
                                      "the result shows the end)"))
            return
        live.shown += 1
        self._line(self._c("dim", "  │ " + inert(line[:200])))

    def _flush_live(self, call_id: str, live: _Live) -> None:
        if live.partial and not live.stopped:
            line, live.partial = live.partial, ""
            self._live_line(call_id, live, line.removesuffix("\r"))

    def _result(self, event: ToolResultEvent) -> None:
        live = self._live.pop(event.call_id, None)
        if live is not None:
            self._flush_live(event.call_id, live)
        if self._last_live == event.call_id:
            self._last_live = None
        mark = self._c("green", "✓") if event.ok else self._c("red", "✗")
        name = event.name or self._name(event.call_id)
        self._line(f"{mark} {inert(name)} {self._id(event.call_id)} "
                   f"{self._c('dim', f'· {_duration(event.duration_ms)}')}")
        self._names.pop(event.call_id, None)
        if event.ok and event.name in _EDITING_TOOLS:
            return  # the file_edit event that follows shows the diff
        lines = _lines(event.output)
        if live is not None and (live.shown or live.partial):
            # Shown as it ran: the first line only (how it ended), and the end if the live view stopped early.
            for line in lines[:1]:
                self._line(self._c("dim", "  │ " + inert(line[:200])))
            if live.stopped and len(lines) > 1:
                tail = lines[1:][-self.max_lines:]
                self._line(self._c("dim", f"  │ … its last {len(tail)} lines:"))
                for line in tail:
                    self._line(self._c("dim", "  │ " + inert(line[:200])))
            return
        shown = lines[: self.max_lines]
        for line in shown:
            self._line(self._c("dim", "  │ " + inert(line[:200])))
        if len(lines) > len(shown):
            self._line(self._c("dim", f"  │ … {len(lines) - len(shown)} more lines"))


def _duration(ms: float) -> str:
    return f"{ms:.1f} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


def _lines(text: str) -> list[str]:
    # Split on "\n" only (not str.splitlines, which also splits on "\r" and
    # other controls): a bare "\r" stays in its line, where inert() shows it.
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    return lines[:-1] if lines and lines[-1] == "" else lines


def _summarise_args(args: dict[str, Any]) -> str:
    """One line: short values in full (a path, a pattern: up to 200 characters);
    multi-line or longer ones (file contents, search blocks) by their size."""
    parts = []
    for k, v in args.items():
        if isinstance(v, str) and ("\n" in v or len(v) > 200):
            n = v.count("\n") + 1
            parts.append(f"{k}=({n} line{'s' if n != 1 else ''}, {len(v)} chars)")
        else:
            parts.append(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}")
    return " ".join(parts)
