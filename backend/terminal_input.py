"""What the terminal commands read from the user: stdin as lines, and approval prompts.

``flywheel run`` (in-process) and ``flywheel chat`` (over the WebSocket) ask the
same question, in the same words, when a session's approval mode
(:mod:`agent.approval`) holds a call:

* :func:`question` shows the whole call: a command line in full (every line),
  an edit as a diff of what it replaces, a new file's content (up to
  :data:`MAX_SHOWN_LINES` lines, then how many more there are);
* :func:`parse_answer` reads ``y``/``yes`` as allow and ``n``/``no`` as deny;
  text after the ``n`` is the reason the model reads; anything else is asked
  again; end of input denies;
* :class:`TerminalApprover` is the :class:`agent.approval.Approver` that asks
  on a terminal, one question at a time; :data:`YES` approves everything
  (``--yes``);
* :func:`check_can_ask` is the one-line refusal to start an asking session
  with nobody to ask (stdin is not a terminal and there is no ``--yes``).

:class:`StdinLines` reads stdin without blocking the event loop, so a
question is withdrawn at once when its turn ends (an interrupt, a time
limit): nothing waits on a thread.

Not guaranteed: the question and the live transcript share the terminal, so
output of other calls of the same step may print between the question and
the answer; every string from the model passes through
:func:`agent.text_safety.inert`, so escape sequences show as text.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TextIO

from agent.approval import ApprovalDecision, ApprovalRequest
from agent.text_safety import inert

__all__ = [
    "MAX_SHOWN_LINES",
    "YES",
    "AutoApprover",
    "StdinLines",
    "TerminalApprover",
    "check_can_ask",
    "parse_answer",
    "question",
]

MAX_SHOWN_LINES = 400
"""Lines of an edit or a new file a question shows; a command is always shown whole."""

ANSWER_PROMPT = "allow? y = yes, n = no (words after n are told to the model, e.g. `n use make test`): "


class StdinLines:
    """Lines of a file descriptor as an asyncio queue; ``None`` marks EOF.

    Pipes and terminals are watched by the event loop (no thread blocks on
    them); regular files and ``/dev/null`` cannot be, and never block, so
    they are read at once.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._loop, self._buf, self._watching = loop, b"", False
        try:
            self._fd = sys.stdin.fileno()
        except (AttributeError, OSError, ValueError):  # no stdin at all
            self._fd = os.open(os.devnull, os.O_RDONLY)

    def start(self) -> None:
        try:
            self._loop.add_reader(self._fd, self._readable)
            self._watching = True
        except (OSError, ValueError):
            while chunk := os.read(self._fd, 1 << 16):
                self._feed(chunk)
            self._feed(b"")

    def stop(self) -> None:
        if self._watching:
            self._loop.remove_reader(self._fd)
            self._watching = False

    def _readable(self) -> None:
        try:
            chunk = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        self._feed(chunk)

    def _feed(self, chunk: bytes) -> None:
        *lines, self._buf = (self._buf + chunk).split(b"\n")
        if not chunk:
            self.stop()
            lines, self._buf = [self._buf] if self._buf else [], b""
        for line in lines:
            self.queue.put_nowait(line.decode("utf-8", "replace").rstrip("\r"))
        if not chunk:
            self.queue.put_nowait(None)


def _capped(lines: list[str], prefix: str) -> list[str]:
    shown = [prefix + inert(line) for line in lines[:MAX_SHOWN_LINES]]
    if len(lines) > MAX_SHOWN_LINES:
        shown.append(f"  … {len(lines) - MAX_SHOWN_LINES} more lines not shown (--json prints the whole call)")
    return shown


def question(request: ApprovalRequest) -> str:
    """The question for ``request``, as lines to print (without the answer prompt):
    what the call would do, whole, with its tool and call id."""
    args = dict(request.args)
    where = f"({inert(request.name)} {inert(request.call_id)})"
    path = args.get("path")
    if request.kind == "command" and isinstance(args.get("command"), str):
        lines = args.pop("command").split("\n")
        head = f"the agent wants to run this command {where}:"
        body = [("  $ " if i == 0 else "  > ") + inert(line) for i, line in enumerate(lines)]
        if args:
            body.append("  with " + ", ".join(f"{inert(str(k))}={inert(json.dumps(v))}" for k, v in args.items()))
    elif request.name == "edit_file" and isinstance(path, str):
        search, replace = str(args.get("search") or ""), str(args.get("replace") or "")
        head = f"the agent wants to edit {inert(path)} {where}:"
        diff = difflib.unified_diff(search.split("\n"), replace.split("\n"), f"a/{path}", f"b/{path}", lineterm="",
                                    n=max(len(search), 1))
        body = _capped(list(diff), "  ")
    elif request.name == "write_file" and isinstance(path, str):
        content = str(args.get("content") or "")
        lines = content.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        head = (f"the agent wants to write {inert(path)} ({len(lines)} line{'' if len(lines) == 1 else 's'}, "
                f"{len(content.encode())} bytes; it replaces the file if it exists) {where}:")
        body = _capped(lines, "  + ")
    else:
        head = f"the agent wants to run {inert(request.name)} {where} with:"
        body = _capped(json.dumps(args, indent=2, ensure_ascii=False).split("\n"), "  ")
    return "\n".join([head, *body])


def parse_answer(line: str | None) -> ApprovalDecision | None:
    """An answer line as a decision: None means "not an answer, ask again";
    end of input (``line`` None) denies."""
    if line is None:
        return ApprovalDecision(False, "")
    word, _, rest = line.strip().partition(" ")
    word = word.lower()
    if word in ("y", "yes", "allow"):
        return ApprovalDecision(True, "")
    if word in ("n", "no", "deny"):
        return ApprovalDecision(False, rest.strip())
    return None


class TerminalApprover:
    """An :class:`agent.approval.Approver` that asks on a terminal: shows :func:`question`
    on ``out`` and reads the answer with ``read_line`` (an awaitable line, None at end of
    input). Questions are asked one at a time, in the order the calls asked."""

    def __init__(self, read_line: Callable[[], Awaitable[str | None]], out: TextIO, *, color: bool | None = None):
        self.read_line = read_line
        self.out = out
        self.color = out.isatty() and "NO_COLOR" not in os.environ if color is None else color
        self._lock = asyncio.Lock()

    def _write(self, text: str, style: str = "") -> None:
        self.out.write(f"\x1b[{style}m{text}\x1b[0m" if self.color and style else text)
        self.out.flush()

    async def decide(self, request: ApprovalRequest) -> ApprovalDecision:
        async with self._lock:
            self._write(question(request) + "\n", "1;33")
            while True:
                self._write(ANSWER_PROMPT, "1")
                line = await self.read_line()
                decision = parse_answer(line)
                if line is None:
                    self._write("\nno answer (end of input): declined\n", "31")
                if decision is not None:
                    return decision
                self._write(f"please answer y or n (not {inert(line or '')!r})\n", "33")


class AutoApprover:
    """``--yes``: approves every request at once (the answer is recorded as the user's,
    with the reason ``--yes``)."""

    async def decide(self, request: ApprovalRequest) -> ApprovalDecision:
        return ApprovalDecision(True, "--yes")


YES = AutoApprover()


def check_can_ask(mode: str, *, interactive: bool, yes: bool, command: str) -> str | None:
    """Why ``command`` cannot run a session in approval ``mode`` (one line), or None: an
    asking mode needs a terminal to ask on, or ``--yes``."""
    if mode == "auto" or yes or interactive:
        return None
    what = "commands" if mode == "ask-commands" else "edits and commands"
    return (f"approval mode {mode} asks before {what}, but stdin is not a terminal, so nobody can answer: "
            f"run {command} on a terminal, pass --yes to approve every call, or use --approval-mode auto")
