"""Live output of a running tool call: how a tool reports text before it returns.

The executor (``agent.executor``) runs each call in its own asyncio task and,
for the length of the call, installs a listener in that task's context
(:func:`listening`); a tool that produces output over time (``run_command``)
passes each piece to :func:`report_output`, or asks for the listener with
:func:`current_listener` to hand it to lower layers (the sandbox). Outside
a call, or when nobody listens, reporting costs nothing and goes nowhere.

A context variable rather than a :class:`tools.base.ToolContext` field because
the context is shared by every call of a session while a listener belongs to
one call; asyncio copies the context into each task, so a listener set in one
call's task is never seen by another.

Not guaranteed: delivery. A listener may drop, coalesce or cap what it gets
(the session does: ``agent.session``); the tool's ``ToolResult`` stays the
record of what the call produced. A listener is called on the event loop's
thread and must not block.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from contextvars import ContextVar

__all__ = ["OutputListener", "current_listener", "listening", "report_output"]

log = logging.getLogger(__name__)

OutputListener = Callable[[str], None]
"""Receives one piece of a running call's output (already decoded text)."""

_listener: ContextVar[OutputListener | None] = ContextVar("flywheel_tool_output", default=None)


def current_listener() -> OutputListener | None:
    """The running call's listener, or None outside a call / when nobody listens."""
    return _listener.get()


def report_output(text: str) -> None:
    """Pass ``text`` to the running call's listener, if any. Never raises: a
    failing listener is logged, the tool goes on."""
    fn = _listener.get()
    if fn is None or not text:
        return
    try:
        fn(text)
    except Exception:  # a display problem must not fail the call
        log.exception("output listener failed")


@contextlib.contextmanager
def listening(fn: OutputListener | None) -> Iterator[None]:
    """Install ``fn`` as the listener for the code inside the ``with`` (in this task)."""
    token = _listener.set(fn)
    try:
        yield
    finally:
        _listener.reset(token)
