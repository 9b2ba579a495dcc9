"""Asking the editor before a call runs: ``session/request_permission``.

Flywheel sessions started over ACP run in the runtime's ``ask-edits``
approval mode (:mod:`agent.approval`): every call that may change the
workspace -- a file edit or a command -- waits for an answer, which this
module gives. What it asks the editor, and what it answers itself, is the
ACP session's mode (:data:`backend.acp.defaults.MODES`, switched with ``session/set_mode``):

* ``ask`` -- ask before every edit and every command;
* ``agent`` (the default) -- edits go ahead, commands are asked;
* ``auto`` -- nothing is asked.

The files a command changed are written back to the editor
(:mod:`backend.acp.command_sync`) under the same rule as edits: asked in ``ask``
only (:meth:`Permissions.decide_write_back`).

The editor is offered *allow once*, *always allow* (this exact command, or
edits of this file, for the rest of the session) and *reject*. Every answer,
the ones given here included, is recorded in the session log as an
``approval_resolved`` event (its ``reason`` says who decided), so replay
re-applies it.

A request the editor does not answer within the timeout is refused with a
reason that says so (the model reads it); so is a request the editor
cancels, or a failed request. The late answer, if one comes, is ignored.

Not guaranteed: an *always allow* lasts as long as this ``flywheel acp``
process holds the session (it is not stored); a command is matched by its
exact text.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from acp.schema import PermissionOption, SessionMode, SessionModeState, ToolCallUpdate

from agent.approval import ApprovalDecision
from agent.events import ApprovalRequested
from backend.acp.defaults import DEFAULT_MODE, DEFAULT_PERMISSION_TIMEOUT_S, MODES

log = logging.getLogger(__name__)


OPTIONS = [
    PermissionOption(option_id="allow_once", name="Allow once", kind="allow_once"),
    PermissionOption(option_id="allow_always", name="Always allow", kind="allow_always"),
    PermissionOption(option_id="reject_once", name="Reject", kind="reject_once"),
]

Ask = Callable[[ToolCallUpdate, list[PermissionOption]], Awaitable[Any]]


def mode_state(current: str) -> SessionModeState:
    """The modes as ``session/new`` and ``session/load`` announce them."""
    return SessionModeState(
        current_mode_id=current,
        available_modes=[SessionMode(id=k, name=n, description=d) for k, (n, d) in MODES.items()],
    )


WRITE_BACK_KEY = ("edit", "(write-back of a command's files)", "*")


def _key(event: ApprovalRequested) -> tuple[str, str, str]:
    """What an *always allow* covers: this exact command, or edits of this path."""
    what = event.args.get("command") if event.kind == "command" else event.args.get("path")
    return (event.kind, event.name, str(what))


@dataclass(slots=True)
class Permissions:
    """One ACP session's answers. ``ask`` sends ``session/request_permission``."""

    ask: Ask
    timeout_s: float = DEFAULT_PERMISSION_TIMEOUT_S
    mode: str = DEFAULT_MODE
    always: set[tuple[str, str, str]] = field(default_factory=set)

    def needs_editor(self, event: ApprovalRequested) -> bool:
        """Whether the mode sends this request to the editor (else it is allowed here)."""
        if self.mode == "auto" or _key(event) in self.always:
            return False
        return self.mode == "ask" or event.kind == "command"

    async def decide(self, event: ApprovalRequested, tool_call: ToolCallUpdate) -> ApprovalDecision:
        """The answer for ``event``: the mode's, or the editor's within the timeout."""
        if not self.needs_editor(event):
            why = "always allowed in this session" if _key(event) in self.always else f"the {self.mode} mode"
            return ApprovalDecision(True, f"allowed by {why}")
        return await self._ask(tool_call, _key(event))

    def write_back_needs_editor(self) -> bool:
        """Whether writing back a command's files asks the editor (else it is allowed here)."""
        return self.mode == "ask" and WRITE_BACK_KEY not in self.always

    async def decide_write_back(self, tool_call: ToolCallUpdate) -> ApprovalDecision:
        """Whether to write the files a command changed to the editor: asked as an edit is
        (the ``ask`` mode only); *Always allow* covers every later command's files."""
        if not self.write_back_needs_editor():
            why = "always allowed in this session" if WRITE_BACK_KEY in self.always else f"the {self.mode} mode"
            return ApprovalDecision(True, f"allowed by {why}")
        return await self._ask(tool_call, WRITE_BACK_KEY)

    async def _ask(self, tool_call: ToolCallUpdate, key: tuple[str, str, str]) -> ApprovalDecision:
        try:
            response = await asyncio.wait_for(self.ask(tool_call, OPTIONS), self.timeout_s)
        except TimeoutError:
            return ApprovalDecision(False, f"(no answer from the editor within {self.timeout_s:g} s; "
                                           "refused)")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the request failed: refuse, never run unasked
            log.warning("session/request_permission failed: %s", exc)
            return ApprovalDecision(False, f"(asking the editor failed: {exc}; refused)")
        outcome = getattr(response, "outcome", None)
        option = getattr(outcome, "option_id", None)
        if option == "allow_always":
            self.always.add(key)
            return ApprovalDecision(True, "always allowed by the user")
        if option == "allow_once":
            return ApprovalDecision(True, "")
        if option is None:
            return ApprovalDecision(False, "(the editor cancelled the question; refused)")
        return ApprovalDecision(False, "")
