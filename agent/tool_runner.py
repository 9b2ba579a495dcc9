"""Single tool calls outside a model turn, through the session's own validator and executor.

``flywheel mcp`` serves the runtime's tools to other agents: each request is
one call with JSON arguments. :class:`ToolRunner` runs it the way a session
runs a model's call: the tool set comes from the same parts
(:func:`agent.runtime.session_tools`), the arguments are written as the raw
parameter texts a model would write and checked by
:func:`agent.calls.validate_call`, and the call runs in an
:class:`agent.executor.Executor` with the same :class:`tools.base.ToolContext`
— so the result (its cap, its scrubbed host paths, its error wording) is byte
for byte what the session's call gives.

Calls may arrive concurrently (an MCP client may send several at once). A
call waits for earlier calls it conflicts with (:meth:`Resources.conflicts_with`,
as within a step), so an edit and a later read of its file keep their order.

Approvals are the driver's: :meth:`ToolRunner.check` and :meth:`ToolRunner.resources`
tell it what a call is before it runs (``backend.mcp_approval`` asks the MCP
client's user per the session approval modes of :mod:`agent.approval`).

Not guaranteed: the order of calls that arrive at the same moment is the order they are
submitted, which the transport decides.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Mapping
from typing import Any

from agent.calls import CallRejected, ToolCall, validate_call
from agent.executor import Executor
from agent.parser import ParsedCall
from agent.runtime import SessionParts, session_tools
from agent.schema import TRUE_WORDS
from tools.base import Resources, Tool, ToolContext, ToolError, ToolResult, ToolSpec

__all__ = ["ToolRunner", "raw_params"]


def raw_params(arguments: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """JSON arguments as the parameter texts a model writes: strings as they are,
    booleans as ``true``/``false``, numbers in decimal, anything else as JSON; a
    ``null`` leaves the parameter out (as an omitted optional parameter)."""
    out: list[tuple[str, str]] = []
    for key, value in arguments.items():
        if value is None:
            continue
        if isinstance(value, str):
            text = value
        elif isinstance(value, bool):
            text = TRUE_WORDS[0] if value else "false"
        elif isinstance(value, int | float):
            text = json.dumps(value)
        else:
            text = json.dumps(value, ensure_ascii=False)
        out.append((str(key), text))
    return tuple(out)


class ToolRunner:
    """Runs calls by name on ``parts`` (the tool set a session over them would have)."""

    def __init__(self, parts: SessionParts) -> None:
        self.tools: dict[str, Tool] = {t.spec.name: t for t in session_tools(parts)}
        self.specs: list[ToolSpec] = [t.spec for t in self.tools.values()]
        self._by_name = {s.name: s for s in self.specs}
        self.ctx = ToolContext(workspace=parts.workspace, sandbox=parts.sandbox, search_index=parts.search_index)
        self._running: list[tuple[Resources, asyncio.Task[Any]]] = []
        self._ids = itertools.count(1)

    async def call(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """The result of calling ``name`` with JSON ``arguments``; a bad call is an error
        result worded as the model would read it. Cancelling the caller cancels the tool."""
        n = next(self._ids)
        checked = self.check(name, arguments, f"mcp{n}")
        if isinstance(checked, CallRejected):
            return ToolResult.error(checked.message)
        resources = self.resources(checked)
        earlier = [t for r, t in self._running if r.conflicts_with(resources)]
        task = asyncio.create_task(self._run(checked, earlier), name=f"tool-runner:{name}:{n}")
        entry = (resources, task)
        self._running.append(entry)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.wait([task])
            raise
        finally:
            self._running.remove(entry)

    def check(self, name: str, arguments: Mapping[str, Any], call_id: str = "mcp") -> ToolCall | CallRejected:
        """``name`` with JSON ``arguments`` as the session's validator takes it: the call, or
        its rejection (whose message is the error the call would return). Runs nothing."""
        return validate_call(ParsedCall(0, name, raw_params(arguments)), self._by_name, call_id)

    def resources(self, call: ToolCall) -> Resources:
        """What ``call`` touches (:meth:`tools.base.Tool.resources`; nothing for an argument
        the tool will refuse itself)."""
        try:
            return self.tools[call.name].resources(call.args)
        except ToolError:
            return Resources()

    async def _run(self, call: ToolCall, earlier: list[asyncio.Task[Any]]) -> ToolResult:
        if earlier:
            await asyncio.wait(earlier)
        executor = Executor(self.tools, self.ctx)
        executor.submit(call)
        try:
            (outcome,) = await executor.results()
        except asyncio.CancelledError:
            await executor.cancel()
            raise
        return outcome.result
