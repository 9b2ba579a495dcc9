"""Approval modes: which calls a session asks the user about before running them.

Three modes, as users know them from Cline and Claude Code:

* ``auto`` — nothing is asked (what RL rollouts, replay and scripts use);
* ``ask-commands`` — ask before every ``run_command``;
* ``ask-edits`` — ask before every call that may change the workspace: the
  file tools that write (``edit_file``, ``write_file``) *and* commands, since a
  command can rewrite any file (``sed -i``, ``rm``); a mode that promised "no
  edit without asking" could not keep it otherwise.

What counts as a command or an edit comes from the tool's own
:meth:`tools.base.Tool.resources` (a separate process that may write: a
command; a direct write: an edit), not from a list of names, so a new tool is
covered the day it is added.

The session asks an :class:`Approver` (``agent.session``): the terminal
client implements one by prompting (:class:`PromptApprover` wraps a blocking
question), the server uses :class:`PendingApprovals`, answered from the
WebSocket. Every question and answer is an event (``approval_requested``,
``approval_resolved``); a refused call's result tells the model, in words,
that the user declined it (:func:`declined_result`), and the tool never runs.

Replay re-applies recorded answers (:func:`recorded_decisions`), so a session
with a refusal re-executes with the same results.

Not guaranteed: a question stays open until it is answered, the turn is
interrupted or the turn's wall-clock limit passes (there is no separate
approval timeout); an approver that raises counts as a refusal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args, runtime_checkable

from agent.events import ApprovalResolved, AssistantMessage, Event, ToolCallStarted
from tools.base import Resources, ToolResult

__all__ = [
    "APPROVAL_MODES",
    "ApprovalDecision",
    "ApprovalError",
    "ApprovalMode",
    "ApprovalRequest",
    "Approver",
    "PendingApprovals",
    "PromptApprover",
    "approval_kind",
    "declined_result",
    "parse_approval_mode",
    "recorded_decisions",
]

ApprovalMode = Literal["auto", "ask-commands", "ask-edits"]
APPROVAL_MODES: tuple[ApprovalMode, ...] = get_args(ApprovalMode)
ApprovalKind = Literal["command", "edit"]


class ApprovalError(ValueError):
    """A bad approval mode or answer; the message is one line for the user."""


def parse_approval_mode(value: object) -> ApprovalMode:
    """``value`` as a mode, or :class:`ApprovalError` naming the valid ones."""
    if isinstance(value, str) and value in APPROVAL_MODES:
        return value  # type: ignore[return-value]
    raise ApprovalError(f"unknown approval mode {value!r}: use one of {', '.join(APPROVAL_MODES)}")


def approval_kind(mode: ApprovalMode, resources: Resources) -> ApprovalKind | None:
    """What ``mode`` asks about a call with ``resources``: ``command``, ``edit`` or None (run it)."""
    if mode == "auto":
        return None
    if resources.process_writes:
        return "command"
    if resources.writes and mode == "ask-edits":
        return "edit"
    return None


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """One question: may the call ``call_id`` (``name`` with ``args``) run?"""

    call_id: str
    name: str
    args: Mapping[str, Any]
    kind: ApprovalKind
    step: int = 0
    index: int = 0

    def describe(self) -> str:
        """What is asked, for a prompt: the full command line, or the tool and its path."""
        if self.kind == "command" and isinstance(self.args.get("command"), str):
            return str(self.args["command"])
        path = self.args.get("path")
        return f"{self.name} {path}" if isinstance(path, str) else self.name


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    """An answer. ``reason`` is the user's own words (shown to the model on a refusal)."""

    approved: bool
    reason: str = ""


@runtime_checkable
class Approver(Protocol):
    """Answers approval requests. ``decide`` may take as long as the user does; it
    is cancelled when the turn ends. Several requests may be open at once (calls
    of one step run concurrently): an approver that can ask only one question at
    a time must queue them itself (:class:`PromptApprover` does)."""

    async def decide(self, request: ApprovalRequest) -> ApprovalDecision: ...


def declined_result(request: ApprovalRequest, decision: ApprovalDecision) -> ToolResult:
    """The result the model reads for a refused call (status error; the call did not run)."""
    what = "command" if request.kind == "command" else f"{request.name} call"
    said = f" The user said: {decision.reason.strip()}" if decision.reason.strip() else ""
    return ToolResult.error(
        f"the user declined this {what}; it did not run.{said} "
        "Do not repeat it unchanged: ask the user, or find another way.",
        declined=True,
    )


class PendingApprovals:
    """An :class:`Approver` whose requests wait until someone calls :meth:`answer`
    (the server: a WebSocket message).

    Not thread-safe: use from the event loop that runs the session.
    """

    def __init__(self) -> None:
        self._open: dict[str, tuple[ApprovalRequest, asyncio.Future[ApprovalDecision]]] = {}

    async def decide(self, request: ApprovalRequest) -> ApprovalDecision:
        future: asyncio.Future[ApprovalDecision] = asyncio.get_running_loop().create_future()
        self._open[request.call_id] = (request, future)
        try:
            return await future
        finally:
            if self._open.get(request.call_id, (None, None))[1] is future:
                del self._open[request.call_id]

    def answer(self, call_id: str, decision: ApprovalDecision) -> None:
        """Answer the open request for ``call_id``; :class:`ApprovalError` if there is none
        (never asked, already answered, or its turn ended)."""
        entry = self._open.get(call_id)
        if entry is None or entry[1].done():
            raise ApprovalError(f"no approval request is open for call {call_id!r}")
        entry[1].set_result(decision)

    def pending(self) -> list[ApprovalRequest]:
        """The open requests, oldest first."""
        return [r for r, f in self._open.values() if not f.done()]


@dataclass(slots=True)
class PromptApprover:
    """An :class:`Approver` over a blocking question (a terminal prompt), asked in
    a worker thread, one at a time, in the order the calls asked.

    Not guaranteed: a question already on screen cannot be withdrawn when the
    turn is interrupted (the thread blocks until ``ask`` returns; its answer is
    then dropped). A client with an asynchronous input reader should implement
    :class:`Approver` directly instead.
    """

    ask: Callable[[ApprovalRequest], ApprovalDecision]
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def decide(self, request: ApprovalRequest) -> ApprovalDecision:
        async with self._lock:
            return await asyncio.to_thread(self.ask, request)


def recorded_decisions(
    events: Iterable[Event], *, model_calls: int | None = None, unasked: bool = False,
) -> dict[str, ApprovalDecision | None]:
    """The answers a recording holds, by call id, for replay and branches to re-apply.

    ``model_calls``: only answers to calls of the first that many model calls
    (counted across turns, as a branch's ``from_step`` counts them), so a branch
    does not re-apply an answer to a later call that reuses an id.
    ``unasked``: also every other call of those steps, as None: it ran without
    being asked, and re-executing it must not ask either (a branch in an asking
    mode re-executes a recording made in ``auto``; nobody is there to answer).
    """
    out: dict[str, ApprovalDecision | None] = {}
    step_of: dict[str, tuple[int, int]] = {}
    steps: list[tuple[int, int]] = []
    for e in events:
        if isinstance(e, AssistantMessage):
            steps.append((e.turn, e.step))
        elif isinstance(e, ToolCallStarted):
            step_of[e.call_id] = (e.turn, e.step)
        elif isinstance(e, ApprovalResolved):
            out[e.call_id] = ApprovalDecision(e.approved, e.reason)
    if unasked:
        for cid in step_of:
            out.setdefault(cid, None)
    if model_calls is None:
        return out
    kept = set(steps[:max(0, model_calls)])
    return {cid: d for cid, d in out.items() if step_of.get(cid) in kept}
