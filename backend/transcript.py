"""Human-readable live transcript of the event stream (``flywheel run``).

Colour is used only on a terminal and never when ``NO_COLOR`` is set.
Long tool outputs are shortened to their first lines; ``--json`` gives the
full events.

Every string that comes from an event (model text, tool names and
arguments, command output, file names, diffs, error messages) is untrusted
and passes through :func:`agent.text_safety.inert` before it is written, so
escape sequences in it are shown (``^[]0;title^G``), never acted on; the
colour codes are added afterwards. Not guaranteed: a line is cut at 200
characters of the *original* text, so an escaped line may be longer.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from agent.events import (
    AssistantDelta,
    ErrorEvent,
    Event,
    FileEditEvent,
    ToolCallStarted,
    ToolResultEvent,
    TurnEnd,
    UserMessage,
)
from agent.text_safety import inert

_EDITING_TOOLS = {"edit_file", "write_file"}
_CODES = {"dim": "2", "bold": "1", "red": "31", "green": "32", "yellow": "33", "blue": "34", "cyan": "36"}


class Transcript:
    def __init__(self, out: TextIO = sys.stdout, *, color: bool | None = None, max_lines: int = 12):
        self.out = out
        if color is None:
            color = out.isatty() and "NO_COLOR" not in os.environ
        self.color = color
        self.max_lines = max_lines
        self._mid_line = False
        self._after_tool = False  # swallow the newlines the model writes between calls

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
            if event.valid:
                self._line(self._c("cyan", f"▶ {inert(str(event.name))}") + " " + inert(_summarise_args(event.args)))
            else:
                self._line(self._c("yellow", f"▶ {inert(event.name or '(unreadable call)')} — rejected"))
        elif isinstance(event, ToolResultEvent):
            mark = self._c("green", "✓") if event.ok else self._c("red", "✗")
            self._line(f"{mark} {inert(event.name or 'call')} {self._c('dim', f'{event.duration_ms:.1f} ms')}")
            if event.ok and event.name in _EDITING_TOOLS:
                return  # the file_edit event that follows shows the diff
            lines = _lines(event.output)
            shown = lines[: self.max_lines]
            for line in shown:
                self._line(self._c("dim", "  │ " + inert(line[:200])))
            if len(lines) > len(shown):
                self._line(self._c("dim", f"  │ … {len(lines) - len(shown)} more lines"))
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


def _lines(text: str) -> list[str]:
    # Split on "\n" only (not str.splitlines, which also splits on "\r" and
    # other controls): a bare "\r" stays in its line, where inert() shows it.
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    return lines[:-1] if lines and lines[-1] == "" else lines


def _summarise_args(args: dict[str, Any]) -> str:
    parts = []
    for k, v in args.items():
        if isinstance(v, str) and ("\n" in v or len(v) > 60):
            n = v.count("\n") + 1
            parts.append(f"{k}=({n} line{'s' if n != 1 else ''}, {len(v)} chars)")
        else:
            parts.append(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}")
    return " ".join(parts)
